"""The commands beside training (analyze, eval, credit, pretrain's measurement) feel like `train`.

They show progress (a bar on a terminal, plain lines otherwise) and log a line per phase; they
take --threads (default 1, like train and credit); transformers' own progress bars stay out of
their output; `pretrain --eval-only` and `eval` report the same held-out accuracy; and a command
that looks at a few held-out problems builds only those.
"""

from __future__ import annotations

import inspect
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from cli_helpers import SMOKE, pivotrl
from rich.console import Console
from typer.testing import CliRunner

from pivotrl.cli import app
from pivotrl.progress import Phases
from pivotrl.tasks import TASKS, CountdownSearchTask, CountdownTask, get_task, register_task

COUNTING = "unit-test-counting-countdown"


class CountingCountdown(CountdownTask):
    """countdown that counts the problems it generates (every draw, of either split)."""

    generated = 0

    def generate(self, rng):  # noqa: ANN001, ANN201 - CountdownTask's signature
        type(self).generated += 1
        return super().generate(rng)


@pytest.fixture()
def counting_task() -> Iterator[type[CountingCountdown]]:
    register_task(COUNTING)(CountingCountdown)
    CountingCountdown.generated = 0
    try:
        yield CountingCountdown
    finally:
        TASKS.pop(COUNTING, None)


@pytest.fixture()
def threads_restored() -> Iterator[None]:
    """The commands set torch's thread count in this process: put it back after the test."""
    before = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(before)


def invoke(*args: str):  # noqa: ANN201 - click's Result
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, (args, result.output, result.exception)
    return result


# -- the first n problems, and only those -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["countdown", "countdown_search", "arithmetic", "linear"])
def test_the_first_n_problems_are_the_splits_first_n(name: str) -> None:
    few = get_task(name).problems("test", limit=8)
    assert len(few) == 8
    assert few == get_task(name, test_size=300).problems("test")[:8]  # the first ones do not depend on the size
    whole = get_task(name, test_size=20)
    assert whole.problems("test", limit=50) == whole.problems("test")  # a limit above the split: all of it
    assert get_task(name).problems("train", limit=3) == get_task(name).problems("train")[:3]


def test_a_few_problems_are_built_without_the_rest(counting_task: type[CountingCountdown]) -> None:
    task = get_task(COUNTING)
    first = task.problems("test", limit=8)
    few = counting_task.generated
    everything = task.problems("test")  # the whole split (2000 problems), built now
    assert first == everything[:8]
    assert counting_task.generated - few > 50 * few, (few, counting_task.generated)
    assert len(everything) == 2000


def test_search_task_builds_a_few_problems_in_a_fraction_of_the_time() -> None:
    import time

    built = {}

    def seconds(limit: int | None) -> float:
        start = time.perf_counter()
        built[limit] = CountdownSearchTask().problems("test", limit=limit)
        return time.perf_counter() - start

    few, whole = min(seconds(8) for _ in range(3)), seconds(None)
    assert few * 20 < whole, (few, whole)  # measured ~0.001 s against ~8 s
    assert built[8] == built[None][:8] and len(built[None]) == 2000


@pytest.mark.parametrize("command", [
    ["eval", "-n", "3", "--max-new-tokens", "4"],
    ["analyze", "-n", "2", "--group-size", "2", "--perturbations", "2", "--max-new-tokens", "6"],
    ["credit", "-n", "1", "-g", "2", "-k", "2", "--positions", "1", "--bootstrap", "5", "--max-new-tokens", "6"],
], ids=["eval", "analyze", "credit"])
def test_side_commands_build_only_the_problems_they_use(command: list[str], counting_task, threads_restored,
                                                        tmp_path: Path) -> None:
    out = ["-o", str(tmp_path / "samples.jsonl")] if command[0] == "eval" else ["-o", str(tmp_path / "out")]
    invoke(*command, "--task", COUNTING, *out)
    assert 0 < counting_task.generated < 200, counting_task.generated  # the whole split takes > 15 000 draws


# -- progress and the log of phases -------------------------------------------------------------------------

PHASE_LINE = re.compile(r"^ +\d+\.\d s  (.+): (\d+\.\d) s$")


