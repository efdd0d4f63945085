#!/usr/bin/env bash
# Set up .venv with the test extras and run the test suite (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
.venv/bin/python -m pytest "$@"
