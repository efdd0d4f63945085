"""pivotrl pretrain --model: a pretrained model's warm start (TRL's SFTTrainer, LoRA merged), on the
shipped tiny policy given a chat template (the real SmolLM2 recipe is docs/EXPERIMENTS.md's)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_user_error, pivotrl

from pivotrl.modeling.policy import load_policy
from pivotrl.modeling.prompt_form import save_prompt_form, saved_prompt_form

pytest.importorskip("trl", reason="the warm start uses TRL's SFTTrainer (bash scripts/setup.sh dev,trl)")
pytest.importorskip("peft", reason="the warm start's LoRA needs peft (bash scripts/setup.sh dev,trl)")

from pivotrl.warm_start import RECIPE_FILE, WarmStartConfig, warm_start  # noqa: E402

#: the tiny policy was trained on ``<bos>{prompt}\n``; any chat template will do for the plumbing
CHAT = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"


@pytest.fixture(scope="module")
def chat_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped tiny policy saved with a chat template, as a folder any command takes as --model."""
    folder = tmp_path_factory.mktemp("tiny-chat")
    model, tokenizer = load_policy("tiny", device="cpu")
    tokenizer.chat_template = CHAT
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return dict(load_policy(str(folder), device="cpu")[0].state_dict())


@pytest.mark.slow
def test_the_warm_start_trains_the_linear_layers_only_and_is_reproducible(chat_tiny: Path, tmp_path: Path) -> None:
    config = WarmStartConfig(model=str(chat_tiny), task="add_sub", steps=3, batch_size=4, lr=1e-2)
    lines: list[str] = []
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        record = warm_start(config, tmp_path / run, log=lines.append)
    assert record["examples"] == 12 and record["recipe"]["lora_rank"] == 16
    assert json.loads((tmp_path / "a" / RECIPE_FILE).read_text())["recipe"]["task"] == "add_sub"
    base, a, b = weights(chat_tiny), weights(tmp_path / "a"), weights(tmp_path / "b")
    changed = {name for name in base if not torch.equal(base[name], a[name])}
    assert any("q_proj" in name for name in changed) and any("down_proj" in name for name in changed)
    assert not any("embed_tokens" in name or "norm" in name for name in changed), sorted(changed)  # LoRA: linears
    assert all(torch.equal(a[name], b[name]) for name in a)  # the recipe and seed fix the weights
    assert not list(tmp_path.glob(".*"))  # no work folders left beside the result
    assert saved_prompt_form(str(tmp_path / "a")) is True  # trained in chat form, so measured in chat form


def test_a_models_recorded_prompt_form_reaches_eval_train_and_its_checkpoints(chat_tiny: Path, tmp_path: Path) -> None:
    """A folder that records chat form is evaluated and trained in it unless told otherwise; a run's
    checkpoints record the form it trained in, so eval of the run folder uses it too."""

    def eval_form(model: str, *flags: str) -> bool:
        done = pivotrl("eval", "--model", model, "--task", "add_sub", "-n", "4", "--max-new-tokens", "4", *flags)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout)["chat"]

    assert saved_prompt_form(str(chat_tiny)) is None and eval_form(str(chat_tiny)) is False  # no record: plain
    recorded = tmp_path / "recorded"
    shutil.copytree(chat_tiny, recorded)
    save_prompt_form(recorded, chat=True)
    assert eval_form(str(recorded)) is True and eval_form(str(recorded), "--no-chat") is False
    assert eval_form(str(chat_tiny), "--chat") is True
    run = tmp_path / "run"
    done = pivotrl("train", "--config", "smoke", "-o", str(run), f"model.name_or_path={recorded}", "task.name=add_sub",
                   "train.max_steps=1", "eval.before_after=false", "algorithm.estimator=grpo")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "chat prompts" in done.stdout
    assert saved_prompt_form(str(run)) is True and eval_form(str(run)) is True


def test_pretrain_refuses_a_tiny_policy_as_the_model_to_warm_start(tmp_path: Path) -> None:
    done = pivotrl("pretrain", "--model", "tiny", "--task", "add_sub", "--output-dir", str(tmp_path / "out"))
    assert_user_error(done, "--model tiny", "--eval-only")
    assert not (tmp_path / "out").exists()


def test_a_warm_start_not_made_yet_names_the_command_that_makes_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PIVOTRL_CACHE", str(tmp_path / "cache"))
    done = pivotrl("eval", "--model", "smollm2-135m-add_sub", "--task", "add_sub", "-n", "4")
    assert_user_error(done, "pivotrl pretrain --model smollm2-135m --task add_sub")


@pytest.mark.slow
def test_a_kept_adapter_rebuilds_the_warm_start_exactly_and_says_when_it_does_not(chat_tiny: Path,
                                                                                   tmp_path: Path) -> None:
    """`pretrain --adapter`: a copy of a warm start's adapter/ rebuilds its merged weights bit for bit,
    checked against the digest recorded when it was trained; an altered adapter is merged with a warning."""
    from safetensors.torch import load_file, save_file

    config = WarmStartConfig(model=str(chat_tiny), task="add_sub", steps=2, batch_size=4, lr=1e-2)
    (tmp_path / "trained").mkdir()
    record = warm_start(config, tmp_path / "trained", log=print)
    kept = tmp_path / "kept"
    shutil.copytree(tmp_path / "trained" / "adapter", kept)
    assert json.loads((kept / RECIPE_FILE).read_text())["weights_sha256"] == record["weights_sha256"]

    done = pivotrl("pretrain", "--model", str(chat_tiny), "--task", "add_sub", "--adapter", str(kept),
                   "--output-dir", str(tmp_path / "rebuilt"), "--no-evaluate")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "identical to the trained warm start's" in done.stdout
    trained, rebuilt = weights(tmp_path / "trained"), weights(tmp_path / "rebuilt")
    assert all(torch.equal(trained[name], rebuilt[name]) for name in trained)
    assert any(not torch.equal(trained[name], weights(chat_tiny)[name]) for name in trained)  # the adapter acted
    assert saved_prompt_form(str(tmp_path / "rebuilt")) is True

    tensors = load_file(kept / "adapter_model.safetensors")
    save_file({name: t * 1.01 if "lora_B" in name else t for name, t in tensors.items()}, kept / "adapter_model.safetensors")
    altered = pivotrl("pretrain", "--model", str(chat_tiny), "--task", "add_sub", "--adapter", str(kept),
                      "--output-dir", str(tmp_path / "altered"), "--no-evaluate")
    assert altered.returncode == 0 and "WARNING: the merged weights differ" in altered.stdout

    assert_user_error(pivotrl("pretrain", "--model", str(chat_tiny), "--task", "add_sub", "--adapter", str(kept),
                              "--steps", "5", "--output-dir", str(tmp_path / "x")), "--adapter", "--steps")
    assert_user_error(pivotrl("pretrain", "--model", str(chat_tiny), "--task", "countdown", "--adapter", str(kept),
                              "--output-dir", str(tmp_path / "y")), "add_sub", "countdown")
    assert not (tmp_path / "x").exists()
