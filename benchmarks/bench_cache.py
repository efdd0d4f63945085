"""The hf engine's KV cache grown in place vs transformers' DynamicCache (torch.cat at every step).

    python benchmarks/bench_cache.py [--rows 256 2048] [--rounds 5] [--threads 1]

For each batch size, samples 34 new tokens for `rows` rows (8 countdown prompts, rows/8
samples each) with the shipped policy, once with each cache per round, alternating which
goes first. Checks that both sample the same tokens, and prints the median CPU time of
each and their ratio (below 1: growing in place is faster).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from pivotrl.modeling.policy import load_policy
from pivotrl.rollout.hf import HFEngine
from pivotrl.tasks import get_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[256, 2048])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    task = get_task("countdown")
    model, tokenizer = load_policy("tiny")
    engines = {grow: HFEngine(model, tokenizer, grow_cache_in_place=grow) for grow in (False, True)}
    ids, mask = engines[True].encode_prompts([task.format_prompt(p) for p in task.problems("test")[:8]])
    for rows in args.rows:
        cpu: dict[bool, list[float]] = {False: [], True: []}
        for r in range(args.rounds):
            out = {}
            for grow in (False, True) if r % 2 == 0 else (True, False):
                start = time.process_time()
                out[grow] = engines[grow].generate_from_ids(ids, mask, max(1, rows // 8), max_new_tokens=34,
                                                            generator=torch.Generator().manual_seed(r))
                cpu[grow].append(time.process_time() - start)
            if not torch.equal(out[False].response_ids, out[True].response_ids):
                raise SystemExit("the two caches sampled different tokens")
        plain, grown = statistics.median(cpu[False]), statistics.median(cpu[True])
        print(f"rows {rows}: DynamicCache {plain:.2f} s, grown in place {grown:.2f} s, ratio {grown / plain:.2f}")


if __name__ == "__main__":
    main()
