"""GPU layer: the vLLM engine follows the policy, on a real GPU (skips with the reason where there is none).

Run by scripts/gpu_check.sh; here, without CUDA or vllm, every test skips.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pivotrl.train.recipes import recipe_path

HAS_CUDA = torch.cuda.is_available()
HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU visible to torch")
needs_vllm = pytest.mark.skipif(not (HAS_CUDA and HAS_VLLM), reason=(
    "no CUDA GPU visible to torch" if not HAS_CUDA else "vllm is not installed (pip install 'pivotrl[vllm]')"))
pytestmark = pytest.mark.gpu

PROMPTS = ["Use 3 5 7 to make 8", "Use 1 2 to make 3", "Use 9 to make 9", "Use 2 2 to make 4"]


def train_smoke(out: Path, *overrides: str) -> list[dict]:
    """3 smoke steps through the real CLI on the GPU; the metrics it logged."""
    cmd = [sys.executable, "-m", "pivotrl.cli", "train", "--config", str(recipe_path("smoke")), "--output-dir",
           str(out), "train.max_steps=3", "model.device=cuda", *overrides]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONHASHSEED": "0"})
    assert done.returncode == 0, done.stderr[-4000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    if os.environ.get("PIVOTRL_GPU_DIFFS"):  # scripts/gpu_check.sh reports the largest
        with open(os.environ["PIVOTRL_GPU_DIFFS"], "a") as f:
            f.writelines(f"{r['rollout/logprob_diff']}\n" for r in records)
    return records


@needs_vllm
def test_vllm_smoke_logprob_diff_stays_small(tmp_path: Path) -> None:
    records = train_smoke(tmp_path, "rollout.engine=vllm")
    diffs = [r["rollout/logprob_diff"] for r in records]
    print(f"rollout/logprob_diff (vllm, float32): {diffs}")
    assert len(diffs) == 3 and all(d < 1e-2 for d in diffs), diffs


@needs_cuda
def test_hf_smoke_on_cuda_logprob_diff_is_zero(tmp_path: Path) -> None:
    diffs = [r["rollout/logprob_diff"] for r in train_smoke(tmp_path, "eval.before_after=false")]
    assert len(diffs) == 3 and all(d < 1e-4 for d in diffs), diffs


@needs_vllm
def test_vllm_engine_samples_the_synced_weights_and_only_those() -> None:
    from pivotrl.modeling.tiny import build_tiny_model
    from pivotrl.modeling.tokenizer import build_char_tokenizer
    from pivotrl.rollout.base import left_pad, tokenize_prompts
    from pivotrl.rollout.forward import response_logprobs
    from pivotrl.rollout.vllm import VLLMEngine
    from pivotrl.train.sampler_check import logprob_diff

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, seed=0, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=2).cuda()
    engine = VLLMEngine(model, tokenizer, gpu_memory_utilization=0.2, seed=0)

    def diff_now() -> float:
        rollout = engine.generate(PROMPTS, 4, max_new_tokens=24, temperature=1.0)
        ids, mask = left_pad(tokenize_prompts(tokenizer, PROMPTS, None), tokenizer.pad_token_id)
        assert torch.equal(rollout.prompt_ids.cpu(), ids.repeat_interleave(4, 0))  # the engine ran our tokens
        assert torch.equal(rollout.prompt_mask.cpu(), mask.repeat_interleave(4, 0))
        with torch.no_grad():
            old, _ = response_logprobs(model, rollout)
        return logprob_diff(rollout.sampler_logprobs, old, rollout.response_mask)

    synced = diff_now()
    with torch.no_grad():  # an update the engine has not seen
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    stale = diff_now()
    engine.sync_weights()
    resynced = diff_now()
    print(f"logprob_diff synced {synced:.2e}, stale {stale:.2e}, re-synced {resynced:.2e}")
    assert synced < 1e-3 and resynced < 1e-3
    assert stale > 0.05


@needs_vllm
def test_credit_runs_on_the_vllm_engine(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "pivotrl.cli", "credit", "--model", "tiny", "--task", "countdown", "-n", "2", "-g", "2",
           "-k", "4", "--positions", "2", "--engine", "vllm", "-o", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads((tmp_path / "credit.json").read_text())
    assert result["summary"]["positions"] > 0 and "grpo" in result["estimators"]
