"""train.num_threads 1 vs 2 for the main job, with and without another process holding a core.

    python benchmarks/bench_threads.py [--steps 30] [--repeats 2] [--config configs/default.yaml] [--only busy]

Runs the main job shortened to --steps steps (no evaluation, no checkpoints), alternating
1 and 2 threads, first as the machine is, then while a busy loop (`while True: pass`)
holds one core. Prints the median step time (steps after the first 5) of every run and
the ratio 2 threads / 1 thread per condition (below 1: 2 threads are faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WARMUP = 5


def median_step_time(config: str, steps: int, threads: int, out: Path) -> float:
    """Median time/step_s of one shortened run of `config` with `threads` torch threads."""
    subprocess.run([sys.executable, "-m", "pivotrl.cli", "train", "--config", config, "--output-dir", str(out),
                    f"train.max_steps={steps}", f"train.num_threads={threads}", "eval.before_after=false",
                    "checkpoint.every=0", "log.progress=false"], check=True, stdout=subprocess.DEVNULL)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["time/step_s"] for r in records[WARMUP:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/default.yaml")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--only", choices=("as-is", "busy"), help="Measure one condition only")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores; load average at start {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        conditions = {"as-is": ["as is"], "busy": ["busy loop on one core"]}.get(
            args.only, ["as is", "busy loop on one core"])
        for condition in conditions:
            busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if condition != "as is" else None
            try:
                times: dict[int, list[float]] = {1: [], 2: []}
                for repeat in range(args.repeats):
                    for threads in (1, 2):
                        out = Path(tmp) / f"{len(times[1]) + len(times[2])}-{condition[:2]}-{threads}"
                        times[threads].append(median_step_time(args.config, args.steps, threads, out))
                        print(f"{condition}: {threads} thread(s), repeat {repeat}: {times[threads][-1]:.3f} s/step "
                              f"(load average {os.getloadavg()[0]:.1f})", flush=True)
            finally:
                if busy is not None:
                    busy.kill()
                    busy.wait()
            ratio = statistics.median(times[2]) / statistics.median(times[1])
            print(f"{condition}: median s/step 1 thread {statistics.median(times[1]):.3f}, "
                  f"2 threads {statistics.median(times[2]):.3f}; ratio 2/1 = {ratio:.2f}", flush=True)


if __name__ == "__main__":
    main()
