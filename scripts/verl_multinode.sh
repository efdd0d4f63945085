#!/usr/bin/env bash
# verl's own trainer across two Ray nodes on this host: scripts/verl_e2e.sh's run (main_ppo, 2
# steps, pivotrl's tiny Llama, vLLM rollout, FSDP workers) with trainer.nnodes=2
# trainer.n_gpus_per_node=1, pivotrl_<estimator> (trainer.v1.trainer_mode=pivotrl_sync) and
# pivotrl's TEPO loss (actor_rollout_ref.actor.policy_loss.loss_mode=pivotrl_tepo), on a Ray
# cluster of two nodes that scripts/verl_local_cluster.py starts on this host (each node its own
# raylet, 16 logical CPUs, one logical GPU, 1 GiB of object store) and shuts down afterwards
# (Cluster.shutdown: never `ray stop`, which would end every Ray process on the host). verl then
# places one FSDP actor worker (rank 0, rank 1) and one vLLM server on each node.
#
#   bash scripts/verl_multinode.sh [ESTIMATOR] [HYDRA_OVERRIDE ...]   # ESTIMATOR: erpo (default), ep_grpo
#
# The overrides are verl_e2e.sh's (`verl_e2e.sh --print-overrides`), less its one-node Ray settings
# (ray_init.num_cpus / num_gpus, which Ray refuses when it joins a running cluster), plus the
# lines of multinode_overrides below. The probe file reaches verl's processes on both nodes through
# the job's runtime environment (+ray_kwargs.ray_init.runtime_env.env_vars): the pivotrl trainer
# in verl's TaskRunner records each advantage step and the node each estimator call ran on, each
# actor worker records each policy-loss call with its node and rank. The last line, from
# scripts/verl_multinode_summary.py (the line before it says where each call ran), is
#
#   verl multinode: 2 nodes, 2 steps, estimator pivotrl_erpo, loss pivotrl_tepo on 2 nodes (ranks 0,1), entropies seen: yes, ref policy: yes
#
# Before any rollout, pivotrl's plugin checks in main_ppo's driver that every node loads it
# (pivotrl/integrations/verl_cluster.py); a node that does not stops the run with one line.
#
# Exit status: 0 when main_ppo ran and the summary holds (2 nodes, 2 steps, the loss on both nodes
# with ranks 0 and 1, every "yes", and verl's stored advantages recomputed from what the
# estimator received, rollout_probs_diff_mean within verl_e2e.sh's bound); 1 when it does not; 2
# for a bad argument. Where verl is not installed: "verl multinode: skipped: <reason>", exit 0;
# where verl is but something the run needs is not: "verl multinode: cannot run: <reason>", exit 3
# (the checks of verl_e2e.sh --check-inputs, before any work).
#
# Environment: PYTHON as for verl_e2e.sh; PIVOTRL_VERL_MULTINODE_TIMEOUT (seconds for the cluster
# and main_ppo, default 900); PIVOTRL_VERL_E2E_MAX_PROBS_DIFF (the bound, as for verl_e2e.sh);
# PIVOTRL_VERL_MULTINODE_WORK=<dir> runs in <dir> and keeps it (default: a temp dir, removed unless
# PIVOTRL_VERL_MULTINODE_KEEP=1). On the CPU, OMP_NUM_THREADS=1 and VLLM_ENABLE_V1_MULTIPROCESSING=0
# are exported before the nodes start, so every raylet, and every worker it starts, has them.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
E2E="$ROOT/scripts/verl_e2e.sh"
if [[ -z "${PYTHON:-}" ]]; then
    for candidate in "${PIVOTRL_VERL_VENV:+$PIVOTRL_VERL_VENV/bin/python}" \
        "$ROOT/.venv-verl/bin/python"; do
        if [[ -n "$candidate" && -x "$candidate" ]]; then PYTHON="$candidate"; break; fi
    done
    PYTHON="${PYTHON:-python3}"
fi
export PYTHON
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
NODES=2
STEPS=2
LOSS=pivotrl_tepo

