"""A run folder is the run: --resume and compare never mix configs, and one process writes a folder.

Every test here runs the real command line in separate processes (the lock is a per-process
thing, and a resumed run is a new process), on configs/smoke.yaml.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from cli_helpers import SMOKE, assert_user_error, pivotrl, tree_bytes

from pivotrl.errors import FolderBusy
from pivotrl.train.recipes import recipe_path
from pivotrl.train.run_folder import LOCK_FILE, claim_folder, lock_folder

FAST = ["eval.before_after=false", "checkpoint.every=1"]


def steps_of(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def saved(run: Path) -> dict:
    return yaml.safe_load((run / "config.yaml").read_text())


# -- resume: the folder's config is the run's -------------------------------------------------


@pytest.mark.slow
def test_resume_continues_the_runs_own_config_or_refuses(tmp_path: Path) -> None:
    run = tmp_path / "r1"
    first = pivotrl("train", "-c", str(SMOKE), "-o", str(run), "train.max_steps=2", "algorithm.estimator=grpo", *FAST)
    assert first.returncode == 0, first.stderr
    before = tree_bytes(run)

    # the second command: no -c, so the run's own config.yaml (GRPO), not the default recipe (ERPO)
    again = pivotrl("train", "-o", str(run), "--resume", "train.max_steps=3")
    output = " ".join((again.stdout + again.stderr).split())
    assert again.returncode == 0, output
    assert "pivotrl train grpo + ppo" in output and f"resumed from {run / 'checkpoints' / 'step-000002'}" in output
    assert steps_of(run) == [1, 2, 3]
    assert saved(run)["algorithm"]["estimator"] == "grpo" and saved(run)["train"]["max_steps"] == 3
    assert saved(run)["model"]["arch"]["hidden_size"] == 32  # the smoke model, not the default recipe's
    after = tree_bytes(run)

    # what would change the experiment is refused by name, before anything is written
    refusals = [
        (["-c", str(SMOKE), "train.max_steps=4"], ["algorithm.estimator (run: grpo, given: erpo)"]),
        (["-c", str(recipe_path("search"))], ["task.name (run: countdown, given: countdown_search)",
                                               "model.name_or_path"]),
        (["rollout.group_size=2", "train.lr=0.1"], ["rollout.group_size (run: 4, given: 2)", "train.lr"]),
        (["train.max_steps=2"], ["train.max_steps=2 is below step 3"]),
    ]
    for args, names in refusals:
        proc = pivotrl("train", "-o", str(run), "--resume", *args)
        line = assert_user_error(proc, str(run), *names)
        assert "Traceback" not in line
    assert tree_bytes(run) == after
    assert before != after

    # what is safe to change on resume is accepted: more steps, logging, evaluation and checkpoint frequency
    more = pivotrl("train", "-o", str(run), "--resume", "train.max_steps=4", "log.print_every=1", "eval.every=2",
                   "checkpoint.keep=3", "train.num_threads=1")
    assert more.returncode == 0, more.stderr
    assert steps_of(run) == [1, 2, 3, 4]
    assert saved(run)["log"]["print_every"] == 1 and saved(run)["algorithm"]["estimator"] == "grpo"


def test_resume_refuses_a_run_without_its_config(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')  # a run whose config.yaml is gone
    assert_user_error(pivotrl("train", "-o", str(run), "--resume"), str(run), "no config.yaml", "--overwrite")
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl"]


# -- one writer per folder -------------------------------------------------------------------------


@pytest.mark.slow
def test_two_runs_started_together_into_one_folder_exactly_one_runs(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "pivotrl.cli", "train", "--config", str(SMOKE), "--output-dir", str(run),
           "train.max_steps=6", "eval.num_problems=8"]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    done = [p.communicate(timeout=600) for p in procs]
    codes = [p.returncode for p in procs]
    assert sorted(codes) == [0, 2], done
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    errors = [line for line in done[loser][1].splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(run) in errors[0] and "Traceback" not in done[loser][1], done[loser][1]
    # the loser came while the winner ran (its lock) or after it (a used folder): never both running
    assert (f"in use by another pivotrl process (PID {procs[winner].pid})" in errors[0]
            or "already holds a run" in errors[0]), errors[0]
    assert steps_of(run) == [1, 2, 3, 4, 5, 6]
    assert not (run / LOCK_FILE).exists()  # released at the end


HOLD = ("import sys, time; from pathlib import Path; from pivotrl.train.run_folder import claim_folder; "
        "lock = claim_folder(Path(sys.argv[1])); print('locked', flush=True); time.sleep(600)")


@pytest.mark.slow
def test_a_locked_folder_names_its_holder_and_a_crash_leaves_no_stale_lock(tmp_path: Path) -> None:
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        for command in (["train", "-c", str(SMOKE), "-o", str(run), "train.max_steps=1", *FAST],
                        ["train", "-c", str(SMOKE), "-o", str(run), "--overwrite", "train.max_steps=1", *FAST]):
            assert_user_error(pivotrl(*command), f"output_dir={run}", f"PID {holder.pid}")
        assert sorted(p.name for p in run.iterdir()) == [LOCK_FILE]
    finally:
        holder.kill()  # as a crash would: nothing releases the lock but the OS
        holder.wait()
    assert (run / LOCK_FILE).read_text().strip() == str(holder.pid)  # left behind ...
    proc = pivotrl("train", "-c", str(SMOKE), "-o", str(run), "train.max_steps=1", *FAST)
    assert proc.returncode == 0, proc.stderr  # ... and it blocks nothing
    assert steps_of(run) == [1] and not (run / LOCK_FILE).exists()


def test_the_lock_is_per_holder_and_released_with_its_file(tmp_path: Path) -> None:
    lock = claim_folder(tmp_path / "out")
    assert (tmp_path / "out" / LOCK_FILE).read_text().strip() == str(os.getpid())
    with pytest.raises(FolderBusy, match=rf"out is in use by another pivotrl process \(PID {os.getpid()}\)"):
        lock_folder(tmp_path / "out")  # a second holder, even in this process
    lock.release()
    lock.release()  # twice is harmless
    assert not (tmp_path / "out" / LOCK_FILE).exists()
    with lock_folder(tmp_path / "out"):
        assert (tmp_path / "out" / LOCK_FILE).is_file()
    assert list((tmp_path / "out").iterdir()) == []


# -- compare reuses only runs of the config it would launch --------------------------------------------


@pytest.mark.slow
def test_compare_reuses_a_run_only_with_the_same_config(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    args = ["compare", "--config", str(SMOKE), "--methods", "grpo", "--seeds", "1", "-o", str(out),
            "eval.num_problems=4"]
    run = out / "runs" / "grpo-seed0"
    assert pivotrl(*args, "train.max_steps=1").returncode == 0
    finished = tree_bytes(run)

    same = pivotrl(*args, "train.max_steps=1", "log.print_every=5")  # logging is not the experiment
    assert same.returncode == 0, same.stderr
    assert "done already" in same.stdout and tree_bytes(run) == finished

    other = pivotrl(*args, "train.max_steps=2")  # a finished run of another config is never reported as this one
    assert_user_error(other, "grpo-seed0", "train.max_steps (run: 1, now: 2)", "--overwrite")
    assert tree_bytes(run) == finished

    rerun = pivotrl(*args, "train.max_steps=2", "--overwrite")
    assert rerun.returncode == 0, rerun.stderr
    aside = [p for p in (out / "runs").iterdir() if p.name.startswith("grpo-seed0.old-")]
    assert len(aside) == 1 and tree_bytes(aside[0]) == finished
    assert steps_of(run) == [1, 2] and saved(run)["train"]["max_steps"] == 2
    report = (out / "report.md").read_text()
    assert "train.max_steps=2" in report and "train.max_steps=1" not in report


def test_report_states_each_runs_own_config_and_warns_when_they_differ(tmp_path: Path) -> None:
    runs = []
    for name, estimator, steps in (("a", "grpo", 2), ("b", "erpo", 3)):
        run = tmp_path / name
        run.mkdir()
        (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
        (run / "config.yaml").write_text(yaml.safe_dump({"algorithm": {"estimator": estimator},
                                                         "train": {"max_steps": steps, "seed": 0},
                                                         "task": {"name": "countdown"}}))
        runs.append(str(run))
    proc = pivotrl("report", *runs, "-o", str(tmp_path / "report"))
    assert proc.returncode == 0, proc.stderr
    assert "warning: the runs differ in more than the method and the seed (train.max_steps: 2 / 3)" in \
        " ".join(proc.stderr.split())
    text = (tmp_path / "report" / "report.md").read_text()
    assert f"`{runs[0]}`: algorithm.estimator=grpo, train.max_steps=2" in text
    assert f"`{runs[1]}`: algorithm.estimator=erpo, train.max_steps=3" in text
    assert "Shared by every run: task.name=countdown" in text
    assert_user_error(pivotrl("report", *runs, "-o", runs[0]), f"--output-dir={runs[0]}", "holds a training run")


# -- pretrain treats its folder as train does ------------------------------------------------------------


def test_pretrain_checks_its_output_folder_before_any_work(tmp_path: Path) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    started = time.perf_counter()
    assert_user_error(pivotrl("pretrain", "--output-dir", str(a_file)), str(a_file), "is a file")
    assert time.perf_counter() - started < 30
    shipped = Path(__file__).resolve().parent.parent / "pivotrl" / "assets" / "tiny-countdown"
    before = tree_bytes(shipped)
    assert_user_error(pivotrl("pretrain", "--output-dir", str(shipped)), "shipped policy", "--overwrite")
    assert tree_bytes(shipped) == before
    used = tmp_path / "model"
    used.mkdir()
    (used / "config.json").write_text("{}")
    assert_user_error(pivotrl("pretrain", "--output-dir", str(used)), str(used), "already holds a model",
                      "config.json", "--overwrite")
    assert [p.name for p in used.iterdir()] == ["config.json"]


@pytest.mark.slow
def test_pretrain_overwrite_moves_the_old_model_aside(tmp_path: Path) -> None:
    used = tmp_path / "model"
    used.mkdir()
    (used / "config.json").write_text("{}")
    proc = pivotrl("pretrain", "--output-dir", str(used), "--overwrite", "--steps", "1", "--batch-size", "2",
                   "--no-evaluate")
    assert proc.returncode == 0, proc.stderr
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("model.old-")]
    assert len(aside) == 1 and (aside[0] / "config.json").read_text() == "{}"
    assert (used / "model.safetensors").is_file() and json.loads((used / "pretrain.json").read_text())["steps_done"] == 1
    assert not (used / LOCK_FILE).exists() and not (aside[0] / LOCK_FILE).exists()
