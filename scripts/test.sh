#!/usr/bin/env bash
# Set up .venv with the test extras and run the test suite (extra arguments go to pytest),
# then the verl integration tests in their own venv (.venv-verl: verl 0.9.1 needs
# transformers < 5.11), ending with scripts/verl_check.sh (verl's own start-up and
# advantage step for every configs/verl recipe). PIVOTRL_SKIP_VERL=1 skips the verl part.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,trl
.venv/bin/python -m pytest "$@"
if [ "${PIVOTRL_SKIP_VERL:-0}" != "1" ]; then
  bash scripts/verl_env.sh
  .venv-verl/bin/python -m pytest tests/verl -q --ignore=tests/verl/test_deep_path.py
  bash scripts/verl_check.sh
fi
