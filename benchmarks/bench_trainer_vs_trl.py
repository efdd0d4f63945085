"""BENCHMARK (not part of the test suite): pivotrl's trainer step vs TRL's GRPOTrainer, on CPU.

    python benchmarks/bench_trainer_vs_trl.py [--prompts 32] [--group-size 8] [--max-new-tokens 34]
        [--steps 5] [--warmup 1] [--threads 1] [--model auto|tiny|tiny-random|NAME]
        [--task countdown|NAME] [--chat]
        [--estimators grpo,erpo,ep_grpo,gtpo,high_entropy,entropy_shaping] [--no-trl | --trl-only]
    python benchmarks/bench_trainer_vs_trl.py --isolated 4 [--model ...]   # TRL and pivotrl in separate processes
    python benchmarks/bench_trainer_vs_trl.py --model smollm2-135m-add_sub --task add_sub --chat \
        --prompts 8 --group-size 8 --max-new-tokens 48     # a real model (134.5 M parameters)

Both trainers get the same model (read once or built and saved to a temporary folder, loaded by
each), the same training problems and prompt text, P prompts x G samples per step,
temperature-1 sampling of up to --max-new-tokens tokens, the task's verifier as the reward, one
forward + backward over all P*G responses, grad-norm clipping at 1.0 and one AdamW step (lr
--lr, 1e-4 unless given, betas (0.9, 0.99), no weight decay, constant schedule), float32 on the CPU with the same
torch thread count.

--model: auto (the shipped tiny-countdown checkpoint if present, else tiny-random), tiny,
tiny-search, tiny-free (the shipped checkpoints), tiny-random (the shipped architecture, seed 0,
saved to a temporary folder), or anything else pivotrl.modeling.policy.load_policy takes: a
packaged model (smollm2-135m), its warm start (smollm2-135m-add_sub), a .gguf file, a model
folder, a run folder (its newest checkpoint), a hub id; both systems load the folder pivotrl
resolves it to. --task: a registered task (default countdown, with 3 numbers; other tasks with
their default options). --chat: the prompts are rendered with the tokenizer's chat template
(task.format_prompt(problem, tokenizer, chat=True)): pivotrl with model.chat_template=true, TRL
given the rendered strings as a plain (not conversational) dataset, so that it tokenizes them
as they are and applies no template of its own. Without --chat both see the task's plain
template. Either way the run checks that both saw the same prompts: every prompt string
pivotrl rendered is one of TRL's dataset strings, and every prompt either system fed its model
has the same token ids as the other system's tokenization of the same string (pivotrl's
tokenize_prompts, TRL's _tokenize_prompts); a mismatch ends the run with exit code 1 after the
timings. It also prints each system's stop tokens (pivotrl: the tokenizer's eos; TRL: that and
the model's generation_config eos_token_id), which decide how long the responses are.

TRL: GRPOTrainer with num_iterations=1, gradient_accumulation_steps=1,
per_device_train_batch_size=P*G (so one optimizer step = P prompts x G completions, and no
separate old-log-prob forward), num_generations=G, max_completion_length=--max-new-tokens,
temperature 1, top_p 1, top_k 0, beta=0 (no reference model), loss_type='dapo' (token-mean over
the batch, like pivotrl's ppo loss), epsilon 0.2/0.28, scale_rewards='group', use_vllm=False, no
gradient checkpointing, no bf16, no eval, no saving, no logging, report_to=[]. pivotrl: the
same numbers as rollout.prompts_per_step=P, rollout.group_size=G,
rollout.max_new_tokens=--max-new-tokens, model.chat_template=--chat, train.lr etc., with
estimator grpo + policy loss ppo (the fair comparison); the other estimators are timed the same
way and reported against grpo. Each pivotrl estimator has its own trainer, so its own model,
gradients and AdamW state (and reference model for erpo, ep_grpo): with a real model time a few
(smollm2-135m: about 2.2 GB each after the first step).

Timing: TRL's step is the wall time from the `on_step_begin` to the `on_step_end` callback
(generation, reward, forward, backward, clipping, optimizer step, zero_grad; its dataloader
fetch before on_step_begin and its logging after on_step_end are left out, which favours TRL);
pivotrl's step is the wall time of `Trainer.train_step()` (everything, metrics included).
The runs are interleaved: round k runs one TRL step and one step of every pivotrl
estimator, with TRL first in even rounds and last in odd rounds; the first --warmup rounds
are dropped and medians are reported. The estimator share uses pivotrl's own
`time/estimator_s` / `time/step_s`. Wall and process-CPU time are both reported; on a machine
shared with other jobs CPU time is the steadier one, and one thread per system is the default
because two OpenMP threads on two busy cores stall at every barrier (steps 3-4x slower, noisier).
Sharing one process can slow one system through the other's allocations (TRL's step measured
10-20% slower next to pivotrl's than alone), so --isolated N runs each system in its own
process, N pairs in alternating order, and reports that ratio as well.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

TOKEN_LEVEL = ("grpo", "erpo", "ep_grpo", "gtpo", "high_entropy", "entropy_shaping")


class PhaseTimer:
    """Accumulates (wall, CPU) seconds per phase while a step runs, by wrapping bound methods."""

    def __init__(self) -> None:
        self.current: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])

    def wrap(self, obj: object, name: str, phase: str, only_if=None) -> None:
        original = getattr(obj, name)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            if only_if is not None and not only_if():
                return original(*args, **kwargs)
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                acc = self.current[phase]
                acc[0] += time.perf_counter() - wall
                acc[1] += time.process_time() - cpu

        setattr(obj, name, timed)

    def take(self) -> dict[str, list[float]]:
        out, self.current = dict(self.current), defaultdict(lambda: [0.0, 0.0])
        return out


class Stopwatch:
    """Wall and process-CPU seconds since start()."""

    def start(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def stop(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall, time.process_time() - self.cpu


class PromptLog:
    """The prompts each system feeds its model during the run, recorded by wrapping the methods that
    tokenize and sample (only references are kept inside a timed step), and compared afterwards."""

    def __init__(self) -> None:
        self.trl_texts: list[list[Any]] = []  # the prompts of each TRL _tokenize_prompts call
        self.trl_ids: list[list[list[int]]] = []  # the prompt ids of each _generate_single_turn call
        self.trl_tokenize: Callable[[list[str]], list[list[int]]] | None = None
        self.pivot_calls: list[tuple[list[str], Any]] = []  # pivotrl engine.generate: prompts, Rollout
        self.pivot_tokenize: Callable[[list[str]], list[list[int]]] | None = None
        self.tokenizer: Any = None  # for showing ids as text

    def watch_trl(self, trainer: Any) -> None:
        tokenize, generate = trainer._tokenize_prompts, trainer._generate_single_turn

        def tokenize_prompts(prompts: list, *a: Any, **kw: Any) -> Any:
            self.trl_texts.append(list(prompts))
            return tokenize(prompts, *a, **kw)

        def generate_single_turn(prompt_ids: list[list[int]], *a: Any, **kw: Any) -> Any:
            self.trl_ids.append(prompt_ids)
            return generate(prompt_ids, *a, **kw)

        trainer._tokenize_prompts = tokenize_prompts
        trainer._generate_single_turn = generate_single_turn
        self.trl_tokenize = lambda texts: [list(ids) for ids in tokenize(texts)[0]]
        self.tokenizer = self.tokenizer or trainer.processing_class

    def watch_pivotrl(self, engine: Any) -> None:
        from pivotrl.rollout.base import tokenize_prompts

        generate = engine.generate

        def recorded(prompts: list[str], num_samples: int, **kw: Any) -> Any:
            rollout = generate(prompts, num_samples, **kw)
            self.pivot_calls.append((list(prompts), rollout))
            return rollout

        engine.generate = recorded
        if self.pivot_tokenize is None:  # the function pivotrl's engines encode prompts with
            self.pivot_tokenize = lambda texts: tokenize_prompts(engine.tokenizer, texts,
                                                                 engine.max_prompt_tokens)
            self.tokenizer = engine.tokenizer

    def fed(self) -> tuple[dict[str, list[int]], dict[str, list[int]], list[str]]:
        """({text: ids TRL fed}, {text: ids pivotrl fed}, problems found), each text's first use."""
        problems, trl, pivot = [], {}, {}
        for texts, ids in zip(self.trl_texts, self.trl_ids, strict=True):
            for text, row in zip(texts, ids, strict=True):
                if not isinstance(text, str):
                    problems.append(f"TRL got a conversational prompt ({type(text).__name__}): it "
                                    "applies the chat template itself")
                    continue
                trl.setdefault(text, [int(t) for t in row])
        for texts, rollout in self.pivot_calls:
            for i, text in enumerate(texts):
                row = i * rollout.group_size
                pivot.setdefault(text, rollout.prompt_ids[row][rollout.prompt_mask[row]].tolist())
        return trl, pivot, problems

    def check(self, dataset: set[str]) -> tuple[bool, list[str]]:
        """Whether both systems saw the same prompt strings and token ids; the lines to print."""
        trl, pivot, problems = self.fed()
        foreign = [t for t in pivot if t not in dataset]
        if foreign:
            problems.append(f"{len(foreign)} of pivotrl's {len(pivot)} prompts are not among TRL's "
                            f"dataset strings, e.g. {foreign[0]!r}")
        changed = [t for t in trl if t not in dataset]
        if changed:
            problems.append(f"{len(changed)} of TRL's prompts are not its dataset strings, "
                            f"e.g. {changed[0]!r}")
        compared: list[str] = []
        pairs: list[tuple[str, str, list[int], str, list[int]]] = []
        if trl and self.pivot_tokenize is not None:
            texts = list(trl)
            pairs += [(t, "TRL fed", trl[t], "pivotrl tokenizes", ids)
                      for t, ids in zip(texts, self.pivot_tokenize(texts), strict=True)]
            compared.append(f"TRL's {len(texts)} against pivotrl's tokenization")
        if pivot and self.trl_tokenize is not None:
            texts = list(pivot)
            pairs += [(t, "pivotrl fed", pivot[t], "TRL tokenizes", ids)
                      for t, ids in zip(texts, self.trl_tokenize(texts), strict=True)]
            compared.append(f"pivotrl's {len(texts)} against TRL's _tokenize_prompts")
        both = [t for t in trl if t in pivot]
        pairs += [(t, "TRL fed", trl[t], "pivotrl fed", pivot[t]) for t in both]
        if trl and pivot:
            compared.append(f"{len(both)} fed by both")
        for text, a_name, a, b_name, b in pairs:
            if a != b:
                at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                          min(len(a), len(b)))
                problems.append(f"token ids differ on {text!r}: {a_name} {len(a)} ids, {b_name} "
                                f"{len(b)}, first difference at {at}: {a[at:at + 4]} vs {b[at:at + 4]}")
                break
        if not compared:
            return not problems, problems + ["prompt token ids: not compared (one system only)"]
        if problems:
            return False, ["PROMPT MISMATCH: " + p for p in problems]
        text, ids = next(iter(trl.items())) if trl else next(iter(pivot.items()))
        shown = self.tokenizer.decode(ids[:12]) if self.tokenizer is not None else ""
        return True, [f"prompt token ids identical ({'; '.join(compared)}), the strings "
                      f"{'rendered alike' if pivot else 'unchanged'}; e.g. {len(ids)} ids "
                      f"{ids[:6]}... = {shown!r}..."]


