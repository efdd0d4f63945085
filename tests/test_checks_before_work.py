"""Every command checks its input before any work, and every refusal is one `error:` line with exit code 2.

Classes: option ranges (the parser's errors included), devices, unknown config keys at every
depth, config files that are not YAML text, degenerate settings, and output folders.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import SMOKE, assert_user_error, pivotrl
from typer.testing import CliRunner

from pivotrl.cli import app
from pivotrl.errors import ConfigError
from pivotrl.train.checks import check_algorithm, check_config
from pivotrl.train.config import build_config, load_config
from pivotrl.train.trainer import Trainer


def invoke(*args: str) -> str:
    """The real command line, in this process: exit code 2 and exactly one line, `error: ...`; returns it."""
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 2, (args, result.output)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.stderr)
    assert "Traceback" not in result.output and "╭" not in result.output
    return lines[0]


# -- option ranges: the option parser's errors take the one-line form too ----------------------------------


@pytest.mark.parametrize("args,option", [
    (["eval", "--task", "countdown", "-k", "0"], "'-k'"),
    (["eval", "--task", "countdown", "--bogus"], "--bogus"),
    (["analyze", "-n", "-3"], "'--num-problems'"),  # was: analyzes everything but the last 3
    (["analyze", "-n", "0"], "'--num-problems'"),  # was: a traceback
    (["analyze", "--group-size", "0"], "'--group-size'"),
    (["analyze", "--perturbations", "0"], "'--perturbations'"),  # was: NaN written into pivots.json
    (["analyze", "--top-percent", "50"], "--top-percent"),
    (["analyze", "--max-new-tokens", "0"], "'--max-new-tokens'"),
    (["credit", "-g", "0"], "'--group-size'"),
    (["compare", "--seeds", "0"], "--seeds must be >= 1"),
    (["compare", "--jobs", "0"], "'--jobs'"),
    (["compare", "--methods", ","], "--methods names no method"),
    (["pretrain", "--steps", "-5"], "'--steps'"),  # was: "saves after 0 steps"
    (["pretrain", "--steps", "0"], "'--steps'"),
    (["pretrain", "--batch-size", "0"], "'--batch-size'"),
    (["pretrain", "--threads", "0"], "'--threads'"),
    (["pretrain", "--imperfect", "1.5"], "'--imperfect'"),
    (["pretrain", "--eval-n", "0", "--eval-only"], "'--eval-n'"),
    (["pretrain", "--minutes", "0"], "--minutes"),
    (["pretrain", "--lr", "0"], "--lr"),
    (["pretrain", "--model", "tiny"], "--eval-only"),  # --model is only measured with --eval-only
    (["pretrain", "--eval-only", "--output-dir", "x"], "--output-dir"),
])
def test_a_bad_option_is_one_error_line(args: list[str], option: str) -> None:
    assert option in invoke(*args)


def test_an_option_error_from_a_real_process_is_one_line() -> None:
    proc = pivotrl("eval", "--task", "countdown", "--temperature", "-1")
    assert_user_error(proc, "'--temperature'", "greater than or equal to 0")
    assert proc.stderr.count("\n") == 1


# -- devices ----------------------------------------------------------------------------------------------


def test_a_device_this_machine_lacks_is_named_with_what_it_has(tmp_path: Path) -> None:
    line = invoke("eval", "--task", "countdown", "--device", "cuda:99", "-o", str(tmp_path / "s.jsonl"))
    assert "--device=cuda:99: this machine has no such device; it has: cpu" in line
    assert "not a device name" in invoke("eval", "--task", "countdown", "--device", "gpu")
    cfg = load_config(SMOKE, [f"output_dir={tmp_path / 'run'}", "model.device=cuda:99"])
    with pytest.raises(ConfigError, match=r"model\.device=cuda:99: this machine has no such device; it has: cpu"):
        Trainer(cfg)
    assert not (tmp_path / "run").exists()  # refused before the folder is made


# -- the config: unknown keys at every depth, files that are not YAML text ------------------------------


@pytest.mark.parametrize("override,message", [
    ("model.arch.hiden_size=16", "unknown config key 'model.arch.hiden_size'; did you mean 'model.arch.hidden_size'?"),
    ("eval.task={nmae: countdown}", "unknown config key 'eval.task.nmae'; did you mean 'eval.task.name'?"),
    ("train.max_stepz=3", "unknown config key 'train.max_stepz'; did you mean 'train.max_steps'?"),
])
def test_unknown_keys_are_refused_at_every_depth(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(SMOKE, [override])
    assert message in str(err.value)


def test_unknown_keys_of_free_mappings_are_refused_before_any_work() -> None:
    def refused(override: str) -> str:
        cfg = load_config(SMOKE, [override])
        with pytest.raises(ConfigError) as err:
            check_algorithm(cfg)
            check_config(cfg)
        return str(err.value)

    assert "did you mean 'num_numbers'?" in refused("task.options.num_number=3")
    assert "eval.task.name: unknown task 'countdwn' (did you mean 'countdown'?)" in refused("eval.task.name=countdwn")
    assert "did you mean 'gamma'?" in refused("algorithm.estimator_kwargs.gama=2.0")
    assert "did you mean 'eps_low'?" in refused("algorithm.loss_kwargs.eps_lo=0.2")


def test_an_unknown_architecture_key_never_reaches_a_model_config(tmp_path: Path) -> None:
    line = invoke("train", "-c", str(SMOKE), "-o", str(tmp_path / "run"), "model.arch.rope_scaling_factor=4")
    assert "unknown config key 'model.arch.rope_scaling_factor'" in line and "valid keys: hidden_size" in line
    assert not (tmp_path / "run").exists()
    ignored = check_config(load_config(SMOKE, ["model.name_or_path=tiny"]))
    assert ignored and "model.arch is ignored" in ignored[0]


def test_a_config_path_that_is_not_yaml_text_is_named(tmp_path: Path) -> None:
    binary = tmp_path / "recipe.yaml"
    binary.write_bytes(b"\xff\xfe\x00 not text")
    empty = tmp_path / "empty.yaml"
    empty.write_text("\n")
    for path, expected in ((tmp_path, "is a folder, not a file"), (binary, "is not UTF-8 text"),
                           (empty, "is empty"), (tmp_path / "none.yaml", "does not exist")):
        assert f"config file {path} {expected}" in invoke("train", "-c", str(path))


@pytest.mark.parametrize("override,key", [
    ("train.num_threads=0", "train.num_threads"), ("train.max_grad_norm=0", "train.max_grad_norm"),
    ("rollout.max_prompt_tokens=0", "rollout.max_prompt_tokens"), ("eval.max_new_tokens=0", "eval.max_new_tokens"),
    ("train.adam_betas=[0.9, 1.0]", "train.adam_betas"),
])
def test_numeric_settings_out_of_range_are_refused(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build_config({}, [override])


# -- degenerate settings --------------------------------------------------------------------------------


def test_greedy_sampling_of_several_responses_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"rollout\.temperature=0 .* rollout\.group_size=4 .* every advantage 0"):
        check_config(load_config(SMOKE, ["rollout.temperature=0"]))
    assert check_config(load_config(SMOKE, ["rollout.temperature=0", "rollout.group_size=1"])) == []
    with pytest.raises(ConfigError, match=r"eval\.temperature=0 .* eval\.samples_per_problem=4"):
        check_config(load_config(SMOKE, ["eval.temperature=0", "eval.samples_per_problem=4"]))
    assert "-k 4 samples of a problem would be copies of one" in invoke(
        "eval", "--task", "countdown", "-k", "4", "--temperature", "0", "-o", str(tmp_path / "s.jsonl"))


def test_a_run_that_would_do_nothing_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"train\.max_steps=0 with eval\.before_after=false: the run would do nothing"):
        check_config(load_config(SMOKE, ["train.max_steps=0", "eval.before_after=false"]))
    assert check_config(load_config(SMOKE, ["train.max_steps=0"])) == []  # an evaluation of the initial policy


# -- output folders of analyze, credit and report ----------------------------------------------------------


def test_analysis_outputs_never_go_into_a_run_or_a_file(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    missing = str(tmp_path / "no-model")  # never reached: the output is checked first
    for command in (["analyze", "--model", missing], ["credit", "--model", missing, "-g", "2"]):
        assert "holds a training run (metrics.jsonl)" in invoke(*command, "-o", str(run))
        assert "is a file, not a folder" in invoke(*command, "-o", str(a_file))
    assert "holds a training run" in invoke("report", str(run), "-o", str(run))
