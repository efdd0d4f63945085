"""The trainer end to end on smoke.yaml: every estimator and loss, errors, NaN abort, kill and resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pivotrl.algorithms import ESTIMATORS, POLICY_LOSSES, estimator_requirements
from pivotrl.errors import ConfigError, TrainingAborted
from pivotrl.train.config import load_config
from pivotrl.train.recipes import recipe_path
from pivotrl.train.trainer import Trainer

SMOKE = recipe_path("smoke")
TIMING_KEYS = ("time/", "tokens_per_s")


def smoke(tmp_path: Path, *overrides: str):
    return load_config(SMOKE, [f"output_dir={tmp_path}", *overrides])


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def without_timings(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_KEYS)} for r in records]


@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
def test_every_estimator_runs_four_steps(tmp_path: Path, estimator: str) -> None:
    needs = estimator_requirements(estimator)
    branching = ["rollout.branch.pivots=1"] if "pivot_values" in needs else []
    free = ["task.options.free=2", "rollout.max_new_tokens=24"] if "free_mask" in needs else []
    summary = Trainer(smoke(tmp_path, f"algorithm.estimator={estimator}", "eval.before_after=false", *branching,
                            *free)).run()
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3, 4] and summary["steps"] == 4
    for key in ("reward/mean", "reward/std", "accuracy", "response_length/mean", "entropy/mean", "pivots/frac",
                "clip/frac", "kl/old_approx", "loss", "grad_norm", "time/step_s", "tokens_per_s",
                "rollout/tokens_generated"):
        assert key in records[-1], key
    assert (tmp_path / "checkpoints" / "step-000004" / "model.safetensors").is_file()


@pytest.mark.parametrize("loss", sorted(POLICY_LOSSES))
def test_every_policy_loss_runs_with_minibatches_and_epochs(tmp_path: Path, loss: str) -> None:
    cfg = smoke(tmp_path, f"algorithm.policy_loss={loss}", "algorithm.estimator=grpo", "train.ppo_epochs=2",
                "train.num_minibatches=2", "train.micro_batch_size=4", "eval.before_after=false")
    Trainer(cfg).run()
    records = read_metrics(tmp_path)
    assert len(records) == 4 and all(r["loss"] is not None for r in records)


def test_summary_and_before_after_table(tmp_path: Path) -> None:
    summary = Trainer(smoke(tmp_path)).run()
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    for key in ("heldout_accuracy_before", "heldout_accuracy_after", "mean_length_before", "mean_length_after",
                "wall_time_s"):
        assert key in on_disk and on_disk[key] is not None
    assert summary == on_disk
    samples = (tmp_path / "eval" / "step-000004_samples.jsonl").read_text().splitlines()
    assert len(samples) == 8 and {"completion", "reward", "answer"} <= set(json.loads(samples[0]))


def test_dynamic_sampling_and_overlong_shaping(tmp_path: Path) -> None:
    cfg = smoke(tmp_path, "rollout.dynamic_sampling=true", "rollout.max_resample_rounds=1",
                "rollout.overlong_shaping=true", "rollout.overlong_cache=4", "algorithm.estimator=grpo",
                "eval.before_after=false")
    Trainer(cfg).run()
    records = read_metrics(tmp_path)
    # a random model never solves countdown: every group is all-zero, dynamic sampling drops it
    assert all(r["rollout/rounds"] == 2 for r in records)
    assert all(r.get("skipped") and r["rollout/sampled_accuracy"] == 0.0 for r in records)
    assert all(r["rollout/agreeing_frac"] == 1.0 for r in records)


def test_minibatches_that_do_not_divide_the_rows_train_every_row_once(tmp_path: Path) -> None:
    # dynamic sampling keeps a varying number of groups of the shipped policy; 3 minibatches rarely divide them
    cfg = smoke(tmp_path, "model.name_or_path=tiny", "model.arch={}", "rollout.dynamic_sampling=true",
                "rollout.prompts_per_step=5", "rollout.max_new_tokens=34", "train.num_minibatches=3",
                "train.ppo_epochs=2", "algorithm.estimator=grpo", "eval.before_after=false", "train.max_steps=3")
    Trainer(cfg).run()
    records = [r for r in read_metrics(tmp_path) if not r.get("skipped")]
    assert records, "dynamic sampling kept no group in 3 steps"
    for r in records:
        assert r["train/rows_per_epoch"] == r["rollout/rows"]
        # the kept groups' solved responses are among all sampled responses' solved ones, and all-solved groups
        # were dropped, so the sampled accuracy counts at least as many solved responses
        solved_kept, sampled = r["accuracy"] * r["rollout/rows"], r["rollout/sampled_groups"] * cfg.rollout.group_size
        assert solved_kept - 1e-6 <= r["rollout/sampled_accuracy"] * sampled <= sampled - (r["rollout/rows"] - solved_kept)
        assert r["train/updates"] == 2 * min(3, r["rollout/rows"])
        # every group kept is one whose rewards differ, every group dropped one whose rewards agree
        kept = r["rollout/rows"] / cfg.rollout.group_size
        assert r["rollout/agreeing_frac"] == pytest.approx(1 - kept / r["rollout/sampled_groups"])
    assert any(r["rollout/rows"] % 3 for r in records)


def test_agreeing_groups_are_those_the_estimators_diagnostics_find_without_variance(tmp_path: Path) -> None:
    # without dynamic sampling or shaping the batch is every sampled group, and the estimator's own diagnostics
    # (algorithms/diagnostics.py, from the rewards) count the groups that agree independently of collect.py
    cfg = smoke(tmp_path, "model.name_or_path=tiny", "model.arch={}", "rollout.max_new_tokens=34",
                "algorithm.estimator=grpo", "eval.before_after=false", "train.max_steps=3")
    Trainer(cfg).run()
    records = read_metrics(tmp_path)
    assert len(records) == 3
    for r in records:
        assert r["rollout/agreeing_frac"] == pytest.approx(r["groups/zero_var_frac"])
    assert any(0 < r["rollout/agreeing_frac"] < 1 for r in records)


def test_fewer_rows_than_minibatches_still_trains(tmp_path: Path) -> None:
    cfg = smoke(tmp_path, "rollout.prompts_per_step=1", "rollout.group_size=2", "train.num_minibatches=4",
                "algorithm.estimator=grpo", "eval.before_after=false", "train.max_steps=1")
    Trainer(cfg).run()
    record = read_metrics(tmp_path)[0]
    assert record["train/rows_per_epoch"] == 2 and record["train/updates"] == 2


def test_single_forward_step_equals_the_general_loop(tmp_path: Path) -> None:
    """One epoch, one minibatch: the shared forward gives the same update as a separate no-grad forward."""
    fused = Trainer(smoke(tmp_path / "a", "train.max_steps=1", "eval.before_after=false"))
    loop = Trainer(smoke(tmp_path / "b", "train.max_steps=1", "eval.before_after=false",
                         "train.micro_batch_size=1000"))
    loop._single_forward = lambda n: False  # the same configuration through the general path
    fused.run()
    loop.run()
    for p, q in zip(fused.model.parameters(), loop.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)
    a, b = without_timings(read_metrics(tmp_path / "a")), without_timings(read_metrics(tmp_path / "b"))
    assert a[0].keys() == b[0].keys()
    for key in a[0]:
        assert a[0][key] == pytest.approx(b[0][key], rel=1e-4, abs=1e-6), key


@pytest.mark.slow
def test_tepo_recipe_fires_its_kl_mask(tmp_path: Path) -> None:
    cfg = load_config(recipe_path("tepo"), [f"output_dir={tmp_path}", "model.name_or_path=tiny", "train.max_steps=3",
                                            "eval.before_after=false", "rollout.prompts_per_step=8"])
    Trainer(cfg).run()
    assert all(r["kl/mask_frac"] > 0 for r in read_metrics(tmp_path))


def test_overlong_penalty_values() -> None:
    from pivotrl.train.rewards import overlong_penalty

    # L_max 10, L_cache 4: 0 up to 6, then (6 - L)/4, -1 beyond 10
    got = overlong_penalty(torch.tensor([3, 6, 7, 9, 10, 11]), 10, 4)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, -0.25, -0.75, -1.0, -1.0]))


@pytest.mark.parametrize("override,key", [
    ("train.max_step=3", "train.max_steps"), ("rolout.group_size=2", "rollout"),
    ("algorithm.estimator=erpoo", "algorithm.estimator"), ("algorithm.policy_loss=ppo2", "algorithm.policy_loss"),
    ("algorithm.estimator_kwargs={gama: 1}", "algorithm.estimator_kwargs"),
    ("algorithm.loss_kwargs={eps: 1}", "algorithm.loss_kwargs"), ("rollout.top_p=3", "rollout.top_p"),
    ("algorithm.policy_loss=tepo", "train.num_minibatches"), ("algorithm.loss_agg_mode=mean", "algorithm.loss_agg_mode"),
    ("model.ref_model=none", "model.ref_model"), ("train.lr=fast", "train.lr"),
])
def test_config_errors_name_their_key(tmp_path: Path, override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        cfg = smoke(tmp_path, override)
        Trainer(cfg)


def test_yaml_unknown_nested_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  seed: 1\n  warmup: 3\n")
    with pytest.raises(ConfigError, match=r"'train\.warmup'.*'train\.warmup_steps'"):
        load_config(bad)


def test_a_raising_reward_counts_zero_and_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    trainer = Trainer(smoke(tmp_path, "train.max_steps=1", "eval.before_after=false"))

    def broken(completion: str, answer: object) -> float:
        raise RuntimeError("verifier exploded")

    trainer.task.verifier = broken
    with caplog.at_level("WARNING", logger="pivotrl.rewards"):
        trainer.run()
    assert read_metrics(tmp_path)[0]["reward/mean"] == 0.0
    assert "verifier exploded" in caplog.text


def test_repeated_nan_losses_abort_and_keep_the_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pivotrl.train.update as update_module

    trainer = Trainer(smoke(tmp_path, "train.max_steps=8", "checkpoint.every=1", "eval.before_after=false",
                            "algorithm.estimator=grpo", "train.max_nan_steps=3"))
    real_loss = update_module.compute_policy_loss

    def nan_after_step_two(*args, **kwargs):
        loss, metrics = real_loss(*args, **kwargs)
        return (loss * float("nan"), metrics) if trainer.step >= 2 else (loss, metrics)

    monkeypatch.setattr(update_module, "compute_policy_loss", nan_after_step_two)
    with pytest.raises(TrainingAborted, match="3 consecutive steps with a NaN"):
        trainer.run()
    # NaN steps 3, 4, 5 skip their update; the run stops at step 5 without saving it, and the
    # checkpoints it kept (steps 3 and 4, keep=2) hold the last finite weights
    saved = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert saved == ["step-000003", "step-000004"]
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4]
    weights = load_safetensors(tmp_path / "checkpoints" / "step-000004" / "model.safetensors")
    assert all(torch.isfinite(w).all() for w in weights.values())
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


def run_cli(out: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pivotrl.cli", "train", "--config", str(SMOKE), "--output-dir", str(out),
           "train.max_steps=6", "checkpoint.every=1", "checkpoint.keep=2", "eval.num_problems=4", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "PYTHONHASHSEED": "0"})


#: a LoRA run (model.lora): the shipped tiny policy as its base, responses long enough to be scored
LORA_RUN = ("model.name_or_path=tiny", "model.arch={}", "rollout.max_new_tokens=34", "model.lora.r=4")


@pytest.mark.slow
@pytest.mark.parametrize("extra", [(), LORA_RUN], ids=["full", "lora"])
def test_sigkill_and_resume_gives_identical_metrics(tmp_path: Path, extra: tuple[str, ...]) -> None:
    if extra:
        pytest.importorskip("peft", reason="model.lora needs peft")
    reference = run_cli(tmp_path / "straight", *extra)
    assert reference.wait(timeout=300) == 0, reference.stderr.read().decode()
    victim = run_cli(tmp_path / "killed", *extra)
    deadline = time.time() + 300
    metrics = tmp_path / "killed" / "metrics.jsonl"
    while time.time() < deadline:  # kill mid-run, once three steps are logged
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert any((tmp_path / "killed" / "checkpoints").glob("step-*")), "killed before any checkpoint"
    assert not (tmp_path / "killed" / "summary.json").exists(), "the run ended before it was killed"
    resumed = run_cli(tmp_path / "killed", *extra, "--resume")
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read().decode()
    assert without_timings(read_metrics(tmp_path / "killed")) == without_timings(read_metrics(tmp_path / "straight"))
    straight = json.loads((tmp_path / "straight" / "summary.json").read_text())
    again = json.loads((tmp_path / "killed" / "summary.json").read_text())
    assert {k: v for k, v in again.items() if k != "wall_time_s"} == {k: v for k, v in straight.items() if k != "wall_time_s"}


@pytest.mark.slow
def test_every_seed_starts_from_the_same_heldout_evaluation(tmp_path: Path) -> None:
    """The evaluation samples with its own seed, so the seeds and methods of a comparison share their 'before'
    (tests/vllm_engine: the same on the vllm engine)."""
    samples = []
    for seed, method in ((0, "grpo"), (5, "erpo")):
        out = tmp_path / f"seed{seed}"
        Trainer(smoke(out, f"train.seed={seed}", f"algorithm.estimator={method}", "train.max_steps=0",
                      "eval.num_problems=16", "model.name_or_path=tiny", "task.options={num_numbers: 3}",
                      "eval.reuse_before=false")).run()
        samples.append((out / "eval" / "step-000000_samples.jsonl").read_text())
    assert samples[0] == samples[1] and samples[0]


def test_a_run_reuses_the_evaluation_before_that_another_run_drew(tmp_path: Path, capsys) -> None:
    """The second seed's 'before' comes from the cache, equals what it would draw itself, and a changed
    setting or other weights draw afresh (train/before_cache.py)."""
    base = ("train.max_steps=0", "eval.num_problems=16", "model.name_or_path=tiny", "task.options={num_numbers: 3}",
            "log.progress=false")

    def before(name: str, *overrides: str) -> str:
        Trainer(smoke(tmp_path / name, *base, *overrides)).run()
        return (tmp_path / name / "eval" / "step-000000_samples.jsonl").read_text()

    first = before("first", "train.seed=0", "eval.temperature=0.9")
    assert "the same as" not in capsys.readouterr().out
    reused = before("reused", "train.seed=3", "algorithm.estimator=erpo", "eval.temperature=0.9")
    assert "the same as" in capsys.readouterr().out
    drawn = before("drawn", "train.seed=3", "algorithm.estimator=erpo", "eval.temperature=0.9",
                   "eval.reuse_before=false")
    assert reused == first == drawn
    assert json.loads((tmp_path / "reused" / "summary.json").read_text())["heldout_accuracy_before"] == \
        json.loads((tmp_path / "drawn" / "summary.json").read_text())["heldout_accuracy_before"]
    hotter = before("hotter", "eval.temperature=1.1")
    other_weights = before("other_weights", "eval.temperature=0.9", "model.name_or_path=tiny-free")
    assert "the same as" not in capsys.readouterr().out
    assert hotter != first and other_weights != first
