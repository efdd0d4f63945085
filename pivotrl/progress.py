"""Progress of the commands that work for minutes beside training (`analyze`, `eval`, `credit`).

:func:`progress_bar` shows one loop: a rich bar on a terminal (as `train`'s), a plain
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
