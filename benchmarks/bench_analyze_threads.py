"""`pivotrl analyze` with its default threads, with --threads 1, and as it ran before --threads existed.

    python benchmarks/bench_analyze_threads.py [--repeats 3] [--old-tree DIR | --no-old] [-- ANALYZE OPTIONS]

Runs `pivotrl analyze` (default: the docs/EXPERIMENTS.md command, `--model tiny -n 128
--perturbations 1000`; options after `--` replace it) in three conditions, interleaved and
in a rotated order each repeat: "default" (no --threads), "threads 1" (--threads 1) and
"old" (torch's default thread count: this code with --threads set to it, or, with
--old-tree, the code in DIR, e.g. `git archive 3f2af19 | tar -x -C DIR`, which set no
thread count); --no-old leaves "old" out (default and --threads 1 then alternate which
runs first). Prints each run's wall time, the ratio of each condition's median to
"threads 1"'s, and the median of the per-repeat ratios (each run against the "threads 1"
run of its own repeat, which the load of the moment affects alike).
Only the ratios mean anything on a machine shared with other jobs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENTS = ["--model", "tiny", "-n", "128", "--perturbations", "1000"]


def torch_default_threads() -> int:
    """The thread count torch picks in a fresh process (what analyze used before --threads)."""
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                         capture_output=True, text=True, check=True)
    return int(out.stdout)


def run(tree: Path, args: list[str], out: Path) -> float:
    """Wall seconds of one `pivotrl analyze` run with the code in `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pivotrl.cli", "analyze", *args, "-o", str(out)], check=True, env=env,
                   cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--old-tree", type=Path, help="A checkout of the code before --threads (default: emulate it)")
    parser.add_argument("--no-old", action="store_true", help="Only the default and --threads 1")
    parser.add_argument("analyze", nargs="*", help="analyze's options (after --)")
    args = parser.parse_args()
    options = args.analyze or EXPERIMENTS
    default_threads = torch_default_threads()
    old = ((args.old_tree.resolve(), options) if args.old_tree
           else (ROOT, [*options, "--threads", str(default_threads)]))
    conditions = {"default": (ROOT, options), "threads 1": (ROOT, [*options, "--threads", "1"]), "old": old}
    if args.no_old:
        del conditions["old"]
    print(f"{os.cpu_count()} cores, torch's default {default_threads} threads; analyze {' '.join(options)}; "
          f"old = {'the code in ' + str(old[0]) if args.old_tree else '--threads ' + str(default_threads)}"
          f"{' (left out)' if args.no_old else ''}; "
          f"load average at start {os.getloadavg()[0]:.1f}", flush=True)
    times: dict[str, list[float]] = {name: [] for name in conditions}
    names = list(conditions)
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name in names[repeat % len(names):] + names[: repeat % len(names)]:
                tree, opts = conditions[name]
                seconds = run(tree, opts, Path(tmp) / f"{repeat}-{name.replace(' ', '')}")
                times[name].append(seconds)
                print(f"repeat {repeat}: {name}: {seconds:.1f} s (load average {os.getloadavg()[0]:.1f})", flush=True)
    one = statistics.median(times["threads 1"])
    for name in names:
        median = statistics.median(times[name])
        paired = statistics.median(t / o for t, o in zip(times[name], times["threads 1"], strict=True))
        print(f"{name}: median {median:.1f} s, ratio of medians to --threads 1: {median / one:.2f}, "
              f"median of the per-repeat ratios: {paired:.2f}", flush=True)


if __name__ == "__main__":
    main()
