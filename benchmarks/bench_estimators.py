"""Time every estimator on 4096 responses (groups of 8) x 1024 tokens, as ratios to grpo.

    python benchmarks/bench_estimators.py [--responses 4096] [--tokens 1024] [--repeats 9]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from pivotrl.algorithms import ESTIMATORS, TokenBatch, compute_advantages


def random_batch(n: int, t: int, group_size: int, seed: int = 0) -> TokenBatch:
    """A realistic random batch: binary rewards, right-padded lengths, entropies in [0, 3)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(t // 4, t + 1, (n,), generator=g)
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    return TokenBatch(
        rewards=(torch.rand(n, generator=g) < 0.5).float(),
        group_index=torch.arange(n) // group_size,
        response_mask=mask,
        old_logprobs=-torch.rand(n, t, generator=g) * 3,
        ref_logprobs=-torch.rand(n, t, generator=g) * 3,
        entropies=torch.rand(n, t, generator=g) * 3,
        pivot_values=torch.where(torch.rand(n, t, generator=g) < 4 / t, torch.rand(n, t, generator=g), torch.nan),
    )


def timed(name: str, batch: TokenBatch) -> float:
    """Wall time in seconds of one compute_advantages(name, batch)."""
    start = time.perf_counter()
    compute_advantages(name, batch)
    return time.perf_counter() - start


def time_against_grpo(name: str, batch: TokenBatch, repeats: int) -> tuple[float, float, float, float]:
    """(median seconds, grpo's median seconds, median ratio, ratio of medians), grpo and `name`
    timed alternately (grpo just before each run of `name`) so that drift cancels; both warmed first."""
    for warm in ("grpo", name):
        compute_advantages(warm, batch)
    times, bases, ratios = [], [], []
    for _ in range(repeats):
        base = timed("grpo", batch)
        seconds = timed(name, batch)
        times.append(seconds)
        bases.append(base)
        ratios.append(seconds / base)
    median, base_median = statistics.median(times), statistics.median(bases)
    return median, base_median, statistics.median(ratios), median / base_median


def main() -> None:
    """Print each estimator's median time and its ratio to grpo."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--responses", type=int, default=4096)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    batch = random_batch(args.responses, args.tokens, args.group_size)
    print(f"{args.responses} responses x {args.tokens} tokens, groups of {args.group_size}, "
          f"{torch.get_num_threads()} threads, float32; x grpo = median over rounds of (estimator / grpo "
          "timed just before it); x med = ratio of the two medians")
    print(f"{'estimator':<16}{'median s':>10}{'grpo s':>9}{'x grpo':>8}{'x med':>8}")
    for name in ESTIMATORS:
        seconds, base, ratio, of_medians = time_against_grpo(name, batch, args.repeats)
        print(f"{name:<16}{seconds:>10.4f}{base:>9.4f}{ratio:>8.2f}{of_medians:>8.2f}")


if __name__ == "__main__":
    main()
