"""BENCHMARK on one CUDA GPU: a real-size pivotrl step, each method's cost over GRPO, chunked log-probs
at a 152k vocabulary, and TRL's GRPOTrainer step on the same model and batch.

    python benchmarks/bench_gpu_step.py --out runs/gpu/gpu_step.json [--budget-s 420]
    python benchmarks/bench_gpu_step.py --tiny --out /tmp/gpu_step.json   # the same code, tiny shapes, on the CPU

Models: Llama-family models of Qwen2.5-0.5B's and Qwen2.5-1.5B's shapes (layers, widths, heads, the
151,936-token vocabulary, tied embeddings; no attention bias), built from a config with random
weights (nothing is downloaded), bf16, saved once and loaded by pivotrl's Trainer as a user's model
would be. Random weights make near-uniform next-token distributions, so responses run to the length
limit: every method sees P x G responses of exactly 512 or 2048 tokens.

Per (model, length): one Trainer (countdown prompts, P x G responses, gradient checkpointing,
two minibatches, micro-batches of 16k tokens), one rollout with its HF engine, shared by the methods;
then for each method Trainer.learn_from on that rollout: the forwards (ℓ^ref where the method reads
it, ℓ^old and H), the estimator, the updates (forward, loss, backward, AdamW). A method's step time is
the rollout's plus its own; its cost over GRPO is its step time over GRPO's. Only the algorithm
differs between the methods (the harness swaps Trainer.config between them); the weights move a little
with each update, which changes no shape or time. A warm-up pass (grpo, untimed) comes first.

Everything is written to --out as it is measured, so a run stopped at its time limit keeps what it
has; what the budget did not allow is listed under "skipped". The last line is one summary.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Qwen2.5's published configs (config.json of Qwen/Qwen2.5-0.5B and -1.5B), as a Llama.
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b-shape": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                           "num_attention_heads": 14, "num_key_value_heads": 2},
    "qwen2.5-1.5b-shape": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                           "num_attention_heads": 12, "num_key_value_heads": 2},
}
TINY_SHAPES = {"tiny-shape": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                              "num_attention_heads": 2, "num_key_value_heads": 1}}
VOCAB = 151936
METHODS = ("grpo", "erpo", "ep_grpo", "tepo", "mpo")


class Report:
    """The JSON written after every measurement."""

    def __init__(self, path: Path, budget_s: float) -> None:
        self.path, self.budget_s, self.start = path, budget_s, time.perf_counter()
        self.data: dict[str, Any] = {"skipped": [], "errors": []}

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def fits(self, seconds: float, what: str) -> bool:
        """Whether `what`, expected to take `seconds`, fits the budget; else it is listed as skipped."""
        if self.elapsed() + seconds <= self.budget_s:
            return True
        self.data["skipped"].append(f"{what} (expected {seconds:.0f} s, {self.budget_s - self.elapsed():.0f} s left)")
        self.save()
        return False

    def error(self, what: str) -> None:
        self.data["errors"].append(f"{what}: {traceback.format_exc(limit=3)[-1500:]}")
        print(f"error in {what}:\n{traceback.format_exc()}", flush=True)
        self.save()

    def save(self) -> None:
        self.data["wall_s"] = self.elapsed()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=2))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_gib(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def warm_gpu(device: torch.device, seconds: float = 5.0) -> None:
    """Busy the GPU with bf16 matrix products for `seconds` before timing anything.

    In the first run (docs/PERFORMANCE.md, 2026-12-04) the same rollout took 45 s at the start and
    about 15 s after forward-backward work; a clock still ramping up is one candidate.
    """
    if device.type != "cuda":
        return
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize(device)


def build_model(shape: dict[str, Any], folder: Path, device: torch.device, dtype: torch.dtype, vocab: int) -> int:
    """A random-weight Llama of `shape` with pivotrl's character tokenizer, saved to `folder`; its parameter count."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from pivotrl.modeling.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = LlamaConfig(vocab_size=vocab, tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
                         rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=4096, hidden_act="silu",
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, **shape)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    count = sum(p.numel() for p in model.parameters())
    del model
    return count


def trainer_overrides(folder: Path, out: Path, args: argparse.Namespace, length: int, device: str,
                      dtype: str) -> list[str]:
    return [
        f"output_dir={out}", f"model.name_or_path={folder}", f"model.dtype={dtype}", f"model.device={device}",
        "model.gradient_checkpointing=true", "task.name=countdown", "task.options={num_numbers: 3}",
        f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group_size}",
        f"rollout.max_new_tokens={length}", "rollout.temperature=1.0", "rollout.max_logprob_diff=null",
        "train.lr=1e-6", "train.warmup_steps=0", "train.max_steps=1000", "train.num_minibatches=2",
        f"train.micro_batch_size={max(1, args.micro_tokens // length)}", "eval.before_after=false",
        "eval.every=0", "checkpoint.every=0", "log.progress=false",
    ]


