"""Where a run's step time goes: each phase's share of time/step_s, from metrics.jsonl.

    python scripts/phase_shares.py RUN_DIR [RUN_DIR ...]      # one line per run folder
    python scripts/phase_shares.py runs/compare/runs/*        # e.g. every run of a comparison

The phases are the trainer's (pivotrl/train/trainer.py): rollout, forward, branch, estimator,
update; each figure is the median over the run's steps of the phase's seconds over the step's,
plus the median generated and branch tokens per step.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

PHASES = ("rollout", "forward", "branch", "estimator", "update")


def shares(run: Path) -> dict[str, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in records if r.get("time/step_s") and "time/update_s" in r]
    if not steps:
        raise SystemExit(f"{run}: no step with time/ metrics in metrics.jsonl")
    out = {p: statistics.median(r.get(f"time/{p}_s", 0.0) / r["time/step_s"] for r in steps) for p in PHASES}
    out["step_s"] = statistics.median(r["time/step_s"] for r in steps)
    out["tokens"] = statistics.median(r.get("rollout/tokens_generated", 0.0) for r in steps)
    out["branch_tokens"] = statistics.median(r.get("rollout/branch_tokens", 0.0) for r in steps)
    return out


def main() -> None:
    runs = [Path(a) for a in sys.argv[1:]]
    if not runs:
        raise SystemExit(__doc__)
    print(f"{'run':<28}{'step s':>8}" + "".join(f"{p:>11}" for p in PHASES) + f"{'tokens':>9}{'branch':>9}")
    for run in runs:
        s = shares(run)
        print(f"{run.name:<28}{s['step_s']:>8.2f}" + "".join(f"{100 * s[p]:>10.1f}%" for p in PHASES)
              + f"{s['tokens']:>9,.0f}{s['branch_tokens']:>9,.0f}")


if __name__ == "__main__":
    main()
