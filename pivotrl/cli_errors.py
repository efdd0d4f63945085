"""How the command line reports problems: one line naming the problem, never a traceback.

Exit codes: 2 for a user error (bad option, config, path, data, checkpoint), 130 for an
interrupt (Ctrl-C). PIVOTRL_TRACEBACK=1 shows the traceback instead, for debugging.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import typer

#: Exceptions whose message is written for the user (the library raises these for bad input).
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, KeyError, OSError, ImportError)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print 'error: message' to stderr and exit with `code`."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def warn(message: str) -> None:
    """Print 'warning: message' to stderr."""
    typer.secho(f"warning: {message}", fg=typer.colors.YELLOW, err=True)


def describe(err: BaseException) -> str:
    """The message of an exception as one line, naming the file for OS errors."""
    if isinstance(err, KeyError) and err.args:
        text = str(err.args[0])
    elif isinstance(err, OSError) and err.filename is not None and err.strerror:
        text = f"{err.filename}: {err.strerror}"
    else:
        text = str(err) or type(err).__name__
    return " ".join(text.split())


@contextmanager
def user_errors(*extra: type[BaseException]) -> Iterator[None]:
    """Turn the user-facing exceptions (USER_ERRORS and `extra`) into `error: ...` and exit code 2,
    and an interrupt into exit code 130 with its message."""
    from pivotrl.train.interrupts import TrainingInterrupted

    try:
        yield
    except typer.Exit:
        raise
    except TrainingInterrupted as err:
        if os.environ.get("PIVOTRL_TRACEBACK"):
            raise
        typer.secho(describe(err), fg=typer.colors.YELLOW, err=True)
        raise typer.Exit(130) from None
    except KeyboardInterrupt:
        if os.environ.get("PIVOTRL_TRACEBACK"):
            raise
        typer.secho("interrupted", fg=typer.colors.YELLOW, err=True)
        raise typer.Exit(130) from None
    except (*USER_ERRORS, *extra) as err:
        if os.environ.get("PIVOTRL_TRACEBACK"):
            raise
        fail(describe(err))