def measure_methods(report: Report, name: str, folder: Path, length: int, args: argparse.Namespace,
                    device: torch.device, dtype: str, tmp: Path) -> None:
    """One rollout of P x G responses of `length` tokens, then each method's phases on it."""
    from pivotrl.analysis.compare import method_overrides
    from pivotrl.train.checks import check_run
    from pivotrl.train.config import load_config
    from pivotrl.train.trainer import Trainer

    key = f"{name}@{length}"
    base = trainer_overrides(folder, tmp / key, args, length, device.type, dtype)
    trainer = Trainer(load_config(None, [*base, "algorithm.estimator=erpo"]))  # erpo: the reference model is loaded
    entry: dict[str, Any] = {"responses": args.prompts * args.group_size, "max_new_tokens": length,
                             "micro_batch_size": trainer.config.train.micro_batch_size, "methods": {}}
    report.data.setdefault("steps", {})[key] = entry
    trainer.engine.generate(["Use 1 2 to make 3"], 2, max_new_tokens=8)  # CUDA and cuBLAS start-up, untimed
    reset_peak(device)
    sync(device)
    start = time.perf_counter()
    collected = trainer.collect()
    rollout = collected.rollout
    sync(device)
    rollout_s = time.perf_counter() - start
    tokens = int(rollout.response_mask.sum())
    entry.update({"rollout_s": rollout_s, "rollout_peak_gib": peak_gib(device), "response_tokens": tokens,
                  "decode_ms_per_token_step": 1000 * rollout_s / rollout.response_ids.shape[1]})
    print(f"{key}: rollout {rollout_s:.1f} s, {tokens} tokens", flush=True)
    report.save()
    for method in ("warm-up", *args.methods):
        cfg = load_config(None, [*base, *method_overrides("grpo" if method == "warm-up" else method)])
        trainer.config = cfg  # only the algorithm differs between methods
        trainer.checks = check_run(cfg)
        reset_peak(device)
        metrics = trainer.learn_from(collected, {"time/rollout_s": rollout_s})
        if method == "warm-up":
            entry["logprob_diff_bf16"] = metrics.get("rollout/logprob_diff")
            continue
        entry["methods"][method] = {
            "step_s": metrics["time/step_s"], "forward_s": metrics["time/forward_s"],
            "estimator_s": metrics["time/estimator_s"], "update_s": metrics["time/update_s"],
            "tokens_per_s": metrics["tokens_per_s"], "peak_gib": peak_gib(device),
        }
        print(f"{key} {method}: " + ", ".join(f"{k} {v:.3g}" for k, v in entry["methods"][method].items()),
              flush=True)
        report.save()
    grpo = entry["methods"].get("grpo")
    if grpo:
        for m in entry["methods"].values():
            m["cost_over_grpo_pct"] = 100 * (m["step_s"] / grpo["step_s"] - 1)
            m["learn_cost_over_grpo_pct"] = 100 * ((m["step_s"] - rollout_s) / (grpo["step_s"] - rollout_s) - 1)
    report.save()
    del trainer, rollout, collected
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure_trl(report: Report, folder: Path, length: int, args: argparse.Namespace, device: torch.device,
                dtype: str, tmp: Path) -> None:
    """TRL's GRPOTrainer step vs pivotrl's grpo step (one forward, as TRL's), same model, prompts and batch."""
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from pivotrl.rewards.safe import safe_score
    from pivotrl.tasks import get_task
    from pivotrl.train.config import load_config
    from pivotrl.train.trainer import Trainer

    task = get_task("countdown", num_numbers=3)
    problems = list(task.problems("train"))[: args.prompts * (args.trl_steps + 1)]
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=getattr(torch, dtype))
    dataset = Dataset.from_dict({"prompt": [task.format_prompt(p) for p in problems],
                                 "problem_index": list(range(len(problems)))})

    def countdown_reward(prompts, completions, problem_index, **_):
        return [safe_score(task.verifier, t, problems[i].answer) for t, i in zip(completions, problem_index, strict=True)]

    times: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            sync(device)
            self.t = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            sync(device)
            times.append(time.perf_counter() - self.t)

    config = GRPOConfig(
        output_dir=str(tmp / "trl"), bf16=dtype == "bfloat16", use_cpu=device.type == "cpu",
        gradient_checkpointing=True, per_device_train_batch_size=args.prompts * args.group_size,
        gradient_accumulation_steps=1, num_generations=args.group_size, num_iterations=1,
        max_completion_length=length, temperature=1.0, top_p=1.0, top_k=0, beta=0.0, loss_type="dapo",
        scale_rewards="group", epsilon=0.2, epsilon_high=0.28, use_vllm=False, learning_rate=1e-6,
        lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=1.0, max_steps=args.trl_steps + 1, seed=0,
        report_to=[], logging_strategy="no", save_strategy="no", eval_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trl_trainer = GRPOTrainer(model=model, reward_funcs=countdown_reward, args=config, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[StepClock()])
    trl_trainer.train()
    del trl_trainer, model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    overrides = [*trainer_overrides(folder, tmp / "pivot-trl", args, length, device.type, dtype),
                 "algorithm.estimator=grpo", "algorithm.loss_kwargs={eps_low: 0.2, eps_high: 0.28}",
                 "train.num_minibatches=1", "train.micro_batch_size=null"]
    trainer = Trainer(load_config(None, overrides))
    ours = [trainer.train_step()["time/step_s"] for _ in range(args.trl_steps + 1)]
    del trainer
    gc.collect()
    trl_s, ours_s = min(times[1:] or times), min(ours[1:] or ours)
    report.data["trl"] = {"trl_version": trl.__version__, "max_new_tokens": length,
                          "responses": args.prompts * args.group_size, "trl_step_s": times, "pivotrl_grpo_step_s": ours,
                          "ratio_pivotrl_over_trl": ours_s / trl_s,
                          "note": "first step of each is a warm-up; the ratio is of the fastest later steps"}
    report.save()
    print(f"TRL step {trl_s:.1f} s, pivotrl grpo step {ours_s:.1f} s, ratio {ours_s / trl_s:.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON of every figure (written as it goes)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="stop starting new measurements after this")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--lengths", default="512,2048")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--micro-tokens", type=int, default=16384, help="tokens per micro-batch (rows = this / length)")
    parser.add_argument("--trl-steps", type=int, default=1, help="timed TRL steps (after one warm-up)")
    parser.add_argument("--no-trl", action="store_true")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes and vocabulary, float32, on the CPU: a dry run")
    args = parser.parse_args()
    args.methods = [m for m in args.methods.split(",") if m]
    lengths = [int(x) for x in args.lengths.split(",") if x]
    if args.tiny:
        shapes, vocab, dtype, device = TINY_SHAPES, 512, "float32", torch.device("cpu")
        lengths = [8, 16]
    elif not torch.cuda.is_available():
        raise SystemExit("bench_gpu_step: no CUDA GPU visible to torch (use --tiny for a CPU dry run)")
    else:
        shapes, vocab, dtype, device = SHAPES, VOCAB, "bfloat16", torch.device("cuda")

    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    report = Report(args.out, args.budget_s)
    report.data["machine"] = {
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "transformers": transformers.__version__,
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                 cwd=ROOT).stdout.strip() or "unknown",
        "date": time.strftime("%Y-%m-%d"),
    }
    report.save()
    with tempfile.TemporaryDirectory(prefix="bench_gpu_step_") as tmp:
        tmp = Path(tmp)
        decode_ms: float | None = None  # per decode step, from the last rollout: sizes the next one
        folders: dict[str, Path] = {}
        for name, shape in shapes.items():
            try:
                params = build_model(shape, tmp / name, device, getattr(torch, dtype), vocab)
                report.data.setdefault("models", {})[name] = {**shape, "vocab_size": vocab, "parameters": params}
                folders[name] = tmp / name
            except Exception:  # noqa: BLE001 - recorded, and the next measurement still runs
                report.error(f"build {name}")
        warm_gpu(device)
        for length in lengths:  # the shorter responses of every size first
            for name, folder in folders.items():
                expected = 20 + (decode_ms or 30) * length / 1000 * 1.6
                if not report.fits(expected, f"{name}@{length}"):
                    continue
                try:
                    measure_methods(report, name, folder, length, args, device, dtype, tmp)
                    decode_ms = report.data["steps"][f"{name}@{length}"]["decode_ms_per_token_step"]
                except Exception:  # noqa: BLE001
                    report.error(f"{name}@{length}")
        if report.fits(20, "chunked log-probs at a 152k vocabulary"):
            try:
                sys.path.insert(0, str(ROOT / "benchmarks"))
                from bench_logprobs import measure_peak_memory

                dims = (2, 2048, 65536, 256) if args.tiny else (8, 2048, VOCAB, 1536)
                report.data["logprobs"] = measure_peak_memory(*dims)
                report.save()
            except Exception:  # noqa: BLE001
                report.error("chunked log-probs")
        first = next(iter(folders), None)
        if first and not args.no_trl and report.fits(70, f"TRL GRPOTrainer step ({first}@{lengths[0]})"):
            try:
                measure_trl(report, folders[first], lengths[0], args, device, dtype, tmp)
            except Exception:  # noqa: BLE001
                report.error("TRL GRPOTrainer step")
    report.save()
    steps = report.data.get("steps", {})
    costs = "; ".join(
        f"{key}: grpo {s['methods']['grpo']['step_s']:.1f} s/step, "
        + ", ".join(f"{m} {v['cost_over_grpo_pct']:+.1f}%" for m, v in s["methods"].items() if m != "grpo")
        for key, s in steps.items() if "grpo" in s["methods"])
    lp = report.data.get("logprobs")
    trl_ratio = report.data.get("trl", {}).get("ratio_pivotrl_over_trl")
    print(f"gpu step: {report.data['machine']['device']}, {len(steps)} configs; {costs or 'no step measured'}; "
          f"chunked/naive peak {lp['peak_ratio']:.3f}" if lp else "chunked log-probs not measured", end="")
    print(f"; pivotrl/TRL step {trl_ratio:.2f}" if trl_ratio else "; TRL not measured",
          f"; {len(report.data['errors'])} errors, {len(report.data['skipped'])} skipped; {report.elapsed():.0f} s")


if __name__ == "__main__":
    main()
