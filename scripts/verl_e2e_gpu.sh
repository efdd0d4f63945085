#!/usr/bin/env bash
# verl's own trainer, end to end, on one GPU: `python -m verl.trainer.main_ppo` for 2 steps with
# pivotrl's EP-GRPO (algorithm.adv_estimator=pivotrl_ep_grpo, trainer.v1.trainer_mode=pivotrl_sync),
# vLLM rollout and FSDP workers, on pivotrl's tiny Llama (0.9 M parameters, written to a temp
# dir with tests/verl/tiny_verl.py) and a tiny countdown parquet set. The recipe is
# configs/verl/ep_grpo_qwen2.5_math_1.5b.yaml, resized on the command line.
#
# The pivotrl trainer writes one JSON line per advantage step to $PIVOTRL_VERL_PROBE: the masked
# sums of the batch's entropy / old_log_probs / ref_log_prob as verl's workers wrote them to the
# TransferQueue, and of the tensors the estimator call actually received. The last line, from
# scripts/verl_e2e_summary.py (which says what "yes" takes), is:
#
#   verl e2e: <steps> steps, estimator pivotrl_ep_grpo, entropies seen: yes|no, ref policy: yes|no
#
# Without torch, CUDA, vllm or verl it prints one line, "verl e2e: skipped: <reason>", and exits 0.
#
#   bash scripts/verl_e2e_gpu.sh                  # extra arguments are Hydra overrides for main_ppo
#
# Environment: PYTHON (default: $PIVOTRL_VERL_VENV/bin/python, else <repo>/.venv-verl/bin/python,
# else python3) must have verl 0.9.1 with its vllm extra and pivotrl; PIVOTRL_VERL_E2E_TIMEOUT
# (seconds, default 1200); PIVOTRL_VERL_E2E_KEEP=1 keeps the work dir.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
    for candidate in "${PIVOTRL_VERL_VENV:+$PIVOTRL_VERL_VENV/bin/python}" "$ROOT/.venv-verl/bin/python"; do
        if [[ -n "$candidate" && -x "$candidate" ]]; then PYTHON="$candidate"; break; fi
    done
    PYTHON="${PYTHON:-python3}"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

# main_ppo's overrides for a work dir $1 holding tiny_verl.py's model/, train.parquet, val.parquet
overrides() {
    local work="$1"
    printf '%s\n' \
        --config-path="$ROOT/configs/verl" --config-name=ep_grpo_qwen2.5_math_1.5b \
        algorithm.adv_estimator=pivotrl_ep_grpo \
        trainer.v1.trainer_mode=pivotrl_sync \
        actor_rollout_ref.rollout.name=vllm \
        actor_rollout_ref.model.path="$work/model" \
        +actor_rollout_ref.model.override_config.attn_implementation=sdpa \
        actor_rollout_ref.model.use_remove_padding=false \
        actor_rollout_ref.model.enable_gradient_checkpointing=false \
        data.train_files="$work/train.parquet" \
        data.val_files="$work/val.parquet" \
        data.train_batch_size=4 \
        data.max_prompt_length=64 \
        data.max_response_length=48 \
        data.dataloader_num_workers=0 \
        actor_rollout_ref.actor.ppo_mini_batch_size=4 \
        actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096 \
        actor_rollout_ref.actor.optim.lr=1e-4 \
        actor_rollout_ref.ref.fsdp_config.param_offload=false \
        actor_rollout_ref.rollout.n=4 \
        actor_rollout_ref.rollout.gpu_memory_utilization=0.3 \
        actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=4096 \
        reward.custom_reward_function.path="$ROOT/tests/verl/tiny_verl.py" \
        trainer.n_gpus_per_node=1 \
        trainer.nnodes=1 \
        trainer.total_epochs=1 \
        trainer.total_training_steps="$STEPS" \
        trainer.save_freq=-1 \
        trainer.test_freq=-1 \
        trainer.val_before_train=false \
        'trainer.logger=[console]' \
        trainer.experiment_name=verl_e2e_gpu \
        trainer.default_local_dir="$work/checkpoints"
}
STEPS=2

# `--print-overrides WORK_DIR`: print them, one per line, and stop (tests/verl checks them on the CPU)
if [[ "${1:-}" == "--print-overrides" ]]; then
    overrides "${2:?--print-overrides needs a work dir}"
    exit 0
fi

skip() {
    echo "verl e2e: skipped: $1"
    exit 0
}
"$PYTHON" -c "import torch" 2>/dev/null || skip "torch is not importable by $PYTHON"
"$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null \
    || skip "no CUDA device (torch.cuda.is_available() is False for $PYTHON)"
"$PYTHON" -c "import vllm" 2>/dev/null || skip "vllm is not importable by $PYTHON (pip install 'verl[vllm]==0.9.1')"
"$PYTHON" -c "import verl, transfer_queue" 2>/dev/null || skip "verl 0.9.1 with TransferQueue is not importable by $PYTHON"

work="$(mktemp -d)"
if [[ "${PIVOTRL_VERL_E2E_KEEP:-0}" != "1" ]]; then trap 'rm -rf "$work"' EXIT; fi
probe="$work/probe.jsonl"
log="$work/main_ppo.log"
start=$(date +%s)

"$PYTHON" "$ROOT/tests/verl/tiny_verl.py" "$work" --train 16 --val 8 >/dev/null

mapfile -t args < <(overrides "$work")
status=0
PIVOTRL_VERL_PROBE="$probe" timeout "${PIVOTRL_VERL_E2E_TIMEOUT:-1200}" \
    "$PYTHON" -m verl.trainer.main_ppo "${args[@]}" "$@" >"$log" 2>&1 || status=$?

if [[ $status -ne 0 ]]; then
    tail -n 60 "$log"
    echo "verl_e2e_gpu.sh: main_ppo exited with status $status (log: $log; PIVOTRL_VERL_E2E_KEEP=1 keeps it)"
fi
echo "verl e2e took $(( $(date +%s) - start )) s"
"$PYTHON" "$ROOT/scripts/verl_e2e_summary.py" "$probe" || status=$?
exit "$status"