def stop_tokens(trl_trainer: Any, pivot_tokenizer: Any) -> str:
    """Which token ids end a response in each system (they decide the response lengths)."""
    tok = pivot_tokenizer if pivot_tokenizer is not None else trl_trainer.processing_class
    def named(ids: list[int]) -> str:
        return ", ".join(f"{i} {tok.convert_ids_to_tokens(i)!r}" for i in ids)
    parts = []
    if trl_trainer is not None:
        parts.append(f"TRL [{named(list(trl_trainer.eos_token_ids))}]")
    if pivot_tokenizer is not None:
        parts.append(f"pivotrl [{named([pivot_tokenizer.eos_token_id])}]")
    same = (trl_trainer is None or pivot_tokenizer is None
            or set(trl_trainer.eos_token_ids) == {pivot_tokenizer.eos_token_id})
    return "stop tokens: " + ", ".join(parts) + ("" if same else "  [DIFFER: response lengths will]")


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def prepare_model(choice: str, folder: Path) -> tuple[str, str]:
    """The model both trainers load (a HF folder, or a hub id) and a description of it: --model."""
    from pivotrl.modeling.tiny import TINY_ARCH, TINY_MODELS, build_tiny_model, tiny_policy_path
    from pivotrl.modeling.tokenizer import build_char_tokenizer

    if choice == "auto":
        choice = "tiny" if (tiny_policy_path() / "config.json").is_file() else "tiny-random"
    if choice in TINY_MODELS:
        shipped = tiny_policy_path(choice)
        if not (shipped / "config.json").is_file():
            raise SystemExit(f"--model {choice}: no shipped checkpoint at {shipped}")
        return str(shipped), f"shipped checkpoint {shipped}"
    if choice == "tiny-random":
        tokenizer = build_char_tokenizer()
        model = build_tiny_model(tokenizer, seed=0)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        arch = ", ".join(f"{k}={v}" for k, v in TINY_ARCH.items())
        return str(folder), f"tiny-random (seed 0; {arch}) saved to {folder}"
    # what load_policy does with any other name: a warm start's or a GGUF's folder, a run's newest
    # checkpoint, a model folder or a hub id
    from pivotrl.modeling.gguf import resolve_gguf
    from pivotrl.modeling.policy import model_in_folder, model_source
    from pivotrl.modeling.warm_names import resolve_warm_start

    try:
        resolved = model_in_folder(resolve_gguf(resolve_warm_start(choice)))
        model_source(resolved)  # a folder without config.json, a missing path, no hub: say so now
    except ValueError as err:
        raise SystemExit(f"--model {choice}: {err}") from None
    return resolved, choice if resolved == choice else f"{choice} ({resolved})"


