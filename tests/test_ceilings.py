"""The ceiling recipe on tiny-free and `credit` on a task with free choices, run as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import pivotrl

SMALL = ["train.max_steps=2", "eval.num_problems=8", "rollout.prompts_per_step=4", "rollout.group_size=4",
         "log.progress=false"]


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["grpo", "grpo_oracle", "process_oracle"])
def test_the_ceiling_recipe_logs_where_the_credit_falls(tmp_path: Path, estimator: str) -> None:
    run = tmp_path / estimator
    proc = pivotrl("train", "-c", "lab_free", "-o", str(run), f"algorithm.estimator={estimator}", *SMALL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 2
    for step in steps:
        share = step["credit/free_share"]
        if estimator == "grpo_oracle":
            assert share == 0.0
        elif estimator == "grpo":  # GRPO's uniform credit lands where most tokens are: on the fillers
            assert share > 0.3
        assert step["tokens/free_frac"] > 0.3 and step["entropy/free_share"] > 0.5
        assert step["entropy/free_mean"] > step["entropy/decisive_mean"]


def credit(tmp_path: Path, model: str, task: str) -> tuple[dict, Path]:
    """`pivotrl credit` at the smallest size, as a user runs it: (credit.json, the output folder)."""
    out = tmp_path / "credit"
    proc = pivotrl("credit", "--model", model, "--task", task, "-n", "2", "-g", "2", "-k", "2", "--bootstrap", "20",
                   "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((out / "credit.json").read_text()), out


def test_credit_reports_the_free_tokens(tmp_path: Path) -> None:
    result, out = credit(tmp_path, "tiny-free", "countdown_free")
    free = result["free_tokens"]
    assert free["free_share"]["grpo_oracle"][1] == 0.0 and free["free_share"]["grpo"][1] > 0.3
    assert {"grpo_oracle", "process_oracle"} <= set(result["estimators"])
    assert set(free["advantage_true"]) == {"free", "decisive"}
    assert free["advantage_true"]["free"]["positions"] > 0
    flags = [p["free"] for p in result["positions"]]
    assert any(flags) and not all(flags)
    assert "## Free tokens" in (out / "report.md").read_text()


def test_credit_without_free_choices_leaves_out_the_oracle_that_needs_them(tmp_path: Path) -> None:
    result, _ = credit(tmp_path, "tiny", "countdown")
    assert "grpo_oracle" not in result["estimators"] and "process_oracle" in result["estimators"]
    assert "free_tokens" not in result and "free" not in result["positions"][0]


def test_an_oracle_on_a_task_without_its_marks_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    from cli_helpers import assert_user_error

    proc = pivotrl("train", "-c", "smoke", "-o", str(tmp_path / "run"), "algorithm.estimator=grpo_oracle")
    assert_user_error(proc, "grpo_oracle", "free_mask", "countdown")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
