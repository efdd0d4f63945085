#!/usr/bin/env bash
# verl's own path with the pivotrl trainers, as deep as a CPU goes, for every configs/verl/*.yaml
# recipe (tests/verl/test_deep_path.py, in the verl venv): Hydra composition as main_ppo, verl's
# validate_config with its need_reference_policy answer, Ray + TransferQueue, the trainer's real
# constructor, the role mapping of _setup(), and one step's data path up to verl's advantage step,
# checked against an independent computation. The last line is the summary, computed from what
# the tests observed (the JSON report they write), never assumed:
#
#   verl check: <n> recipes, config valid: yes|no, ref policy: yes|no, entropies seen: yes|no
#
#   bash scripts/verl_check.sh            # extra arguments go to pytest
#
# Uses this checkout's code (PYTHONPATH=<repo>) in the venv $PIVOTRL_VERL_VENV (default
# <repo>/.venv-verl, built by scripts/verl_env.sh). Exit status: pytest's; 2 without a venv.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PIVOTRL_VERL_VENV:-$ROOT/.venv-verl}"
PY="$VENV/bin/python"
if [[ ! -x "$PY" ]]; then
    echo "verl_check.sh: no verl venv at $VENV (build it with: bash scripts/verl_env.sh)" >&2
    exit 2
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
report="$work/verl_check.json"
start=$(date +%s)

cd "$ROOT"
status=0
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PIVOTRL_VERL_CHECK_REPORT="$report" \
    "$PY" -m pytest tests/verl/test_deep_path.py -q -p no:cacheprovider "$@" || status=$?

echo "verl check took $(( $(date +%s) - start )) s (pytest exit status $status)"
"$PY" - "$report" "$ROOT/configs/verl" <<'EOF'
import json, sys
from pathlib import Path

report, config_dir = Path(sys.argv[1]), Path(sys.argv[2])
recipes = sorted(p.stem for p in config_dir.glob("*.yaml"))
results = json.loads(report.read_text())["results"] if report.exists() else {}

def seen(flag):
    ok = bool(recipes) and all(results.get(r, {}).get(flag, False) for r in recipes)
    return "yes" if ok else "no"

print(
    f"verl check: {len(recipes)} recipes, config valid: {seen('config_valid')}, "
    f"ref policy: {seen('ref_policy')}, entropies seen: {seen('entropies_seen')}"
)
EOF
exit "$status"
