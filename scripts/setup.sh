#!/usr/bin/env bash
# Create .venv (once) and install pivotrl with the tested versions from constraints.txt.
# Usage: bash scripts/setup.sh [EXTRAS]   e.g. bash scripts/setup.sh dev,trl
# torch==2.13.0 is pinned, not a CPU build: pip takes a local CPU wheel where the
# machine provides one and PyPI's default (CUDA on Linux) build elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${1:-}
if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".${extras:+[$extras]}"
