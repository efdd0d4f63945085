"""The real command line under bad input: one `error:` line naming the problem, exit code 2, no traceback.

Also: a used run folder is never overwritten, degenerate settings are refused or warned
about, Ctrl-C saves a checkpoint, and progress reaches a log file.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cli_helpers import (
    SMOKE,
    assert_usage_error,
    assert_user_error,
    pivotrl,
    read_only_dir,
    tree_bytes,
)

from pivotrl.algorithms import registry
from pivotrl.errors import ConfigError
from pivotrl.train.checks import check_group_size
from pivotrl.train.config import load_config
from pivotrl.train.trainer import Trainer

FAST = ["train.max_steps=1", "eval.before_after=false", "checkpoint.every=0"]


def train(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return pivotrl("train", "--config", str(SMOKE), "--output-dir", str(out), *extra)


# -- eval -----------------------------------------------------------------------------


@pytest.mark.parametrize("args,option", [(["-k", "0"], "-k"), (["-n", "0"], "--num-problems"),
                                         (["--temperature", "-1"], "--temperature"),
                                         (["--batch-size", "0"], "--batch-size")])
def test_eval_refuses_invalid_numbers(args: list[str], option: str) -> None:
    assert_usage_error(pivotrl("eval", "--task", "countdown", *args), option)


def write_binary(path: Path) -> None:
    path.write_bytes(bytes(range(256)) * 4)


@pytest.mark.parametrize("content,expected", [
    (None, "no such file"),
    ("", "the file is empty"),
    (write_binary, "not UTF-8 text"),
    ('{"q": "What is 1 + 1?", "a": "2"}\n', "its rows have the fields a, q"),
])
def test_eval_names_the_bad_data_file(tmp_path: Path, content, expected: str) -> None:
    data = tmp_path / "problems.jsonl"
    if callable(content):
        content(data)
    elif content is not None:
        data.write_text(content)
    assert_user_error(pivotrl("eval", "--data", str(data)), str(data), expected)


def test_eval_checks_its_output_before_any_work(tmp_path: Path) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    missing_model = str(tmp_path / "no-model")  # would fail too, but only after the output check
    for output, expected in ((tmp_path, "is a folder"), (a_file / "samples.jsonl", "a_file is a file"),
                             (read_only_dir(tmp_path) / "samples.jsonl", "not writable")):
        proc = pivotrl("eval", "--task", "countdown", "--model", missing_model, "-o", str(output))
        assert_user_error(proc, "--output", expected)


@pytest.mark.slow
def test_a_missing_model_path_fails_at_once(tmp_path: Path) -> None:
    started = time.perf_counter()
    proc = pivotrl("eval", "--task", "countdown", "-n", "1", "--model", str(tmp_path / "nope" / "model"))
    line = assert_user_error(proc, str(tmp_path / "nope" / "model"), "does not exist")
    assert "Repo id" not in line and time.perf_counter() - started < 60  # imports included; no network waits
    started = time.perf_counter()  # a name shaped like a hub id: the cache, then the hub if it answers in 3 s
    assert_user_error(pivotrl("eval", "--task", "countdown", "-n", "1", "--model", "no-such-org/no-such-model"),
                      "no-such-org/no-such-model")
    assert time.perf_counter() - started < 60


# -- train: inputs and outputs ---------------------------------------------------------------


def test_train_names_leftover_task_options(tmp_path: Path) -> None:
    proc = train(tmp_path / "run", "task.name=file", *FAST)
    line = assert_user_error(proc, "task 'file'", "'test_size'", "'train_size'")
    assert "TypeError" not in line


@pytest.mark.slow
def test_train_names_a_missing_data_file_and_model(tmp_path: Path) -> None:
    missing = tmp_path / "missing.jsonl"
    assert_user_error(train(tmp_path / "a", "task.name=file", f"task.options={{path: {missing}}}", *FAST),
                      str(missing))
    assert_user_error(train(tmp_path / "b", f"model.name_or_path={tmp_path / 'no-model'}", *FAST),
                      "no-model", "does not exist")


@pytest.mark.slow
def test_train_checks_the_output_folder_first(tmp_path: Path) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    for out, expected in ((a_file, "is a file"), (read_only_dir(tmp_path) / "run", "not writable")):
        proc = train(out, f"model.name_or_path={tmp_path / 'no-model'}", *FAST)  # the model is never reached
        assert_user_error(proc, f"output_dir={out}", expected)


# -- train: a used run folder ----------------------------------------------------------------


@pytest.mark.slow
def test_a_used_run_folder_is_refused_then_moved_aside_intact(tmp_path: Path) -> None:
    run = tmp_path / "run"
    Trainer(load_config(SMOKE, [f"output_dir={run}", "train.max_steps=2", "eval.num_problems=4"])).run()
    before = tree_bytes(run)
    assert {"metrics.jsonl", "summary.json", "checkpoints/step-000002/model.safetensors"} <= set(before)

    assert_user_error(train(run, *FAST), str(run), "--resume", "--overwrite")
    assert tree_bytes(run) == before

    proc = train(run, "--overwrite", *FAST)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("run.old-")]
    assert len(aside) == 1 and str(aside[0]) in " ".join(proc.stdout.split())
    assert tree_bytes(aside[0]) == before
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 1

    assert_user_error(train(run, "--resume", "--overwrite", *FAST), "--resume", "--overwrite")


# -- degenerate settings ----------------------------------------------------------------------


@pytest.mark.slow
def test_group_size_one_is_warned_about_and_still_learns(tmp_path: Path) -> None:
    proc = train(tmp_path / "run", "rollout.group_size=1", "rollout.prompts_per_step=16", "rollout.max_new_tokens=34",
                 "algorithm.estimator=grpo", "model.name_or_path=tiny", *FAST)
    output = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 0, output
    assert "warning: rollout.group_size=1" in output and "REINFORCE without a baseline" in output
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text())
    assert record["reward/mean"] > 0 and record["grad_norm"] > 0  # a lone right answer still moves the policy


def test_group_size_one_is_refused_where_nothing_could_be_learned(tmp_path: Path) -> None:
    @registry.register_estimator("centred")
    def centred(batch):  # a group-relative estimator without the singleton convention
        adv = torch.zeros_like(batch.old_logprobs)
        for g in batch.group_index.unique():
            rows = batch.group_index == g
            adv[rows] = (batch.rewards[rows] - batch.rewards[rows].mean()).unsqueeze(1)
        return adv

    try:
        cfg = load_config(SMOKE, [f"output_dir={tmp_path}", "rollout.group_size=1", "algorithm.estimator=centred"])
        with pytest.raises(ConfigError, match=r"rollout\.group_size=1: estimator 'centred'.* 0 at every step"):
            check_group_size(cfg)
        assert check_group_size(load_config(SMOKE, ["rollout.group_size=2", "algorithm.estimator=centred"])) is None
    finally:
        registry.ESTIMATORS.remove("centred")
    with pytest.raises(ConfigError, match=r"rollout\.group_size=1 with rollout\.dynamic_sampling"):
        Trainer(load_config(SMOKE, [f"output_dir={tmp_path}", "rollout.group_size=1",
                                    "rollout.dynamic_sampling=true"]))
    assert not any(tmp_path.iterdir())  # refused before anything was written


# -- interrupts and logs -----------------------------------------------------------------------


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_and_exits_130(tmp_path: Path) -> None:
    run, log = tmp_path / "run", tmp_path / "stdout.txt"
    cmd = [sys.executable, "-m", "pivotrl.cli", "train", "--config", str(SMOKE), "--output-dir", str(run),
           "train.max_steps=500", "checkpoint.every=0", "eval.num_problems=8", "eval.batch_size=4",
           "log.progress=true", "log.print_every=1"]
    with log.open("w") as stdout:
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 300
        metrics = run / "metrics.jsonl"
        while time.time() < deadline and proc.poll() is None:
            if metrics.is_file() and len(metrics.read_text().splitlines()) >= 2:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    steps = len(metrics.read_text().splitlines())
    message = " ".join(stderr.split())
    assert f"interrupted: saved step {steps} of 500" in message and "--resume" in message
    state = json.loads((run / "checkpoints" / f"step-{steps:06d}" / "trainer_state.json").read_text())
    assert state["step"] == steps
    printed = log.read_text()
    assert "evaluating step-000000: 4/8 problems" in printed  # an evaluation of several batches shows progress
    assert "step 1/500  reward" in printed and "ETA" in printed  # plain lines, since stdout is a file


# -- compare and report -----------------------------------------------------------------------


@pytest.mark.slow
def test_compare_warns_when_every_reward_is_zero_and_stays_resumable(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    args = ["compare", "--config", str(SMOKE), "--methods", "grpo", "--seeds", "1", "-o", str(out),
            "train.max_steps=2", "eval.num_problems=4"]
    first = pivotrl(*args)
    output = " ".join((first.stdout + first.stderr).split())
    assert first.returncode == 0, output
    assert "every reward of every run is 0" in output  # tiny-random never solves countdown
    assert "--resume" not in output  # a fresh run does not talk about resuming
    run = out / "runs" / "grpo-seed0"
    (run / "summary.json").unlink()  # as if killed after its last checkpoint
    again = pivotrl(*args)
    output = " ".join((again.stdout + again.stderr).split())
    assert again.returncode == 0, output
    assert f"resumed from {run / 'checkpoints' / 'step-000002'}" in output
    assert (run / "summary.json").is_file()
