#!/usr/bin/env bash
# The GPU check, sized for the machine that is lent (one prepared run of at most 8 minutes):
#   0. installs what the machine's fixed image lacks from .whl/ (prepare it here first with
#      `bash scripts/gpu_wheels.sh`, then carry .whl to the device);
#   1. the `gpu` tests that need no vLLM (tests/test_gpu.py: the HF engine on CUDA, sampler and
#      trainer log-probs agree, the smoke recipe trains);
#   2. benchmarks/bench_gpu_step.py: a real-size step (Qwen2.5-0.5B- and 1.5B-shaped Llamas, random
#      weights, bf16, 8 x 8 responses of 512 and 2048 tokens) split into rollout / forwards /
#      estimator / updates, tokens per second and peak memory, for grpo, erpo, ep_grpo, tepo and mpo;
#      chunked vs naive log-probs at a 151,936-token vocabulary; TRL's GRPOTrainer step as a ratio;
#   3. the fast CPU tests (-m "not slow and not gpu") with the machine's torch and transformers;
#   4. where vLLM is installed: the vLLM tests, `pivotrl credit --engine vllm`, 4 steps of the 1.5B
#      recipe, and scripts/verl_e2e.sh (verl's main_ppo, 2 steps).
# Writes gpu_step.json, summary.json and logs into OUT_DIR and ends with one line: gpu check: ...
#
#   bash scripts/gpu_check.sh [OUT_DIR]     # default: $OUT when set (the device), else runs/gpu_check
#
# Without a CUDA GPU it prints one "gpu check: skipped ..." line naming what it would measure, and
# exits 0. PYTHON overrides the interpreter; GPU_CHECK_BUDGET_S (default 470) bounds the run.
set -uo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
budget=${GPU_CHECK_BUDGET_S:-470}
out=${1:-${OUT:-runs/gpu_check}}
mkdir -p "$out"
if [ -n "${PYTHON:-}" ]; then py=$PYTHON; elif [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
would="the gpu tests without vLLM, a real-size step (0.5B and 1.5B shapes, 512 and 2048 tokens, grpo erpo ep_grpo tepo mpo), chunked log-probs at a 152k vocabulary, TRL's step, the fast tests on this torch/transformers, and with vLLM its tests, credit, the 1.5B recipe and verl's main_ppo"

if ! "$py" -c "import torch" 2>/dev/null; then
  echo "gpu check: skipped (torch is not importable from $py; set PYTHON or run scripts/setup.sh); it would run $would"
  exit 0
fi
if ! "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu check: skipped (no CUDA GPU visible to torch from $py); it would run $would"
  exit 0
fi
if compgen -G ".whl/*.whl" > /dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/pivotrl-site \
    .whl/*.whl || { echo "gpu check: failed to install .whl/"; exit 1; }
  export PYTHONPATH="/tmp/pivotrl-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
"$py" -c "import pivotrl.train.trainer" || { echo "gpu check: pivotrl does not import here"; exit 1; }
has_vllm=yes
"$py" -c "import vllm" 2>/dev/null || has_vllm=no
export PIVOTRL_GPU_DIFFS="$out/diffs.txt"
: > "$PIVOTRL_GPU_DIFFS"
passed=0
failed=0

junit_counts() {  # "<passed> <failed>" from a junit xml
  "$py" - "$1" <<'PY' 2>/dev/null || echo "0 1"
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root)
tests = sum(int(s.get("tests", 0)) for s in suites)
bad = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
skipped = sum(int(s.get("skipped", 0)) for s in suites)
print(tests - bad - skipped, bad)
PY
}

echo "== 1. gpu tests"
"$py" -m pytest tests/test_gpu.py -m gpu -q -rs -p no:cacheprovider --junitxml="$out/gpu_tests.xml" 2>&1 | tee "$out/gpu_tests.log"
read -r tp tf < <(junit_counts "$out/gpu_tests.xml")
passed=$((passed + tp)); failed=$((failed + tf))

echo "== 2. real-size step"
left=$((budget - (SECONDS - started) - 100))  # 100 s kept for the fast tests
"$py" benchmarks/bench_gpu_step.py --out "$out/gpu_step.json" --budget-s "$left" 2>&1 | tee "$out/gpu_step.log"
step_line=$(grep "^gpu step:" "$out/gpu_step.log" | tail -1)
[ -n "$step_line" ] || failed=$((failed + 1))

echo "== 3. fast tests on $("$py" -c 'import torch, transformers; print(f"torch {torch.__version__}, transformers {transformers.__version__}")')"
left=$((budget - (SECONDS - started)))
compat="not run (no time left)"
if [ "$left" -gt 30 ]; then
  workers=$("$py" -c "import os; print(max(1, min(12, (os.cpu_count() or 2) - 2)))")
  xdist=()
  "$py" -c "import xdist" 2>/dev/null && xdist=(-n "$workers")
  # SIGINT at the limit: pytest stops and still writes the report of the tests that ran
  timeout -s INT "$left" "$py" -m pytest tests -m "not slow and not gpu" --ignore=tests/verl -q -p no:cacheprovider \
    "${xdist[@]}" --junitxml="$out/fast_tests.xml" > "$out/fast_tests.log" 2>&1
  read -r cp cf < <(junit_counts "$out/fast_tests.xml")
  compat="$cp passed, $cf failed"
  tail -5 "$out/fast_tests.log"
fi

if [ "$has_vllm" = yes ]; then
  echo "== 4. vLLM: the 1.5B recipe on the shipped tiny policy, 4 steps"
  if "$py" -m pivotrl.cli train --config configs/gpu/qwen2.5-math-1.5b-erpo.yaml --output-dir "$out/recipe" \
       model.name_or_path=tiny model.chat_template=false task.name=countdown "task.options={num_numbers: 3}" \
       eval.task=null eval.before_after=false eval.every=0 checkpoint.every=0 log.progress=false train.max_steps=4 \
       train.lr=1e-4 rollout.prompts_per_step=16 rollout.max_new_tokens=34 rollout.max_prompt_tokens=128; then
    "$py" -c "import json,sys; [print(json.loads(l)['rollout/logprob_diff']) for l in open(sys.argv[1])]" \
      "$out/recipe/metrics.jsonl" >> "$PIVOTRL_GPU_DIFFS"
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
  fi
  if [ -f scripts/verl_e2e.sh ]; then
    echo "== 4. scripts/verl_e2e.sh"
    if bash scripts/verl_e2e.sh; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
  fi
else
  echo "== 4. vLLM parts skipped: vllm is not installed (pip install 'pivotrl[vllm]')"
fi

max=$("$py" -c "import sys; v=[float(x) for x in open(sys.argv[1]) if x.strip()]; print(f'{max(v):.3g}' if v else 'n/a')" "$PIVOTRL_GPU_DIFFS")
line="gpu check: $passed passed, $failed failed, logprob_diff max $max; fast tests: $compat; vllm: $has_vllm; $((SECONDS - started)) s; ${step_line:-gpu step: not measured}"
"$py" -c "import json, sys; json.dump({'summary': sys.argv[1]}, open(sys.argv[2], 'w'))" "$line" "$out/summary.json"
echo "$line"
[ "$failed" -eq 0 ]
