#!/usr/bin/env bash
# Prepare .whl/ (git-ignored): the wheels pivotrl and the GPU check need that the lent GPU machine's
# fixed image lacks (its python 3.12 has torch 2.11, transformers 5.17, rich, typer, matplotlib,
# safetensors, tokenizers, accelerate, pyarrow; no pydantic, math-verify, trl or datasets; nothing
# can be installed there from a registry). scripts/gpu_check.sh installs them from .whl/ first.
# Prints the folder's size (what travels with the device call; its limit is 64 MiB in all).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
pin() { grep -E "^$1==" constraints.txt | head -1; }
wheels=(
  "$(pin pydantic)" pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
  "$(pin math-verify)" latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2
  "$(pin trl)" "$(pin datasets)" dill==0.4.1 multiprocess==0.70.19
)
rm -rf .whl && mkdir -p .whl
for w in "${wheels[@]}"; do
  "$py" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "$w" 2>&1 | grep -v "^WARNING: Location" || true
done
count=$(ls .whl/*.whl | wc -l)
[ "$count" -eq "${#wheels[@]}" ] || { echo "gpu wheels: expected ${#wheels[@]} wheels, got $count" >&2; exit 1; }
echo "gpu wheels: $count wheels in .whl/, $(du -sh .whl | cut -f1) (carry .whl to the device)"
