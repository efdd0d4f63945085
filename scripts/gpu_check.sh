#!/usr/bin/env bash
# The checks that need a GPU, for the day one is lent:
#   1. the `gpu` tests (tests/test_gpu.py: vLLM follows the policy, logprob_diff on the smoke recipe);
#   2. a short real-model recipe: configs/gpu/qwen2.5-math-1.5b-erpo.yaml (bf16, vLLM rollouts, gradient
#      checkpointing, 4 minibatches) for 4 steps on the shipped tiny policy (nothing can be downloaded),
#      trained on countdown;
#   3. scripts/verl_e2e_gpu.sh, when it exists.
# Ends with one line: gpu check: <n> passed, <m> failed, logprob_diff max <x>
# Without a CUDA GPU it says it skipped and why, and exits 0. PYTHON overrides the interpreter.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then py=$PYTHON; elif [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if ! "$py" -c "import torch" 2>/dev/null; then
  echo "gpu check: skipped (torch is not importable from $py; set PYTHON or run scripts/setup.sh)"
  exit 0
fi
if ! "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu check: skipped (no CUDA GPU visible to torch from $py)"
  exit 0
fi
has_vllm=yes
"$py" -c "import vllm" 2>/dev/null || has_vllm=no

recipe_overrides=(model.name_or_path=tiny model.chat_template=false task.name=countdown "task.options={num_numbers: 3}"
  eval.task=null eval.before_after=false eval.every=0 checkpoint.every=0 log.progress=false train.max_steps=4
  train.lr=1e-4 rollout.prompts_per_step=16 rollout.max_new_tokens=34 rollout.max_prompt_tokens=128)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PIVOTRL_GPU_DIFFS="$work/diffs.txt"
: > "$PIVOTRL_GPU_DIFFS"
passed=0
failed=0

echo "== gpu tests"
"$py" -m pytest tests/test_gpu.py -m gpu -q -rs -p no:cacheprovider --junitxml="$work/gpu.xml"
read -r tp tf < <("$py" - "$work/gpu.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root)
tests = sum(int(s.get("tests", 0)) for s in suites)
bad = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
skipped = sum(int(s.get("skipped", 0)) for s in suites)
print(tests - bad - skipped, bad)
PY
) || { tp=0; tf=1; }
passed=$((passed + tp)); failed=$((failed + tf))

echo "== recipe: configs/gpu/qwen2.5-math-1.5b-erpo.yaml, 4 steps on the shipped tiny policy"
# The recipe's engine, dtype, gradient checkpointing, minibatches and loss; the model and task are the
# shipped tiny policy and countdown (nothing can be downloaded), with the default recipe's lr so that
# the weights move and the engine has something to follow.
if [ "$has_vllm" = yes ]; then
  if "$py" -m pivotrl.cli train --config configs/gpu/qwen2.5-math-1.5b-erpo.yaml --output-dir "$work/recipe" \
       "${recipe_overrides[@]}"; then
    "$py" -c "import json,sys; [print(json.loads(l)['rollout/logprob_diff']) for l in open(sys.argv[1])]" \
      "$work/recipe/metrics.jsonl" >> "$PIVOTRL_GPU_DIFFS"
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
  fi
else
  echo "skipped: vllm is not installed (pip install 'pivotrl[vllm]')"
fi

if [ -f scripts/verl_e2e_gpu.sh ]; then
  echo "== scripts/verl_e2e_gpu.sh"
  if bash scripts/verl_e2e_gpu.sh; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
fi

max=$("$py" -c "import sys; v=[float(x) for x in open(sys.argv[1]) if x.strip()]; print(f'{max(v):.3g}' if v else 'n/a')" "$PIVOTRL_GPU_DIFFS")
echo "gpu check: $passed passed, $failed failed, logprob_diff max $max"
[ "$failed" -eq 0 ]
