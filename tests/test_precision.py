"""model.dtype=bfloat16: float32 master weights, bfloat16 compute (autocast), the sampler check's bound by dtype."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pivotrl.modeling.devices import cpu_has_fast_bf16
from pivotrl.modeling.policy import compute_precision, load_policy
from pivotrl.rollout.forward import response_logprobs_no_grad
from pivotrl.rollout.hf import HFEngine
from pivotrl.tasks import get_task
from pivotrl.train.checks import check_run
from pivotrl.train.config import load_config
from pivotrl.train.recipes import recipe_path
from pivotrl.train.sampler_check import AUTO_BOUNDS, logprob_diff, sampler_bound
from pivotrl.train.trainer import Trainer


def test_compute_precision_runs_matmuls_in_bf16_and_leaves_weights_float32() -> None:
    linear = torch.nn.Linear(8, 4)
    x = torch.randn(2, 8)
    with compute_precision(torch.device("cpu"), "bfloat16"):
        assert linear(x).dtype == torch.bfloat16
    with compute_precision(torch.device("cpu"), "float32"):
        assert linear(x).dtype == torch.float32
    assert linear.weight.dtype == torch.float32


def test_bf16_training_keeps_float32_weights_that_move_and_logs_the_sampler_check(tmp_path: Path) -> None:
    cfg = load_config(recipe_path("smoke"), [f"output_dir={tmp_path}", "model.name_or_path=tiny", "model.arch={}",
                                             "model.dtype=bfloat16", "train.max_steps=2", "eval.before_after=false",
                                             "train.lr=1e-5", "rollout.prompts_per_step=8", "rollout.max_new_tokens=34"])
    trainer = Trainer(cfg)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    with trainer.console.capture() as header:
        trainer.run()
    assert "float32 on cpu, bfloat16 compute" in header.get()
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    moved = sum(int((p.detach() != before[n]).sum()) for n, p in trainer.model.named_parameters())
    # a step of lr 1e-5 moves about every float32 weight; in bfloat16 weights most would round back
    assert moved / sum(p.numel() for p in before.values()) > 0.9
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any(r["reward/std"] > 0 for r in records)  # there was something to learn
    diffs = [r["rollout/logprob_diff"] for r in records]
    assert len(diffs) == 2 and all(d < AUTO_BOUNDS["bfloat16"] for d in diffs), diffs


def test_the_hf_engine_samples_in_the_dtype_the_trainer_scores_in() -> None:
    """Sampler and trainer both in bfloat16: their log-probs agree to bf16 rounding; scored in float32
    instead, the gap is larger (what the sampler check would see from a precision mismatch)."""
    model, tokenizer = load_policy("tiny", device="cpu")
    task = get_task("countdown")
    rollout = HFEngine(model, tokenizer, dtype="bfloat16").generate(
        [task.format_prompt(p) for p in task.problems("test", limit=8)], 4, max_new_tokens=34,
        generator=torch.Generator().manual_seed(0))

    def gap(dtype: str) -> float:
        with compute_precision(torch.device("cpu"), dtype):
            old, _ = response_logprobs_no_grad(model, rollout, temperature=1.0, chunk_size=1024, entropies=False)
        return logprob_diff(rollout.sampler_logprobs, old, rollout.response_mask)

    same, mixed = gap("bfloat16"), gap("float32")
    assert same < AUTO_BOUNDS["bfloat16"] and same < mixed, (same, mixed)


def test_auto_bound_follows_the_dtype_and_a_number_or_null_is_kept() -> None:
    assert sampler_bound("auto", "float32") == 0.02 and sampler_bound("auto", "bfloat16") == 0.1
    assert sampler_bound(0.5, "bfloat16") == 0.5 and sampler_bound(None, "float32") is None


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_bf16_on_a_cpu_without_native_bf16_is_warned_about(tmp_path: Path, dtype: str) -> None:
    cfg = load_config(recipe_path("smoke"), [f"output_dir={tmp_path}", f"model.dtype={dtype}", "model.device=cpu"])
    warned = any("AVX512-BF16" in w for w in check_run(cfg).warnings)
    assert warned == (dtype == "bfloat16" and not cpu_has_fast_bf16())