def task_options(name: str) -> dict[str, int]:
    """The task's options here: countdown with 3 numbers (as before --task), any other its defaults."""
    return {"num_numbers": 3} if name == "countdown" else {}


def make_pivotrl(estimator: str, model_dir: str, out: Path, args: argparse.Namespace,
                 timer: PhaseTimer, prompts: PromptLog):
    from pivotrl.train.config import load_config
    from pivotrl.train.trainer import Trainer

    options = ", ".join(f"{k}: {v}" for k, v in task_options(args.task).items())
    overrides = [
        f"output_dir={out / estimator}",
        f"model.name_or_path={model_dir}", "model.device=cpu", "model.dtype=float32",
        f"model.chat_template={str(args.chat).lower()}",
        f"task.name={args.task}", f"task.options={{{options}}}",
        f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group_size}",
        f"rollout.max_new_tokens={args.max_new_tokens}", "rollout.temperature=1.0", "rollout.top_p=1.0",
        f"algorithm.estimator={estimator}", "algorithm.policy_loss=ppo",
        "algorithm.loss_kwargs={eps_low: 0.2, eps_high: 0.28}",
        f"train.lr={args.lr}", "train.warmup_steps=0", "train.min_lr_ratio=1.0", "train.weight_decay=0.0",
        "train.adam_betas=[0.9, 0.99]", "train.max_grad_norm=1.0", "train.ppo_epochs=1", "train.num_minibatches=1",
        f"train.num_threads={args.threads}", "train.seed=0", "train.max_steps=1000",
        "eval.before_after=false", "eval.every=0", "checkpoint.every=0", "log.progress=false",
    ]
    trainer = Trainer(load_config(None, overrides))
    assert trainer.config.model.chat_template == args.chat
    prompts.watch_pivotrl(trainer.engine)
    timer.wrap(trainer.engine, "generate", "generate")
    timer.wrap(trainer, "collect", "collect")  # generate + verifier
    timer.wrap(trainer, "_forward_all_no_grad", "ref_forward")
    timer.wrap(trainer, "_forward", "policy_forward", only_if=torch.is_grad_enabled)
    return trainer


