"""Progress of every command that works for minutes: `train`'s steps, and `analyze`, `eval`, `credit`.

:class:`TrainProgress` shows a run's steps (a live bar on a terminal, a plain line every few
steps in a log file) and :func:`heldout_table` its before/after summary. :func:`progress_bar` shows one loop: a rich bar on a terminal (as `train`'s), a plain
line per update elsewhere (a pipe or a log file, where a live bar would print nothing
until the end). :class:`Phases` strings a command's phases together: each phase gets
such a bar, and a line with its seconds in a log file, so a run that is slow, stopped
or killed says where its time went.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

#: update(done, total): how a loop reports its progress.
Update = Callable[[int, int], None]


def _ignore(done: int, total: int) -> None:
    """An update that shows nothing (no console)."""


@contextmanager
def progress_bar(console: Console | None, description: str, unit: str = "") -> Iterator[Update]:
    """update(done, total): a rich bar in a terminal, otherwise a plain line per update before the last.

    The last update (done == total) prints no line of its own: the caller says when the loop is done.
    `unit` follows the counts ("problems" -> "3/8 problems"). No console: nothing is shown.
    """
    if console is None:
        yield _ignore
        return
    if console.is_terminal:
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("ETA"), TimeRemainingColumn(), console=console) as bar:
            task = bar.add_task(description, total=None)
            seen = {"total": 0}

            def show(done: int, total: int) -> None:
                seen["total"] = total
                bar.update(task, completed=done, total=total)

            yield show
            finished = seen["total"] or 1  # a step without updates ends as one step done
            bar.update(task, completed=finished, total=finished)
        return
    start = time.perf_counter()
    units = f" {unit}" if unit else ""

    def update(done: int, total: int) -> None:
        if done < total:
            console.print(f"{description}: {done}/{total}{units} ({time.perf_counter() - start:.0f} s)",
                          highlight=False, soft_wrap=True)

    yield update


class Phases:
    """A command's phases, each shown with :func:`progress_bar` and logged with its seconds.

    The log (`log_path`, overwritten) gets a first line naming the command and its settings,
    then one line per phase when it ends: the seconds since the Phases began (the command's
    work, after its imports), the phase, its own seconds; a phase that raises logs 'stopped'
    and the error; :meth:`done` writes the total. :meth:`log_to` opens the log later, with
    the lines so far (`eval` does, once its model has loaded, so that a refused command
    leaves no file behind). Without a console nothing is printed; without a log, nothing is written.
    """

    def __init__(self, command: str = "", console: Console | None = None, log_path: Path | None = None,
                 settings: dict[str, Any] | None = None) -> None:
        self.command = command
        self.console = console
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self._log: TextIO | None = None
        shown = " ".join(f"{k}={v}" for k, v in (settings or {}).items())
        self._lines = [f"pivotrl {command} started {datetime.now().isoformat(timespec='seconds')}"
                       + (f": {shown}" if shown else "")]
        if log_path is not None:
            self.log_to(log_path)

    def log_to(self, log_path: Path) -> None:
        """Write the log to `log_path` (overwritten) from now on, starting with the lines so far."""
        self._log = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 - closed by done() or close()
        for line in self._lines:
            self._write(line)

    def elapsed(self) -> float:
        """Seconds since the Phases began."""
        return time.perf_counter() - self.started

    def _write(self, line: str) -> None:
        if self._log is None:
            self._lines.append(line)  # kept for log_to
            return
        self._log.write(line + "\n")
        self._log.flush()

    def _say(self, line: str) -> None:
        if self.console is not None and not self.console.is_terminal:  # a terminal has the bar
            self.console.print(f"{self.command}: {line}" if self.command else line, highlight=False, soft_wrap=True)

    @contextmanager
    def phase(self, description: str, unit: str = "") -> Iterator[Update]:
        """Run one phase: yields its update(done, total); logs its seconds when it ends."""
        self._say(f"{description} ...")
        begun = time.perf_counter()
        label = f"{self.command}: {description}" if self.command else description
        try:
            with progress_bar(self.console, label, unit) as update:
                yield update
        except BaseException as err:
            seconds = time.perf_counter() - begun
            self._write(f"{self.elapsed():8.1f} s  {description}: stopped after {seconds:.1f} s "
                        f"({type(err).__name__}: {' '.join(str(err).split())[:200]})")
            raise
        seconds = time.perf_counter() - begun
        self.seconds[description] = seconds
        self._write(f"{self.elapsed():8.1f} s  {description}: {seconds:.1f} s")
        self._say(f"{description}: done in {seconds:.1f} s")

    def done(self, summary: str = "") -> None:
        """Log the total time (and a summary line) and close the log."""
        self._write(f"{self.elapsed():8.1f} s  done" + (f": {summary}" if summary else ""))
        self.close()

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Phases:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def clock(seconds: float) -> str:
    """'0:03:07'."""
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class TrainProgress:
    """`train`'s progress: a live bar on a terminal; elsewhere (a log file, where a live bar would print
    nothing until the end) one plain line every `print_every` steps and at the last. `enabled` False:
    nothing but what the trainer prints itself."""

    def __init__(self, console: Console, *, enabled: bool, print_every: int, total: int) -> None:
        self.console, self.enabled, self.print_every, self.total = console, enabled, print_every, total
        live = enabled and console.is_terminal
        self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TextColumn("{task.fields[reward]}"), TimeElapsedColumn(), TextColumn("ETA"),
                             TimeRemainingColumn(), console=console, disable=not live)
        self._task = None

    def __enter__(self) -> TrainProgress:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(*exc)

    def start(self, done: int) -> None:
        """The bar, from step `done` on."""
        self._task = self._bar.add_task("train", total=self.total, completed=done, reward="")

    def step(self, step: int, metrics: dict[str, Any], per_step: float, seconds: float) -> None:
        """Step `step` is done: advance the bar, or print its line when one is due."""
        reward = metrics.get("reward/mean", float("nan"))
        self._bar.update(self._task, advance=1, reward=f"reward {reward:.3f}")
        if not self.enabled or self.console.is_terminal or (step % self.print_every and step != self.total):
            return
        self.console.print(
            f"step {step}/{self.total}  reward {reward:.3f}  accuracy {metrics.get('accuracy', float('nan')):.3f}  "
            f"{per_step:.2f} s/step  elapsed {clock(seconds)}  ETA {clock(per_step * (self.total - step))}",
            soft_wrap=True, highlight=False)

    def evaluation(self, tag: str) -> Update:
        """update(done, total) printing one line per evaluated batch (when an evaluation spans several)."""
        started = time.perf_counter()

        def report(done: int, total: int) -> None:
            if self.enabled and done < total:
                self.console.print(f"evaluating {tag}: {done}/{total} problems, {clock(time.perf_counter() - started)}",
                                   soft_wrap=True, highlight=False)

        return report


def heldout_table(task: str, before: dict[str, Any], after: dict[str, Any]) -> Table:
    """The before/after table of a run's held-out evaluation: accuracy, mean length, and the task's counts."""
    title = f"held-out {task} ({after['num_problems']} problems)"
    table = Table(title=title, min_width=len(title))  # the title on one line, also in a log file
    for col in ("", "before", "after"):
        table.add_column(col, justify="right")
    table.add_row("accuracy", f"{before.get('accuracy', float('nan')):.3f}", f"{after['accuracy']:.3f}")
    table.add_row("mean length", f"{before.get('mean_length', float('nan')):.1f}", f"{after['mean_length']:.1f}")
    for key in task_counts(after):
        table.add_row(key.removeprefix("mean_").replace("_", " ") + " per response",
                      f"{before.get(key, float('nan')):.2f}", f"{after[key]:.2f}")
    return table


def task_counts(result: dict[str, Any]) -> list[str]:
    """The `mean_<count>` keys of an evaluation result that the task reads off responses (mean_length aside)."""
    return sorted(k for k in result if k.startswith("mean_") and k != "mean_length")
