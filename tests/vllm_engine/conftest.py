"""tests/vllm_engine run where vLLM is installed: on the CPU, in .venv-verl (bash scripts/verl_env.sh;
.venv-verl/bin/python -m pytest tests/vllm_engine). Elsewhere the folder is skipped at collection,
and tests/test_rollout_vllm.py checks the error a user gets instead."""

import importlib.util

if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]
