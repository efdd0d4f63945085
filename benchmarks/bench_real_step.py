"""The real-LM job's training step by phase, for each recipe, engine and dtype, one after the other.

    .venv-verl/bin/python benchmarks/bench_real_step.py [--config smollm2 [smollm2_lora ...]]
        [--dtypes float32 bfloat16] [--engines vllm hf] [--steps 3] [--prompts 2] [--group-size 4]
        [--rounds 1] [-o runs/bench_real_step]

For each recipe, engine and dtype, `pivotrl train -c CONFIG` (e.g. smollm2: SmolLM2-135M warm
start, chat prompts, add_sub; smollm2_lora: the same with a LoRA adapter) runs `--steps` steps
with `rollout.engine` and `model.dtype` set, without dynamic sampling (one batch of a
fixed size a step), no evaluation and no checkpoints, each in its
own process (so each builds its own engine), one after the other; with `--rounds` N the whole
sequence runs N times (alternating the order), and each setting's figures are the median over all
its rounds' steps. The first step warms up (vLLM's
first sampling, allocator growth) and is left out; the script prints the median over the
remaining steps of each phase the trainer logs (`time/rollout_s`: sampling and rewards;
`time/forward_s`: the no-grad forwards for ℓ^old, ℓ^ref and entropies; `time/update_s`: forward,
backward and AdamW; `time/step_s`: the whole step), each setting's ratio to the first,
|ℓ^sampler − ℓ^old| (`rollout/logprob_diff`) and the training process's peak resident memory
(the largest over its rounds, from the kernel's account of the finished process: os.wait4). `model.dtype: bfloat16` keeps float32 master weights
and runs the forwards under bfloat16 autocast; vLLM samples in bfloat16.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

PHASES = ["time/rollout_s", "time/forward_s", "time/update_s", "time/step_s", "rollout/logprob_diff"]


def run_trainer(args: argparse.Namespace, config: str, engine: str, dtype: str, out: Path) -> tuple[list[dict], float]:
    """Run recipe `config` for --steps steps on `engine` in `dtype` into `out`; its metrics.jsonl rows and the
    process's peak resident memory in GB."""
    command = [
        str(Path(sys.executable).parent / "pivotrl"), "train", "-c", config, "-o", str(out), "--overwrite",
        f"model.dtype={dtype}", f"rollout.engine={engine}",
        f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group_size}",
        "rollout.dynamic_sampling=false",  # a fixed batch: refill rounds would depend on the policy's accuracy
        f"train.max_steps={args.steps}", "eval.before_after=false", "eval.every=0", "checkpoint.every=0",
    ]
    print(" ".join(command), flush=True)
    start = time.perf_counter()
    process = subprocess.Popen(command)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        raise subprocess.CalledProcessError(process.returncode, command)
    peak_gb = usage.ru_maxrss / 1024**2  # KiB on Linux
    print(f"{config} {engine} {dtype}: {time.perf_counter() - start:.0f} s for the whole command, "
          f"peak {peak_gb:.2f} GB", flush=True)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()], peak_gb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", nargs="+", default=["smollm2"], help="recipes to compare")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--steps", type=int, default=3, help="steps per dtype, the first left out")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--engines", nargs="+", default=["vllm"], choices=["hf", "vllm"])
    parser.add_argument("--rounds", type=int, default=1, help="times the whole sequence runs, in alternating order")
    parser.add_argument("-o", "--output-dir", type=Path, default=Path("runs/bench_real_step"))
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be at least 2: the first step is a warm-up")
    if not shutil.which("pivotrl", path=str(Path(sys.executable).parent)):
        parser.error(f"no pivotrl command beside {sys.executable}: run this with the venv's python")
    args.output_dir.mkdir(parents=True, exist_ok=True)

    settings = [(config, engine, dtype) for config in args.config for engine in args.engines for dtype in args.dtypes]
    rows: dict[tuple[str, str, str], list[dict]] = {setting: [] for setting in settings}
    peaks: dict[tuple[str, str, str], float] = dict.fromkeys(settings, 0.0)
    for round_ in range(args.rounds):
        for setting in settings if round_ % 2 == 0 else settings[::-1]:
            found, peak = run_trainer(args, *setting, args.output_dir / "-".join(setting))
            rows[setting] += found[1:]
            peaks[setting] = max(peaks[setting], peak)
    medians = {setting: {key: statistics.median(row.get(key, float("nan")) for row in found) for key in PHASES}
               for setting, found in rows.items()}

    first = settings[0]
    print(f"\n{args.prompts} prompts x {args.group_size} responses, median of steps 2-{args.steps} "
          f"over {args.rounds} round(s)")
    width = max(len(", ".join(setting)) for setting in settings) + 2
    print(f"{'recipe, engine, dtype':<{width}}" + "".join(f"{key.removeprefix('time/'):>16}" for key in PHASES[:4])
          + f"{'|l diff|':>12}{'peak':>10}")
    for setting, phase in medians.items():
        cells = "".join(f"{phase[key]:>9.2f} s x{phase[key] / medians[first][key]:<5.2f}" for key in PHASES[:4])
        print(f"{', '.join(setting):<{width}}{cells}{phase['rollout/logprob_diff']:>12.2g}{peaks[setting]:>7.2f} GB")


if __name__ == "__main__":
    main()
