"""rollout/logprob_diff = mean |ℓ^sampler − ℓ^old| for exact, lower-precision, stale and wrong samplers (CPU).

The figures behind rollout.max_logprob_diff's default (docs/ALGORITHMS.md, "Sampler check"):
32 countdown prompts x 8 samples from the shipped tiny policy, ℓ^old from the trainer's
float32 forward; then a real run of the default recipe (16 prompts per step) whose engine
keeps the initial weights.

    python benchmarks/bench_sampler_check.py [--stale-steps 12]
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile

import torch

from pivotrl.modeling.policy import frozen_copy, load_policy
from pivotrl.modeling.tiny import build_tiny_model
from pivotrl.rollout.forward import response_logprobs
from pivotrl.rollout.hf import HFEngine
from pivotrl.tasks import get_task
from pivotrl.train.config import load_config
from pivotrl.train.recipes import recipe_path
from pivotrl.train.sampler_check import logprob_diff
from pivotrl.train.trainer import Trainer


def one_rollout_diffs() -> None:
    model, tokenizer = load_policy("tiny", device="cpu")
    task = get_task("countdown", num_numbers=3)
    prompts = [task.format_prompt(p, tokenizer) for p in task.problems("train")[:32]]

    def diff(sampler: torch.nn.Module, temperature: float = 1.0, top_p: float = 1.0) -> float:
        rollout = HFEngine(sampler, tokenizer).generate(prompts, 8, max_new_tokens=34, temperature=temperature,
                                                        top_p=top_p, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            old, _ = response_logprobs(model, rollout, temperature=temperature)
        return logprob_diff(rollout.sampler_logprobs, old, rollout.response_mask)

    rows = [
        ("hf engine, the policy itself, T = 1", diff(model)),
        ("hf engine, the policy itself, T = 0.7", diff(model, 0.7)),
        ("hf engine, the policy itself, greedy", diff(model, 0.0)),
        ("hf engine, the policy itself, top_p = 0.9", diff(model, 1.0, 0.9)),
        ("a bfloat16 copy of the policy (trainer float32)", diff(copy.deepcopy(model).to(torch.bfloat16))),
        ("another model (tiny-random, seed 1)", diff(build_tiny_model(tokenizer, seed=1))),
    ]
    print("| sampler | rollout/logprob_diff |\n|---|---:|")
    for name, value in rows:
        print(f"| {name} | {value:.2g} |")


def stale_run(steps: int) -> None:
    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(recipe_path("default"), [
            f"output_dir={out}", f"train.max_steps={steps}", "rollout.prompts_per_step=16", "train.num_threads=1",
            "eval.before_after=false", "checkpoint.every=0", "log.progress=false", "rollout.max_logprob_diff=null"])
        trainer = Trainer(cfg)
        trainer.engine = HFEngine(frozen_copy(trainer.model), trainer.tokenizer)  # never receives the updates
        trainer.run()
        diffs = [json.loads(line)["rollout/logprob_diff"] for line in open(f"{out}/metrics.jsonl")]
    print("\nstale engine (the initial weights), default recipe, 16 prompts per step; logprob_diff by step:")
    print(" ".join(f"{d:.3f}" for d in diffs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stale-steps", type=int, default=12)
    args = parser.parse_args()
    torch.set_num_threads(1)
    one_rollout_diffs()
    stale_run(args.stale_steps)


if __name__ == "__main__":
    main()