def make_trl(model_dir: str, out: Path, args: argparse.Namespace, problems: list, texts: list[str],
             task: Any, timer: PhaseTimer, steps: int, callback: Any, prompts: PromptLog) -> Any:
    """TRL's GRPOTrainer on `texts`, the problems' prompts already rendered: a plain dataset of strings,
    which TRL tokenizes as they are (a conversational one would get the chat template from TRL)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from pivotrl.rewards.safe import safe_score

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    dataset = Dataset.from_dict({"prompt": texts, "problem_index": list(range(len(problems)))})

    def task_reward(prompts, completions, problem_index, **_):
        return [safe_score(task.verifier, text, problems[i].answer)
                for text, i in zip(completions, problem_index, strict=True)]

    config = GRPOConfig(
        output_dir=str(out / "trl"), use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        per_device_train_batch_size=args.prompts * args.group_size, gradient_accumulation_steps=1,
        num_generations=args.group_size, num_iterations=1, max_completion_length=args.max_new_tokens,
        temperature=1.0, top_p=1.0, top_k=0, beta=0.0, loss_type="dapo", scale_rewards="group",
        epsilon=0.2, epsilon_high=0.28, use_vllm=False,
        learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.99, optim="adamw_torch", max_grad_norm=1.0,
        max_steps=steps, seed=0, report_to=[], logging_strategy="no", save_strategy="no",
        eval_strategy="no", disable_tqdm=True, log_completions=False, dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=task_reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[callback])
    trainer.remove_callback(PrinterCallback)  # its end-of-train print is all it would do here
    prompts.watch_trl(trainer)
    timer.wrap(trainer, "_generate_single_turn", "generate")
    timer.wrap(trainer, "_calculate_rewards", "reward")
    timer.wrap(trainer, "compute_loss", "policy_forward")
    timer.wrap(trainer, "get_batch_samples", "data_fetch")
    return trainer


def run_isolated(args: argparse.Namespace) -> None:
    """Time TRL and pivotrl grpo in separate processes, N pairs in alternating order, and print the ratio."""
    import subprocess

    common = [sys.executable, __file__, "--prompts", str(args.prompts), "--group-size", str(args.group_size),
              "--max-new-tokens", str(args.max_new_tokens), "--steps", str(args.steps), "--warmup", str(args.warmup),
              "--threads", str(args.threads), "--lr", str(args.lr), "--model", args.model, "--task", args.task,
              *(["--chat"] if args.chat else [])]
    cpu: dict[str, list[float]] = defaultdict(list)
    wall: dict[str, list[float]] = defaultdict(list)
    pair_ratios = []
    with tempfile.TemporaryDirectory(prefix="bench_trl_isolated_") as tmp:
        for k in range(args.isolated):
            order = [("trl", "--trl-only"), ("grpo", "--no-trl")]
            medians = {}
            for name, flag in order if k % 2 == 0 else order[::-1]:
                out = Path(tmp) / f"{name}-{k}.json"
                extra = ["--estimators", "grpo"] if name == "grpo" else []
                subprocess.run([*common, flag, *extra, "--json", str(out)], check=True, stdout=subprocess.DEVNULL)
                times = json.loads(out.read_text())
                cpu[name] += times["cpu"][name]
                wall[name] += times["wall"][name]
                medians[name] = median(times["cpu"][name])
            pair_ratios.append(medians["grpo"] / medians["trl"])
            print(f"pair {k + 1}: CPU s per step TRL {medians['trl']:.2f}, pivotrl grpo {medians['grpo']:.2f}, "
                  f"ratio {pair_ratios[-1]:.3f}", flush=True)
    print(f"isolated processes, {args.isolated} pairs x {args.steps} steps: median step CPU s TRL "
          f"{median(cpu['trl']):.2f}, pivotrl grpo {median(cpu['grpo']):.2f}; wall s TRL {median(wall['trl']):.2f}, "
          f"pivotrl grpo {median(wall['grpo']):.2f}")
    print(f"pivotrl grpo+ppo step / TRL step: CPU {median(cpu['grpo']) / median(cpu['trl']):.3f}, wall "
          f"{median(wall['grpo']) / median(wall['trl']):.3f} (ratio of medians); per-pair CPU ratio median "
          f"{median(pair_ratios):.3f} [{min(pair_ratios):.3f}-{max(pair_ratios):.3f}]  [target <= 0.7]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32, help="prompts per step (P)")
    parser.add_argument("--group-size", type=int, default=8, help="samples per prompt (G)")
    parser.add_argument("--max-new-tokens", type=int, default=34)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per system")
    parser.add_argument("--warmup", type=int, default=1, help="untimed warm-up steps per system")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, both systems")
    parser.add_argument("--lr", type=float, default=1e-4,
                        help="AdamW's learning rate, both systems (a pretrained model needs its recipe's: "
                             "at 1e-4 SmolLM2's answers break within steps, and the lengths with them)")
    parser.add_argument("--model", default="auto",
                        help="auto: the shipped checkpoint if present, else tiny-random with the shipped "
                             "architecture; tiny, tiny-search, tiny-free, tiny-random, or anything "
                             "load_policy takes (smollm2-135m, smollm2-135m-add_sub, a folder, a hub id)")
    parser.add_argument("--task", default="countdown",
                        help="training task, both systems (countdown: 3 numbers; others: their defaults)")
    parser.add_argument("--chat", action="store_true",
                        help="render prompts with the tokenizer's chat template (an instruct model)")
    parser.add_argument("--estimators", default=",".join(TOKEN_LEVEL),
                        help="pivotrl estimators to time, comma-separated (grpo is always included)")
    parser.add_argument("--no-trl", action="store_true", help="time pivotrl only")
    parser.add_argument("--trl-only", action="store_true",
                        help="time TRL only (run it and --no-trl as two processes to rule out cross-talk between the two)")
    parser.add_argument("--isolated", type=int, default=0, metavar="N",
                        help="instead: N pairs of processes, one timing TRL only and one pivotrl grpo only, in "
                             "alternating order; reports the ratio free of any cross-talk inside one process")
    parser.add_argument("--json", type=Path, help="also write every timed step's wall and CPU seconds here")
    args = parser.parse_args()
    if args.no_trl and args.trl_only:
        parser.error("--no-trl and --trl-only exclude each other")
    if args.isolated:
        run_isolated(args)
        return
    estimators = [] if args.trl_only else ["grpo"] + [e for e in args.estimators.split(",") if e and e != "grpo"]

    warnings.filterwarnings("ignore")
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(args.threads)
    rounds = args.warmup + args.steps

    from pivotrl.modeling.policy import load_tokenizer
    from pivotrl.rollout.base import tokenize_prompts
    from pivotrl.tasks import get_task

    # per system: wall s, CPU s, phases {name: [wall, cpu]}, pivotrl metrics, longest response
    wall: dict[str, list[float]] = defaultdict(list)
    cpu: dict[str, list[float]] = defaultdict(list)
    phases: dict[str, list[dict[str, list[float]]]] = defaultdict(list)
    logged: dict[str, list[dict]] = defaultdict(list)
    widths: dict[str, list[float]] = defaultdict(list)
    fetch_ms: list[float] = []

    with tempfile.TemporaryDirectory(prefix="bench_trl_") as tmp:
        tmp = Path(tmp)
        model_dir, model_desc = prepare_model(args.model, tmp / "model")
        try:
            task = get_task(args.task, **task_options(args.task))
        except (KeyError, ValueError) as err:
            raise SystemExit(f"--task {args.task}: {err.args[0] if err.args else err}") from None
        problems = list(task.problems("train"))
        tokenizer = load_tokenizer(model_dir)
        if args.chat and not getattr(tokenizer, "chat_template", None):
            raise SystemExit(f"--chat: the tokenizer of {model_desc} has no chat template")
        # TRL's dataset: the prompts as pivotrl renders them (PromptLog.check compares the two)
        texts = [task.format_prompt(p, tokenizer, chat=args.chat) for p in problems]
        timer = PhaseTimer()
        prompts = PromptLog()
        pivot = {e: make_pivotrl(e, model_dir, tmp, args, timer, prompts) for e in estimators}

        def set_threads() -> None:
            torch.set_num_threads(args.threads)
            assert torch.get_num_threads() == args.threads

        def pivot_round(k: int) -> None:
            for name in (estimators if k % 2 == 0 else estimators[::-1]):
                set_threads()
                timer.take()
                watch = Stopwatch()
                watch.start()
                metrics = pivot[name].train_step()
                w, c = watch.stop()
                pivot[name].step += 1
                assert all(p.grad is not None for p in pivot[name].model.parameters()), "pivotrl step without grads"
                ph = timer.take()
                if k >= args.warmup:
                    wall[name].append(w)
                    cpu[name].append(c)
                    phases[name].append(ph)
                    logged[name].append(metrics)
                    widths[name].append(metrics["response_length/max"])

        from transformers import TrainerCallback

        class Interleave(TrainerCallback):
            """Times TRL's step from on_step_begin to on_step_end; runs the pivotrl steps outside that window."""

            trainer = None

            def __init__(self) -> None:
                self.k = 0
                self.watch = Stopwatch()

            def on_step_begin(self, a, state, control, **kw):
                if self.k >= args.warmup:
                    fetch_ms.append(timer.take().get("data_fetch", [0.0, 0.0])[0] * 1000)
                if self.k % 2 == 1:
                    pivot_round(self.k)
                set_threads()
                timer.take()
                self.watch.start()

            def on_pre_optimizer_step(self, a, state, control, **kw):
                # guard: TRL's step really backpropagated into every parameter before its AdamW step
                params = list(self.trainer.model.parameters())
                assert all(p.grad is not None for p in params), "TRL step without gradients"

            def on_step_end(self, a, state, control, **kw):
                w, c = self.watch.stop()
                ph = timer.take()
                if self.k >= args.warmup:
                    wall["trl"].append(w)
                    cpu["trl"].append(c)
                    phases["trl"].append(ph)
                    widths["trl"].append(self.trainer._metrics["train"]["completions/max_length"][-1])
                if self.k % 2 == 0:
                    pivot_round(self.k)
                self.k += 1

        trl_trainer = None
        if not args.no_trl:
            callback = Interleave()
            trl_trainer = make_trl(model_dir, tmp, args, problems, texts, task, timer, rounds,
                                   callback, prompts)
            callback.trainer = trl_trainer
        if not estimators:  # TRL only: compare its prompt ids with pivotrl's tokenization all the same
            prompts.pivot_tokenize = lambda batch: tokenize_prompts(tokenizer, batch, None)
        n_params = sum(p.numel() for p in (next(iter(pivot.values())).model if pivot
                                           else trl_trainer.model).parameters())
        task_desc = args.task + (" (3 numbers)" if args.task == "countdown" else "")
        print(f"# BENCHMARK: pivotrl Trainer.train_step vs TRL {__import__('trl').__version__} GRPOTrainer "
              f"(torch {torch.__version__}, transformers {transformers.__version__})")
        print(f"model: {model_desc}, {n_params / 1e6:.1f} M parameters")
        print(f"{args.prompts} prompts x {args.group_size} samples = {args.prompts * args.group_size} responses/step, "
              f"max_new_tokens {args.max_new_tokens}, temperature 1, {task_desc}, "
              f"{'chat-template' if args.chat else 'plain'} prompts, lr {args.lr:g}, float32 CPU, "
              f"{args.threads} torch thread(s) each; {args.warmup} warm-up + {args.steps} timed steps per system, "
              f"interleaved round by round")
        pivot_tokenizer = next(iter(pivot.values())).tokenizer if pivot else tokenizer
        print(stop_tokens(trl_trainer, pivot_tokenizer), flush=True)
        t_all = time.perf_counter()
        if trl_trainer is None:
            for k in range(rounds):
                pivot_round(k)
        else:
            timer.take()
            trl_trainer.train()
        total = time.perf_counter() - t_all
        prompts_ok, prompt_lines = prompts.check(set(texts))

    print("\n".join(prompt_lines), file=sys.stdout if prompts_ok else sys.stderr)  # --isolated: stderr
    systems = (["trl"] if "trl" in wall else []) + estimators
    if args.json is not None:
        args.json.write_text(json.dumps({"wall": {n: wall[n] for n in systems}, "cpu": {n: cpu[n] for n in systems}}))
    label = {"trl": "TRL GRPOTrainer", **{e: f"pivotrl {e}" for e in estimators}}

    def ph(name: str, key: str, i: int) -> list[float]:
        return [p.get(key, [0.0, 0.0])[i] for p in phases[name]]

    print(f"\nstep time, seconds: wall and process CPU (median [min-max] of {args.steps} steps)")
    print(f"{'system':<24}{'wall':>8}{'':>16}{'CPU':>8}")
    for name in systems:
        print(f"{label[name]:<24}{median(wall[name]):>8.2f} [{min(wall[name]):5.2f}-{max(wall[name]):5.2f}]"
              f"{median(cpu[name]):>8.2f} [{min(cpu[name]):5.2f}-{max(cpu[name]):5.2f}]")

    print("\nwhere the CPU time goes (median CPU seconds per step)")
    print(f"{'system':<24}{'generate':>9}{'reward':>8}{'pol.fwd':>9}{'ref.fwd':>9}{'rest':>7}")
    for name in systems:
        gen = ph(name, "generate", 1)
        if name == "trl":
            rew = ph(name, "reward", 1)
        else:
            rew = [c - g for c, g in zip(ph(name, "collect", 1), gen, strict=True)]
        fwd, ref = ph(name, "policy_forward", 1), ph(name, "ref_forward", 1)
        rest = [t - g - r - f - rf for t, g, r, f, rf in zip(cpu[name], gen, rew, fwd, ref, strict=True)]
        print(f"{label[name]:<24}{median(gen):>9.2f}{median(rew):>8.3f}{median(fwd):>9.2f}{median(ref):>9.2f}"
              f"{median(rest):>7.2f}")
    print("generate: sampling only (TRL: _generate_single_turn); reward: verifier (pivotrl: collect minus generate, "
          "so it also holds prompt formatting); pol.fwd: the grad-enabled policy forward with log-probs and entropies "
          "(TRL: compute_loss, so also its loss); ref.fwd: reference-model forward; rest: backward, grad clipping, "
          "AdamW, estimator, loss, decoding, metrics")
    print("longest response per step (tokens, median): "
          + ", ".join(f"{label[n]} {median(widths[n]):.0f}" for n in systems if widths[n]))
    if fetch_ms:
        print(f"TRL dataloader fetch before on_step_begin (not counted in its step): median {median(fetch_ms):.1f} ms")

    if "trl" in wall:
        print()
        for name in [e for e in ("grpo", "erpo") if e in wall]:
            rw = median(wall[name]) / median(wall["trl"])
            rc = median(cpu[name]) / median(cpu["trl"])
            rmin = min(cpu[name]) / min(cpu["trl"])
            paired = median([p / t for p, t in zip(cpu[name], cpu["trl"], strict=True)])
            note = "target <= 0.7" if name == "grpo" else "erpo also runs the reference model, TRL runs none"
            print(f"pivotrl {name}+ppo step / TRL step: wall {rw:.3f}, CPU {rc:.3f} (ratio of medians); "
                  f"CPU per-round median {paired:.3f}, CPU ratio of minima {rmin:.3f}  [{note}]")

    if not estimators:
        print(f"\ntotal benchmark wall time {total:.0f} s")
        raise SystemExit(0 if prompts_ok else 1)
    base_w, base_c = median(wall["grpo"]), median(cpu["grpo"])
    base_est = median([m["time/estimator_s"] for m in logged["grpo"]])
    print(f"\ntoken-level estimators in pivotrl's step ({args.prompts * args.group_size} responses x "
          f"{args.max_new_tokens} tokens)")
    print(f"{'estimator':<16}{'est. ms':>8}{'% step':>8}{'wall s':>8}{'vs grpo':>8}{'CPU s':>7}{'vs grpo':>8}"
          f"{'paired':>8}{'ref.fwd':>8}{'w/o ref':>8}{'est. only':>10}")
    for name in estimators:
        est = median([m["time/estimator_s"] for m in logged[name]])
        share = median([m["time/estimator_s"] / m["time/step_s"] for m in logged[name]])
        refs = ph(name, "ref_forward", 1)
        paired = median([c / g for c, g in zip(cpu[name], cpu["grpo"], strict=True)])
        no_ref = median([c - r for c, r in zip(cpu[name], refs, strict=True)])
        print(f"{name:<16}{est * 1000:>8.2f}{share * 100:>7.3f}%{median(wall[name]):>8.2f}"
              f"{(median(wall[name]) / base_w - 1) * 100:>+7.1f}%{median(cpu[name]):>7.2f}"
              f"{(median(cpu[name]) / base_c - 1) * 100:>+7.1f}%{(paired - 1) * 100:>+7.1f}%{median(refs):>8.2f}"
              f"{(no_ref / base_c - 1) * 100:>+7.1f}%{(est - base_est) / base_w * 100:>+9.3f}%")
    print("est. ms, % step: pivotrl's time/estimator_s and its share of time/step_s (medians). vs grpo: median "
          "step time over grpo's (target < +3%); paired: median over rounds of CPU(est)/CPU(grpo) in the same "
          "round; ref.fwd: CPU s of the reference-model forward (erpo, ep_grpo); w/o ref: CPU vs grpo without it; "
          "est. only: the estimator's own extra time over grpo's, as % of grpo's step (the rest of any "
          "difference is timing noise: rollout, forward and backward are the same work for every estimator as long "
          "as the longest response is the same)")
    print(f"\ntotal benchmark wall time {total:.0f} s")
    if not prompts_ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
