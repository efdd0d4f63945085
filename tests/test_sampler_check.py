"""The sampler check: ℓ^sampler from the hf engine equals the trainer's ℓ^old, and a stale or wrong sampler stops the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pivotrl.errors import SamplerMismatch, TrainingAborted
from pivotrl.modeling.policy import frozen_copy
from pivotrl.modeling.tiny import build_tiny_model
from pivotrl.modeling.tokenizer import build_char_tokenizer
from pivotrl.rollout import concat_rollouts, select_rows
from pivotrl.rollout.forward import response_logprobs
from pivotrl.rollout.hf import HFEngine
from pivotrl.train.config import load_config
from pivotrl.train.recipes import recipe_path
from pivotrl.train.sampler_check import SamplerCheck, logprob_diff
from pivotrl.train.trainer import Trainer

PROMPTS = ["Use 3 5 7 to make 8", "Use 1 2 to make 3", "Use 9 to make 9"]


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def policy():
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=2)
    return model, tokenizer


def test_logprob_diff_is_the_mean_absolute_gap_over_response_tokens() -> None:
    g = torch.Generator().manual_seed(0)
    sampler, old = torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g, dtype=torch.float64)
    mask = torch.rand(5, 7, generator=g) > 0.4
    sampler[~mask] = float("nan")  # padding values never count
    gaps = [abs(float(sampler[i, t]) - float(old[i, t])) for i in range(5) for t in range(7) if mask[i, t]]
    assert logprob_diff(sampler, old, mask) == pytest.approx(sum(gaps) / len(gaps), rel=1e-6)
    assert logprob_diff(sampler, old, torch.zeros_like(mask)) == 0.0


def test_the_check_counts_consecutive_steps_above_the_bound() -> None:
    check = SamplerCheck(0.1, patience=3)
    for step, diff in enumerate([0.5, 0.5, 0.01, 0.5, 0.5], start=1):  # a step below the bound restarts the count
        check.observe(diff, step)
    with pytest.raises(SamplerMismatch, match=r"rollout\.max_logprob_diff = 0\.1 for 3 consecutive") as err:
        check.observe(float("nan"), 6)  # NaN counts as above
    assert isinstance(err.value, TrainingAborted)  # the CLI reports TrainingAborted with exit code 2
    assert "rollout.logprob_diff_patience = 3" in str(err.value)
    off = SamplerCheck(None, patience=1)
    for step in range(5):
        off.observe(1e9, step)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (0.0, 1.0)])
def test_hf_sampler_logprobs_equal_the_trainer_forward(policy, temperature: float, top_p: float) -> None:
    model, tokenizer = policy
    rollout = HFEngine(model, tokenizer).generate(PROMPTS, 3, max_new_tokens=10, temperature=temperature,
                                                  top_p=top_p, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        old, _ = response_logprobs(model, rollout, temperature=temperature)
    mask = rollout.response_mask
    assert rollout.sampler_logprobs.shape == mask.shape and torch.all(rollout.sampler_logprobs[~mask] == 0)
    torch.testing.assert_close(rollout.sampler_logprobs[mask], old[mask], rtol=0, atol=1e-5)


def test_hf_sampler_logprobs_under_top_p_are_renormalised_on_the_nucleus(policy) -> None:
    model, tokenizer = policy
    rollout = HFEngine(model, tokenizer).generate(PROMPTS, 3, max_new_tokens=8, temperature=0.8, top_p=0.5,
                                                  generator=torch.Generator().manual_seed(5))
    # independent: each position's full logits from one forward of prompt + response, nucleus by a loop
    ids = torch.cat([rollout.prompt_ids, rollout.response_ids], dim=1)
    attention = torch.cat([rollout.prompt_mask, rollout.response_mask], dim=1).long()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention,
                       position_ids=(attention.cumsum(1) - 1).clamp(min=0)).logits
    width = rollout.prompt_ids.shape[1]
    for i in range(ids.shape[0]):
        for t in range(int(rollout.response_mask[i].sum())):
            probs = torch.softmax(logits[i, width - 1 + t].double() / 0.8, dim=-1)
            kept, mass = [], 0.0
            for j in probs.argsort(descending=True).tolist():
                kept.append(j)
                mass += float(probs[j])
                if mass >= 0.5:
                    break
            token = int(rollout.response_ids[i, t])
            assert token in kept
            expected = float(probs[token].log()) - torch.tensor(mass, dtype=torch.float64).log().item()
            assert float(rollout.sampler_logprobs[i, t]) == pytest.approx(expected, abs=1e-5)


def test_select_and_concat_carry_the_sampler_logprobs(policy) -> None:
    model, tokenizer = policy
    engine = HFEngine(model, tokenizer)
    a = engine.generate(PROMPTS[:2], 2, max_new_tokens=5, generator=torch.Generator().manual_seed(0))
    b = engine.generate(PROMPTS[2:], 2, max_new_tokens=9, generator=torch.Generator().manual_seed(1))
    both = concat_rollouts([a, b], tokenizer.pad_token_id)
    assert both.sampler_logprobs.shape == both.response_ids.shape
    torch.testing.assert_close(both.sampler_logprobs[:4, : a.response_ids.shape[1]], a.sampler_logprobs)
    torch.testing.assert_close(both.sampler_logprobs[4:, : b.response_ids.shape[1]], b.sampler_logprobs)
    assert torch.all(both.sampler_logprobs[~both.response_mask] == 0)
    picked = select_rows(both, torch.tensor([4, 5]))
    torch.testing.assert_close(picked.sampler_logprobs, both.sampler_logprobs[4:])


@pytest.mark.slow
def test_smoke_cli_logs_a_zero_logprob_diff_at_every_step(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "pivotrl.cli", "train", "--config", str(recipe_path("smoke")), "--output-dir",
           str(tmp_path), "train.max_steps=3"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONHASHSEED": "0"})
    assert done.returncode == 0, done.stderr
    diffs = [r["rollout/logprob_diff"] for r in read_metrics(tmp_path)]
    assert len(diffs) == 3 and all(0 <= d < 1e-4 for d in diffs), diffs


def test_a_sampler_with_other_weights_stops_the_run_after_the_patience(tmp_path: Path) -> None:
    cfg = load_config(recipe_path("smoke"), [f"output_dir={tmp_path}", "train.max_steps=6", "eval.before_after=false",
                                             "rollout.logprob_diff_patience=3", "checkpoint.every=1"])
    trainer = Trainer(cfg)
    # a real second model: same architecture, other initial weights
    other = build_tiny_model(trainer.tokenizer, seed=1, **cfg.model.arch).to(trainer.device)
    trainer.engine = HFEngine(other, trainer.tokenizer)
    with pytest.raises(SamplerMismatch, match=r"above rollout\.max_logprob_diff = 0\.02 for 3 consecutive steps"):
        trainer.run()
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2]  # step 3 is the third above the bound: it aborts, unlogged
    assert all(r["rollout/logprob_diff"] > 0.02 for r in records)


@pytest.mark.slow
def test_a_stale_sampler_is_caught_and_a_synced_one_is_not(tmp_path: Path) -> None:
    # the failure of issue 11: an engine that never receives the trained weights
    overrides = ["train.max_steps=8", "eval.before_after=false", "checkpoint.every=0", "train.lr=1e-3",
                 "train.warmup_steps=1", "rollout.prompts_per_step=8", "train.num_threads=1", "log.progress=false"]
    synced = Trainer(load_config(recipe_path("default"), [f"output_dir={tmp_path / 'synced'}", *overrides]))
    synced.run()
    assert all(r["rollout/logprob_diff"] < 1e-4 for r in read_metrics(tmp_path / "synced"))
    stale = Trainer(load_config(recipe_path("default"), [f"output_dir={tmp_path / 'stale'}", *overrides]))
    stale.engine = HFEngine(frozen_copy(stale.model), stale.tokenizer)
    with pytest.raises(SamplerMismatch):
        stale.run()
    diffs = [r["rollout/logprob_diff"] for r in read_metrics(tmp_path / "stale")]
    assert diffs[0] < 1e-4  # the first rollout still matches: nothing was trained yet
    assert len(diffs) < 7 and diffs[-1] > 0.02


def test_resume_continues_the_streak_instead_of_restarting_it(tmp_path: Path) -> None:
    overrides = [f"output_dir={tmp_path}", "eval.before_after=false", "rollout.logprob_diff_patience=3",
                 "checkpoint.every=1"]
    first = Trainer(load_config(recipe_path("smoke"), [*overrides, "train.max_steps=2"]))
    first.engine = HFEngine(build_tiny_model(first.tokenizer, seed=1, **first.config.model.arch).to(first.device),
                            first.tokenizer)
    first.run()  # two steps above the bound: a streak of 2, saved with step 2
    assert first.sampler_check.streak == 2
    again = Trainer(load_config(recipe_path("smoke"), [*overrides, "train.max_steps=6"]), resume=True)
    assert again.sampler_check.streak == 2
    again.engine = HFEngine(build_tiny_model(again.tokenizer, seed=1, **again.config.model.arch).to(again.device),
                            again.tokenizer)
    with pytest.raises(SamplerMismatch, match="for 3 consecutive steps"):
        again.run()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]  # step 3, the third in a row, aborts
