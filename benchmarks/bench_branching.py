"""BENCHMARK: what sharing a pivot's prefix saves when the hf engine samples its K branches.

    python benchmarks/bench_branching.py [--model tiny-search] [--task countdown_search] [--prompts 8]
        [--group-size 8] [--pivots 1] [--branches 4] [--max-new-tokens 224] [--repeats 3] [--threads 1]

One rollout of P x G responses from the policy, its entropies from the trainer's forward, the
pivots picked as the trainer picks them; then, interleaved `--repeats` times:

  shared:   sample_branches, as the trainer calls it: each pivot's prefix is prefilled once and its
            KV cache copied to the K rows that continue it (HFEngine.generate_from_ids, num_samples=K);
  separate: the same prefixes each listed K times, num_samples=1: K prefills of the same prefix.

Both sample every branch to the same per-row limit with the same seed, so they generate the same
number of tokens up to sampling noise; the script prints the medians, their ratio, and the time
per generated token of each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pivotrl.modeling.policy import load_policy  # noqa: E402
from pivotrl.rollout.base import left_pad  # noqa: E402
from pivotrl.rollout.branching import pick_pivots, sample_branches  # noqa: E402
from pivotrl.rollout.forward import response_logprobs  # noqa: E402
from pivotrl.rollout.hf import HFEngine  # noqa: E402
from pivotrl.tasks import get_task  # noqa: E402


def separate_prefills(engine: HFEngine, rollout, pivots: torch.Tensor, branches: int, max_new_tokens: int,
                      generator: torch.Generator) -> int:
    """The branches with one prefill per row: each prefix listed K times, num_samples=1; returns its tokens."""
    rows, slots = (pivots >= 0).nonzero(as_tuple=True)
    position = pivots[rows, slots]
    prefixes = [torch.cat([rollout.prompt_ids[r][rollout.prompt_mask[r]], rollout.response_ids[r, :p]]).tolist()
                for r, p in zip(rows.tolist(), position.tolist(), strict=True) for _ in range(branches)]
    ids, mask = left_pad(prefixes, engine.tokenizer.pad_token_id)
    limits = (max_new_tokens - position).clamp(min=1).repeat_interleave(branches)
    out = engine.generate_from_ids(ids, mask, 1, max_new_tokens=limits, generator=generator)
    return int(out.response_mask.sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-search")
    parser.add_argument("--task", default="countdown_search")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--pivots", type=int, default=1)
    parser.add_argument("--spacing", type=int, default=4)
    parser.add_argument("--branches", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=224)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_policy(args.model)
    engine = HFEngine(model, tokenizer)
    task = get_task(args.task)
    problems = task.problems("test")[: args.prompts]
    rollout = engine.generate([task.format_prompt(p) for p in problems], args.group_size,
                              max_new_tokens=args.max_new_tokens, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, entropies = response_logprobs(model, rollout)
    pivots = pick_pivots(entropies, rollout.response_mask, count=args.pivots, spacing=args.spacing)
    main_tokens = int(rollout.response_mask.sum())
    times: dict[str, list[float]] = {"shared": [], "separate": []}
    tokens: dict[str, list[int]] = {"shared": [], "separate": []}
    for k in range(args.repeats):
        for name in ("shared", "separate") if k % 2 == 0 else ("separate", "shared"):
            generator = torch.Generator().manual_seed(k)
            start = time.perf_counter()
            if name == "shared":
                found = sample_branches(engine, rollout, pivots, branches=args.branches,
                                        max_new_tokens=args.max_new_tokens, temperature=1.0, top_p=1.0,
                                        generator=generator)
                count = found.tokens if found else 0
            else:
                count = separate_prefills(engine, rollout, pivots, args.branches, args.max_new_tokens, generator)
            times[name].append(time.perf_counter() - start)
            tokens[name].append(count)
    med = {n: statistics.median(v) for n, v in times.items()}
    per_token = {n: med[n] / max(statistics.median(tokens[n]), 1) * 1000 for n in med}
    print(f"{args.model} on {args.task}: {args.prompts} x {args.group_size} responses ({main_tokens} tokens), "
          f"{int((pivots >= 0).sum())} pivots x {args.branches} branches, {args.threads} thread(s), "
          f"{args.repeats} interleaved repeats")
    for name in med:
        print(f"  {name:<9} median {med[name]:6.2f} s  [{min(times[name]):.2f}-{max(times[name]):.2f}], "
              f"{statistics.median(tokens[name]):,.0f} tokens, {per_token[name]:.3f} ms/token")
    print(f"shared / separate: time {med['shared'] / med['separate']:.3f}, per token "
          f"{per_token['shared'] / per_token['separate']:.3f}")


if __name__ == "__main__":
    main()
