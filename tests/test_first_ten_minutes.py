"""What a new user meets first: the README's code, recipes by name from any folder, helpful refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_user_error, pivotrl

from pivotrl.tasks import get_task

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_readme_python_code_runs_as_written() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 1, "the README has one Python block, the library in ten lines"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)  # noqa: S102 - the README's own code
    advantage = next(v for k, v in namespace.items() if k.startswith("adv") and isinstance(v, torch.Tensor))
    assert advantage.ndim == 2 and torch.isfinite(advantage).all()


def test_a_shipped_recipe_is_named_from_any_folder(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = pivotrl("train", "--config", "grpo", "-o", str(run), "train.max_steps=2", "eval.num_problems=4",
                   "rollout.prompts_per_step=2", "rollout.group_size=2", "log.progress=false", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["estimator"] == "grpo"


def test_a_recipe_of_ones_own_inherits_a_shipped_one_by_name(tmp_path: Path) -> None:
    from pivotrl.train.config import load_config

    (tmp_path / "mine.yaml").write_text("base: grpo\ntrain:\n  max_steps: 3\n")
    config = load_config(tmp_path / "mine.yaml")
    assert config.algorithm.estimator == "grpo" and config.train.max_steps == 3
    assert load_config("configs/grpo.yaml").algorithm.estimator == "grpo"  # as the docs write it, from anywhere


def test_unknown_recipe_names_the_shipped_ones(tmp_path: Path) -> None:
    line = assert_user_error(pivotrl("train", "--config", "gpro", cwd=tmp_path), "gpro")
    assert "grpo" in line and "verl/" not in line


def test_a_key_that_belongs_in_a_section_is_suggested(tmp_path: Path) -> None:
    assert_user_error(pivotrl("train", "lr=1e-3", cwd=tmp_path), "'lr'", "did you mean 'train.lr'?")


def test_version() -> None:
    from importlib.metadata import version

    proc = pivotrl("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"pivotrl {version('pivotrl')}"


def test_compare_help_says_it_takes_overrides() -> None:
    proc = pivotrl("compare", "--help")
    assert proc.returncode == 0 and "KEY=VALUE" in proc.stdout and "overrides" in proc.stdout


def test_eval_writes_only_where_asked_and_never_over_a_file(tmp_path: Path) -> None:
    proc = pivotrl("eval", "--model", "tiny-random", "--task", "countdown", "-n", "2", "--device", "cpu",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert list(tmp_path.iterdir()) == [] and "samples_file" not in json.loads(proc.stdout)
    existing = tmp_path / "samples.jsonl"
    existing.write_text("keep me\n")
    refused = pivotrl("eval", "--model", "tiny-random", "--task", "countdown", "-n", "2", "-o", str(existing),
                      cwd=tmp_path)
    assert_user_error(refused, str(existing), "--overwrite")
    assert existing.read_text() == "keep me\n"
    replaced = pivotrl("eval", "--model", "tiny-random", "--task", "countdown", "-n", "2", "-o", str(existing),
                       "--overwrite", "--device", "cpu", cwd=tmp_path)
    assert replaced.returncode == 0, replaced.stderr
    assert json.loads(replaced.stdout)["samples_file"] == str(existing)
    assert len(existing.read_text().splitlines()) == 2


def test_a_run_folder_given_as_a_model_means_its_newest_checkpoint(tmp_path: Path) -> None:
    from pivotrl.modeling.policy import model_in_folder

    for step in (2, 10):
        (tmp_path / "run" / "checkpoints" / f"step-{step:06d}").mkdir(parents=True)
        (tmp_path / "run" / "checkpoints" / f"step-{step:06d}" / "config.json").write_text("{}")
    assert model_in_folder(str(tmp_path / "run")) == str(tmp_path / "run" / "checkpoints" / "step-000010")
    assert model_in_folder("tiny") == "tiny"
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="without a model .* and without checkpoints"):
        model_in_folder(str(tmp_path / "empty"))


def test_pretrain_refuses_a_folder_that_holds_anything(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    assert_user_error(pivotrl("pretrain", "--output-dir", str(folder), "--steps", "1"), "is not empty",
                      "--overwrite")
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]


def test_every_task_carries_a_response_length_suited_to_it() -> None:
    assert get_task("countdown").max_new_tokens == 34
    assert get_task("countdown_search").max_new_tokens == 224
    assert get_task("gsm8k").max_new_tokens >= 512 and get_task("math500").max_new_tokens >= 512
    assert get_task("aime24").max_new_tokens >= 512 and get_task("amc23").max_new_tokens >= 512
    assert get_task("file", path="x.jsonl").max_new_tokens >= 512


@pytest.mark.parametrize("top_p", [0.0, -0.5, 1.5])
def test_an_engine_refuses_top_p_outside_its_range(top_p: float) -> None:
    from pivotrl.modeling.policy import load_policy
    from pivotrl.rollout.hf import HFEngine

    model, tokenizer = load_policy("tiny-random", device="cpu")
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
        HFEngine(model, tokenizer).generate(["Use 1 2 to make 3."], 1, max_new_tokens=2, top_p=top_p)