# main_ppo's overrides for estimator $1, device $2 and work dir $3 (verl_e2e.sh's, for two nodes)
multinode_overrides() {
    local estimator="$1" device="$2" work="$3"
    bash "$E2E" "$estimator" --print-overrides "$device" "$work" | grep -v -E \
        '^\+?(ray_kwargs\.ray_init\.(num_cpus|num_gpus)|trainer\.(nnodes|n_gpus_per_node|experiment_name))='
    printf '%s\n' \
        trainer.nnodes="$NODES" \
        trainer.n_gpus_per_node=1 \
        ray_kwargs.ray_init.num_cpus=null \
        actor_rollout_ref.actor.policy_loss.loss_mode="$LOSS" \
        trainer.experiment_name="verl_multinode_$estimator" \
        +ray_kwargs.ray_init.runtime_env.env_vars.PIVOTRL_VERL_PROBE="$work/probe.jsonl" \
        +ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH="$work/metrics.jsonl"
}

estimator="${PIVOTRL_VERL_E2E_ESTIMATOR:-erpo}"
if [[ $# -gt 0 && "$1" != *=* && "$1" != --* ]]; then
    estimator="$1"
    shift
fi
if [[ ! -f "$ROOT/configs/verl/${estimator}_qwen2.5_math_1.5b.yaml" ]]; then
    echo "verl_multinode.sh: no recipe configs/verl/${estimator}_qwen2.5_math_1.5b.yaml" \
        "for estimator '$estimator' (erpo, ep_grpo)" >&2
    exit 2
fi

# `--print-overrides DEVICE WORK_DIR`: print them, one per line, and stop
if [[ "${1:-}" == "--print-overrides" ]]; then
    multinode_overrides "$estimator" "${2:?--print-overrides needs a device}" "${3:?and a work dir}"
    exit 0
fi

checked="$(bash "$E2E" "$estimator" --check-inputs)"
kind="${checked%% *}"
detail="${checked#* }"
case "$kind" in
    ok) device="$detail" ;;
    skip) echo "verl multinode: skipped: $detail"; exit 0 ;;
    *) echo "verl multinode: cannot run: $detail"; exit 3 ;;
esac

if [[ -n "${PIVOTRL_VERL_MULTINODE_WORK:-}" ]]; then
    work="$PIVOTRL_VERL_MULTINODE_WORK"
    mkdir -p "$work"
else
    work="$(mktemp -d)"
    if [[ "${PIVOTRL_VERL_MULTINODE_KEEP:-0}" != "1" ]]; then trap 'rm -rf "$work"' EXIT; fi
fi
log="$work/main_ppo.log"
rm -f "$work"/probe.jsonl* "$work/metrics.jsonl" "$work/nodes.jsonl"  # a reused work dir: the probes append
start=$(date +%s)

"$PYTHON" "$ROOT/tests/verl/tiny_verl.py" "$work" --train 16 --val 8 >/dev/null

if [[ "$device" == "cpu" ]]; then
    # as in verl_e2e.sh, and exported before the nodes start: their raylets pass them to every worker
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" VLLM_ENABLE_V1_MULTIPROCESSING=0
fi
mapfile -t args < <(multinode_overrides "$estimator" "$device" "$work")
status=0
timeout "${PIVOTRL_VERL_MULTINODE_TIMEOUT:-900}" \
    "$PYTHON" "$ROOT/scripts/verl_local_cluster.py" --nodes "$NODES" --num-cpus 16 --num-gpus 1 \
    --object-store-mib 1024 --nodes-file "$work/nodes.jsonl" -- \
    "$PYTHON" -m verl.trainer.main_ppo "${args[@]}" "$@" >"$log" 2>&1 || status=$?

if [[ $status -ne 0 ]]; then
    tail -n 60 "$log"
    echo "verl_multinode.sh: main_ppo exited with status $status" \
        "(log: $log; PIVOTRL_VERL_MULTINODE_KEEP=1 keeps it)"
    status=1
fi
if [[ "$device" == "cpu" ]]; then bound=1e-4; else bound=1e-2; fi
echo "verl multinode took $(( $(date +%s) - start )) s on $device"
"$PYTHON" "$ROOT/scripts/verl_multinode_summary.py" "$work" --estimator "pivotrl_$estimator" \
    --loss "$LOSS" --nodes "$NODES" --steps "$STEPS" \
    --max-probs-diff "${PIVOTRL_VERL_E2E_MAX_PROBS_DIFF:-$bound}" || status=$?
exit "$status"
