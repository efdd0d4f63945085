#!/usr/bin/env bash
# Build (or refresh) the separate virtual environment in which pivotrl's verl
# integration is tested: verl 0.9.1 pins transformers < 5.11, while the main
# venv runs transformers 5.24, so the two cannot share one environment.
#
#   bash scripts/verl_env.sh            # creates .venv-verl/ if missing, else refreshes it
#   .venv-verl/bin/python -m pytest tests/verl
#
# Idempotent: a stamp file records what was installed; a second run with the
# same script and pyproject.toml only checks that verl still imports (about 10 s).
# Environment: PIVOTRL_VERL_VENV (default <repo>/.venv-verl), PYTHON (default python3.11).
#
# The install is deliberately small: verl itself is installed without its
# dependencies, followed by exactly the packages that `import verl`,
# verl.trainer.ppo.core_algos, verl.trainer.ppo.ray_trainer and the v1 trainers
# (verl.trainer.ppo.v1) import, pinned to versions tested together. Left out on
# purpose (verl lists them, nothing here imports them): ray's [default] extra
# (dashboard), wandb, tensorboard, pylatexenc, pybind11, and every GPU extra
# (vllm, sglang, flash-attn, megatron). A GPU training install is described in
# docs/INTEGRATIONS.md.
set -euo pipefail
trap 'echo "verl_env.sh: failed (exit $?) at line $LINENO: $BASH_COMMAND" >&2' ERR

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PIVOTRL_VERL_VENV:-$ROOT/.venv-verl}"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
STAMP="$VENV/.pivotrl-verl-stamp"

# Pins: torch first (the local CPU wheel where one exists), then verl and what it imports.
TORCH_PIN="torch==2.13.0"
VERL_PIN="verl==0.9.1"
VERL_DEPS=(
    "transformers==5.10.4"      # verl 0.9.1: transformers>=5.5.3,<5.11,!=5.6.0
    "tensordict==0.10.0"        # verl 0.9.1: tensordict>=0.8.0,<=0.10.0,!=0.9.0
    "numpy==2.4.6"
    "ray==2.60.0"
    "omegaconf==2.3.1"
    "hydra-core==1.3.8"
    "codetiming==1.4.0"
    "torchdata==0.11.0"
    "datasets==4.7.0"
    "pillow==13.0.0"
    "peft==0.21.2"
    "cachetools==8.0.2"
    "fastapi==0.165.0"
    "uvicorn==0.55.0"
    "TransferQueue==0.1.11"
    "packaging==25.0"
    "pytest==9.2.0"
    "hypothesis==6.170.17"
)

want_stamp() {
    {
        sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1
        sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1
    } | tr '\n' ' '
}

start=$(date +%s)
if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$(want_stamp)" ]]; then
    if "$VENV/bin/python" -W ignore -c "import verl, pivotrl.integrations.verl" >/dev/null 2>&1; then
        echo "verl venv up to date: $VENV"
        exit 0
    fi
    echo "verl venv stamp matches but verl does not import; reinstalling"
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "creating $VENV with $PYTHON"
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check --quiet)

# torch first and alone, so nothing below can pull a CUDA build instead
"${PIP[@]}" install "$TORCH_PIN"
"${PIP[@]}" install --no-deps "$VERL_PIN"
# the constraint keeps every later resolution on the torch installed above
printf '%s\n' "$TORCH_PIN" > "$VENV/.torch-constraint.txt"
"${PIP[@]}" install -c "$VENV/.torch-constraint.txt" "${VERL_DEPS[@]}"
# pivotrl itself: editable, without its main-venv dependencies (pivotrl.algorithms needs only torch);
# reinstalled on every refresh so that the verl.plugins entry point follows pyproject.toml
"${PIP[@]}" install -c "$VENV/.torch-constraint.txt" --no-deps -e "$ROOT"

"$VENV/bin/python" -W ignore -c "import verl, verl.trainer.ppo.core_algos, pivotrl.integrations.verl; print('verl', verl.__version__, 'imports')"
want_stamp > "$STAMP"
echo "verl venv ready in $(( $(date +%s) - start )) s: $VENV"
