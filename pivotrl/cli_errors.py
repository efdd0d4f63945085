"""How the command line reports problems: one line naming the problem, never a traceback.

Exit codes: 2 for a user error (bad option, config, path, data, checkpoint), 130 for an
interrupt (Ctrl-C). PIVOTRL_TRACEBACK=1 shows the traceback instead, for debugging.
The option parser's errors (a value out of range, an unknown option) take the same form
(OneLineErrors), not typer's boxed panel.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

try:  # typer >= 0.24 carries its own copy of click
    from typer._click import exceptions as click_errors
    from typer._click.utils import echo
except ImportError:  # older typer: click itself
    from click import exceptions as click_errors
    from click.utils import echo

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
    from pivotrl.errors import TrainingInterrupted

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


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text[:1].lower() + text[1:]


class OneLineErrors(TyperGroup):
    """The command group whose option-parsing errors print one `error:` line (exit code 2), like
    every other refusal, instead of typer's usage text and boxed panel."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click_errors.NoArgsIsHelpError as err:  # `pivotrl` alone: the help (already printed by rich)
            if err.format_message().strip():
                echo(err.format_message())
            sys.exit(err.exit_code)
        except click_errors.UsageError as err:
            where = f" (see {err.ctx.command_path} --help)" if err.ctx is not None else ""
            typer.secho(f"error: {_one_line(err.format_message())}{where}", fg=typer.colors.RED, err=True)
            sys.exit(2)
        except click_errors.ClickException as err:
            typer.secho(f"error: {_one_line(err.format_message())}", fg=typer.colors.RED, err=True)
            sys.exit(err.exit_code)
        except typer.Abort:
            typer.secho("aborted", fg=typer.colors.YELLOW, err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)
