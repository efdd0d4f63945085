"""Two checkouts' bench_rewards.py, interleaved: the throughput ratio (after / before) per row.

    python benchmarks/bench_rewards_ab.py BEFORE AFTER [--reps 4] [--script after] [-- bench_rewards options]

BEFORE and AFTER are checkouts of this repository (a ``git worktree add
--detach DIR COMMIT`` makes one). Each repetition runs
``benchmarks/bench_rewards.py`` once with each checkout first on PYTHONPATH,
in the order before, after, then after, before in the next one (so a drift
in the machine's load falls on both alike). The script is each checkout's
own, or with ``--script after`` the AFTER checkout's for both (the same
measurement of two implementations). Per row it prints the median rate
of each side and, over the repetitions, the min and median of the ratio
after / before of the rates and of the CPU time per item (each ratio from
the two runs of one repetition). On a shared machine the wall-clock rates
move with the load; the CPU ratio moves less.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROW = re.compile(r"^(?P<label>\s*\S.*?)\s+(?P<items>\d+)\s+(?P<rate>[\d.]+)\s+(?P<cpu>[\d.]+)$")


def run(tree: Path, script: Path, extra: list[str]) -> dict[str, tuple[float, float]]:
    """One run of ``script`` with ``tree`` on PYTHONPATH: {row label: (per second, cpu ms per item)}."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, str(script), *extra], env=env, capture_output=True, text=True, cwd=tree
    )
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise SystemExit(f"bench_rewards.py in {tree} failed: {tail[0]}")
    rows = {}
    for line in done.stdout.splitlines():
        match = ROW.match(line.rstrip())
        if match:
            rows[match["label"].strip()] = (float(match["rate"]), float(match["cpu"]))
    return rows


def main() -> None:
    """Run both sides interleaved and print the table of ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="checkout measured first")
    parser.add_argument("after", type=Path, help="checkout compared with it")
    parser.add_argument("--reps", type=int, default=4, help="repetitions of the pair")
    parser.add_argument(
        "--script",
        choices=("own", "after"),
        default="own",
        help="whose bench_rewards.py runs: each checkout's own, or AFTER's for both",
    )
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    for name, tree in trees.items():
        if not (tree / "benchmarks" / "bench_rewards.py").is_file():
            parser.error(f"{name}: {tree} has no benchmarks/bench_rewards.py")

    runs: dict[str, list[dict[str, tuple[float, float]]]] = {"before": [], "after": []}
    for rep in range(args.reps):
        order = ("before", "after") if rep % 2 == 0 else ("after", "before")
        for name in order:
            script = (
                trees["after" if args.script == "after" else name]
                / "benchmarks"
                / "bench_rewards.py"
            )
            runs[name].append(run(trees[name], script, extra))
            print(f"rep {rep + 1}/{args.reps}: {name} done", file=sys.stderr, flush=True)

    print(f"before={trees['before']} after={trees['after']} reps={args.reps} script={args.script}")
    header = (
        f"{'verifier':<42} {'before/s':>9} {'after/s':>9} "
        f"{'rate min':>9} {'rate med':>9} {'cpu min':>8} {'cpu med':>8}"
    )
    print(header)
    for label in runs["before"][0]:
        pairs = [
            (b[label], a[label])
            for b, a in zip(runs["before"], runs["after"], strict=True)
            if label in b and label in a
        ]
        if not pairs:
            continue
        rate = [a[0] / b[0] for b, a in pairs if b[0] > 0]
        cpu = [a[1] / b[1] for b, a in pairs if b[1] > 0]
        before = statistics.median(b[0] for b, _ in pairs)
        after = statistics.median(a[0] for _, a in pairs)
        print(
            f"{label:<42} {before:>9.1f} {after:>9.1f} "
            f"{min(rate, default=float('nan')):>9.2f} "
            f"{statistics.median(rate) if rate else float('nan'):>9.2f} "
            f"{min(cpu, default=float('nan')):>8.2f} "
            f"{statistics.median(cpu) if cpu else float('nan'):>8.2f}"
        )


if __name__ == "__main__":
    main()
