"""Held-out accuracy differences paired by problem, from run folders' evaluation samples.

    python scripts/heldout_paired.py RUN [RUN_B ...] [--json FILE]
    python scripts/heldout_paired.py --samples BEFORE.jsonl AFTER.jsonl [OTHER.jsonl ...] [--json FILE]

For each run: after − before, where "before" is its first evaluation (eval/step-000000_samples.jsonl)
and "after" its last, paired by problem (each problem's mean reward over its samples), with the 95%
t-interval over problems. With several runs, also each run's final accuracy minus the first run's,
paired by problem: the runs of one recipe evaluate the same problems, so the problem-to-problem
spread cancels, and their draws come from one random stream (the trainer's EVAL_SEED, on both engines).
The interval covers the
evaluation's sampling, not the training's seed-to-seed spread: one run per method says nothing
about the latter.

--samples pairs sample files written by `pivotrl eval -o FILE` (or a run's eval/ files) instead:
each file after the first minus the first, paired by problem; the files must cover the same
problems.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from pivotrl.analysis.paired import paired_difference


def per_problem(samples: Path) -> dict[int, float]:
    """Each problem's mean reward over its samples in one evaluation's samples file."""
    rewards: dict[int, list[float]] = defaultdict(list)
    for line in samples.read_text().splitlines():
        record = json.loads(line)
        rewards[record["problem"]].append(float(record["reward"]))
    return {problem: sum(r) / len(r) for problem, r in rewards.items()}


def evaluations(run: Path) -> list[Path]:
    """The run's evaluation samples files, in step order."""
    found = sorted((run / "eval").glob("step-*_samples.jsonl"))
    if len(found) < 2:
        raise SystemExit(f"{run}: needs a first and a last evaluation in eval/ (found {len(found)})")
    return found


def line(label: str, d) -> dict:
    print(f"{label}: {d.mean:+.4f} [{d.low:+.4f}, {d.high:+.4f}] over {d.seeds} problems (p = {d.p_value:.2g})")
    return {"label": label, "mean": d.mean, "low": d.low, "high": d.high, "problems": d.seeds, "p": d.p_value}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", type=Path)
    parser.add_argument("--samples", nargs="+", type=Path, metavar="FILE",
                        help="pair these sample files against the first instead of run folders")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    if bool(args.runs) == bool(args.samples):
        parser.error("give run folders or --samples FILE FILE ..., not both")
    missing = [str(path) for path in args.runs + (args.samples or []) if not path.exists()]
    if missing:
        parser.error(f"not found: {', '.join(missing)}")
    out = compare_files(args.samples) if args.samples else compare_runs(args.runs)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


def compare_files(files: list[Path]) -> list[dict]:
    """Each sample file after the first minus the first, paired by problem."""
    if len(files) < 2:
        raise SystemExit("--samples needs at least two files")
    base = per_problem(files[0])
    out = []
    for path in files:
        rewards = per_problem(path)
        if set(rewards) != set(base):
            raise SystemExit(f"{path}: covers other problems than {files[0]}")
        print(f"{path}: accuracy {sum(rewards.values()) / len(rewards):.3f} over {len(rewards)} problems")
    for path in files[1:]:
        out.append(line(f"{path.name} - {files[0].name}", paired_difference(per_problem(path), base)))
    return out


def compare_runs(runs: list[Path]) -> list[dict]:
    """Each run's after - before, and each run's final accuracy minus the first run's."""
    out = []
    finals = {}
    for run in runs:
        first, last = evaluations(run)[0], evaluations(run)[-1]
        before, after = per_problem(first), per_problem(last)
        finals[run] = after
        print(f"{run}: accuracy {sum(before.values()) / len(before):.3f} -> {sum(after.values()) / len(after):.3f} "
              f"({first.name} -> {last.name})")
        out.append(line(f"{run.name} after - before", paired_difference(after, before)))
    base = runs[0]
    for run in runs[1:]:
        out.append(line(f"{run.name} - {base.name}, final", paired_difference(finals[run], finals[base])))
    return out


if __name__ == "__main__":
    sys.exit(main())