def logged_phases(log: Path) -> list[str]:
    """The phases of a log, checking its form: a header, a line per phase with seconds, a last 'done' line."""
    lines = log.read_text().splitlines()
    assert lines[0].startswith("pivotrl "), lines
    assert re.match(r"^ +\d+\.\d s  done", lines[-1]), lines
    phases = []
    for line in lines[1:-1]:
        match = PHASE_LINE.match(line)
        assert match, line
        phases.append(match.group(1))
    return phases


def test_analyze_shows_progress_and_logs_each_phase(tmp_path: Path, threads_restored) -> None:
    result = invoke("analyze", "-n", "2", "--group-size", "2", "--perturbations", "3", "--max-new-tokens", "8",
                    "-o", str(tmp_path))
    assert json.loads(result.stdout)["problems"] == 2  # stdout holds the result alone; progress is on stderr
    phases = logged_phases(tmp_path / "log.txt")
    assert phases[:3] == ["build the first 2 held-out problems", "load tiny",
                          "sample 2 prompts x 2 responses, score, forward"]
    assert sum("perturb" in p for p in phases) == 4
    for phase in phases:  # not a terminal: a plain line when each phase starts and ends
        assert f"analyze: {phase} ..." in result.stderr and f"analyze: {phase}: done in" in result.stderr
    assert "threads=1" in (tmp_path / "log.txt").read_text().splitlines()[0]


def test_eval_shows_progress_and_logs_beside_its_samples(tmp_path: Path, threads_restored) -> None:
    samples = tmp_path / "run" / "heldout.jsonl"
    result = invoke("eval", "--task", "countdown", "-n", "5", "--batch-size", "2", "--max-new-tokens", "4",
                    "-o", str(samples))
    assert json.loads(result.stdout)["num_problems"] == 5
    assert "eval: evaluating: 2/5 problems" in result.stderr and "eval: evaluating: 4/5 problems" in result.stderr
    log = samples.with_name("heldout.log.txt")
    assert logged_phases(log) == ["build the first 5 held-out problems", "load tiny", "evaluating"]
    assert "accuracy" in log.read_text().splitlines()[-1]
    refused = tmp_path / "refused" / "samples.jsonl"  # a model that cannot load: no work, so no log either
    result = CliRunner().invoke(app, ["eval", "--task", "countdown", "--model", str(tmp_path / "nope"),
                                      "-o", str(refused)])
    assert result.exit_code == 2 and "does not exist" in result.stderr
    assert not refused.exists() and not refused.with_name("samples.log.txt").exists()


def test_credit_logs_each_phase(tmp_path: Path, threads_restored) -> None:
    result = invoke("credit", "-n", "1", "-g", "2", "-k", "2", "--positions", "1", "--bootstrap", "5",
                    "--max-new-tokens", "6", "-o", str(tmp_path))
    assert result.stdout.startswith("credit: ") and len(result.stdout.splitlines()) == 1
    phases = logged_phases(tmp_path / "log.txt")
    assert "continuations (K=2)" in phases and phases[-1] == "write credit.json, report.md, plots, tokens.html"


def test_a_terminal_gets_a_live_bar_and_a_stopped_phase_is_logged(tmp_path: Path) -> None:
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100)
    with Phases("demo", console, tmp_path / "log.txt") as phases:
        with phases.phase("counting", unit="rows") as update:
            for done in range(1, 4):
                update(done, 3)
        with pytest.raises(RuntimeError), phases.phase("failing"):
            raise RuntimeError("out of patience")
    shown = screen.getvalue()
    assert "demo: counting" in shown and "3/3" in shown and "━" in shown  # rich's bar, not plain lines
    assert "done in" not in shown
    lines = (tmp_path / "log.txt").read_text().splitlines()
    assert PHASE_LINE.match(lines[1]).group(1) == "counting"
    assert "failing: stopped after" in lines[2] and "RuntimeError: out of patience" in lines[2]


# -- threads ------------------------------------------------------------------------------------------------


def test_analyze_and_eval_take_threads_defaulting_to_one_like_credit(tmp_path: Path, threads_restored) -> None:
    from pivotrl.cli import analyze, credit, eval_command

    for command in (analyze, eval_command, credit):
        option = inspect.signature(command).parameters["threads"].default
        assert option == 1, command.__name__
    torch.set_num_threads(2)
    invoke("eval", "--task", "countdown", "-n", "1", "--max-new-tokens", "2", "-o", str(tmp_path / "s.jsonl"))
    assert torch.get_num_threads() == 1
    invoke("analyze", "-n", "1", "--group-size", "2", "--perturbations", "1", "--max-new-tokens", "4",
           "--threads", "2", "-o", str(tmp_path / "a"))
    assert torch.get_num_threads() == 2
    assert "threads=2" in (tmp_path / "a" / "log.txt").read_text()


