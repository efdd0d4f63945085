"""The real-LM job's training step by phase, in float32 and in bfloat16, side by side in one run.

    .venv-verl/bin/python benchmarks/bench_real_step.py [--config smollm2] [--dtypes float32 bfloat16]
        [--steps 3] [--prompts 2] [--group-size 4] [--engine vllm] [-o runs/bench_real_step]

For each dtype, `pivotrl train -c CONFIG` (the recipe: SmolLM2-135M warm start, chat prompts,
add_sub) runs `--steps` steps with `model.dtype` set, without dynamic sampling (one batch of a
fixed size a step), no evaluation and no checkpoints, each in its
own process (so each builds its own engine), one after the other. The first step warms up (vLLM's
first sampling, allocator growth) and is left out; the script prints the median over the
remaining steps of each phase the trainer logs (`time/rollout_s`: sampling and rewards;
`time/forward_s`: the no-grad forwards for ℓ^old, ℓ^ref and entropies; `time/update_s`: forward,
backward and AdamW; `time/step_s`: the whole step), each dtype's ratio to the first, and
|ℓ^sampler − ℓ^old| (`rollout/logprob_diff`). `model.dtype: bfloat16` keeps float32 master weights
and runs the forwards under bfloat16 autocast; vLLM samples in bfloat16.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

PHASES = ["time/rollout_s", "time/forward_s", "time/update_s", "time/step_s", "rollout/logprob_diff"]


def run_trainer(args: argparse.Namespace, dtype: str, out: Path) -> list[dict]:
    """Run the recipe for --steps steps in `dtype` into `out`; its metrics.jsonl rows."""
    command = [
        str(Path(sys.executable).parent / "pivotrl"), "train", "-c", args.config, "-o", str(out), "--overwrite",
        f"model.dtype={dtype}", f"rollout.engine={args.engine}",
        f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group_size}",
        "rollout.dynamic_sampling=false",  # a fixed batch: refill rounds would depend on the policy's accuracy
        f"train.max_steps={args.steps}", "eval.before_after=false", "eval.every=0", "checkpoint.every=0",
    ]
    print(" ".join(command), flush=True)
    start = time.perf_counter()
    subprocess.run(command, check=True)
    print(f"{dtype}: {time.perf_counter() - start:.0f} s for the whole command", flush=True)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="smollm2")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--steps", type=int, default=3, help="steps per dtype, the first left out")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--engine", default="vllm", choices=["hf", "vllm"])
    parser.add_argument("-o", "--output-dir", type=Path, default=Path("runs/bench_real_step"))
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be at least 2: the first step is a warm-up")
    if not shutil.which("pivotrl", path=str(Path(sys.executable).parent)):
        parser.error(f"no pivotrl command beside {sys.executable}: run this with the venv's python")
    args.output_dir.mkdir(parents=True, exist_ok=True)

    medians: dict[str, dict[str, float]] = {}
    for dtype in args.dtypes:
        rows = run_trainer(args, dtype, args.output_dir / dtype)[1:]
        medians[dtype] = {key: statistics.median(row.get(key, float("nan")) for row in rows) for key in PHASES}

    first = args.dtypes[0]
    print(f"\n{args.config}: {args.prompts} prompts x {args.group_size} responses, engine {args.engine}, "
          f"median of steps 2-{args.steps}")
    print(f"{'dtype':<10}" + "".join(f"{key.removeprefix('time/'):>16}" for key in PHASES[:4]) + f"{'|l diff|':>12}")
    for dtype, phase in medians.items():
        cells = "".join(f"{phase[key]:>9.2f} s x{phase[key] / medians[first][key]:<5.1f}" for key in PHASES[:4])
        print(f"{dtype:<10}{cells}{phase['rollout/logprob_diff']:>12.2g}")


if __name__ == "__main__":
    main()