# -- transformers' bars stay out ----------------------------------------------------------------------------

HF_BARS = ("Loading weights", "Writing model shards", "it/s]")


@pytest.mark.slow
def test_no_transformers_progress_bar_in_any_commands_output(tmp_path: Path) -> None:
    """Real commands in fresh processes: pretrain's save, the trainer's checkpoints, every load."""
    folder = tmp_path / "pretrained"
    runs = [
        pivotrl("pretrain", "--steps", "1", "--batch-size", "2", "--output-dir", str(folder), "--no-evaluate"),
        pivotrl("train", "-c", str(SMOKE), "-o", str(tmp_path / "run"), "train.max_steps=2", "eval.before_after=false"),
    ]
    assert (folder / "model.safetensors").is_file()
    assert len(list((tmp_path / "run" / "checkpoints").glob("step-*"))) >= 1
    runs += [
        pivotrl("pretrain", "--eval-only", "--model", str(folder), "--eval-n", "2"),  # the tiny loader
        pivotrl("analyze", "--model", str(folder), "--ref", str(folder), "-n", "1", "--group-size", "2",  # a folder
                "--perturbations", "1", "--max-new-tokens", "4", "-o", str(tmp_path / "analyze")),
    ]
    for proc in runs:
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, output
        for bar in HF_BARS:
            assert bar not in output, (proc.args, output)


# -- one meaning of held-out accuracy -----------------------------------------------------------------------


@pytest.mark.parametrize("task,model,n", [("countdown", "tiny", 24), ("countdown_search", "tiny-search", 3),
                                          ("countdown_free", "tiny-free", 8)])
def test_pretrain_eval_only_and_eval_report_the_same_heldout_accuracy(task: str, model: str, n: int,
                                                                      tmp_path: Path, threads_restored) -> None:
    measured = invoke("pretrain", "--task", task, "--eval-only", "--eval-n", str(n)).stdout
    evaluated = json.loads(invoke("eval", "--model", model, "--task", task, "-n", str(n), "--device", "cpu",
                                  "-o", str(tmp_path / "s.jsonl")).stdout)
    found = re.search(r"held-out accuracy (\d\.\d+) .*mean response (\d+\.\d) tokens.*\(n=(\d+)\)",
                      " ".join(measured.split()))
    assert found, measured
    length = get_task(task).max_new_tokens
    assert f"at most {length} tokens" in " ".join(measured.split())
    assert float(found.group(1)) == pytest.approx(evaluated["accuracy"], abs=0.00051)  # printed to 3 decimals
    assert float(found.group(2)) == pytest.approx(evaluated["mean_length"], abs=0.051)  # to 1 decimal
    assert int(found.group(3)) == evaluated["num_problems"] == n
    # a task with free choices also gets the share of the policy's entropy on its free tokens
    assert ("free entropy share" in measured) == (task == "countdown_free")


def test_the_heldout_defaults_are_one_definition() -> None:
    from pivotrl import cli, evaluation
    from pivotrl.cli import eval_command, pretrain

    assert (cli.HELDOUT_PROBLEMS, cli.HELDOUT_BATCH) == (evaluation.HELDOUT_PROBLEMS, evaluation.HELDOUT_BATCH)
    eval_defaults = {k: p.default for k, p in inspect.signature(eval_command).parameters.items()}
    pretrain_defaults = {k: p.default.default for k, p in inspect.signature(pretrain).parameters.items()}
    assert eval_defaults["num_problems"] == pretrain_defaults["eval_n"] == evaluation.HELDOUT_PROBLEMS
    assert eval_defaults["batch_size"] == evaluation.HELDOUT_BATCH
    assert eval_defaults["seed"] == pretrain_defaults["eval_seed"] == 0
    assert eval_defaults["temperature"] == pretrain_defaults["temperature"] == 1.0
    assert eval_defaults["max_new_tokens"] is None and pretrain_defaults["max_new_tokens"] is None  # the task's
    assert get_task("countdown").max_new_tokens == 34 and get_task("countdown_search").max_new_tokens == 224
