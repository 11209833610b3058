"""What every command shares: the stderr console, and one clean line for every error."""

from __future__ import annotations

import os
import sys

import typer
from rich.console import Console
from rich.markup import escape

from ..errors import FerrumError

# no emoji codes: a file named x:fire:y.wav is named as it is; user text goes in through escape()
err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)
state = {"debug": False}  # --debug: tracebacks instead of one line


class Interrupted(BaseException):
    """SIGTERM, raised like KeyboardInterrupt so that no `except Exception` swallows it."""

    def __init__(self, code: int) -> None:
        self.code = code


def on_signal(signum, frame) -> None:
    raise Interrupted(128 + signum)


def fail(exc: FerrumError) -> None:
    err.print(f"[red]error:[/] {escape(exc.message)}", markup=True, highlight=False)
    raise typer.Exit(exc.exit_code)


def call(func, *args, **kwargs):
    """Call into the library; a FerrumError becomes one line and its exit code."""
    try:
        return func(*args, **kwargs)
    except FerrumError as exc:
        if state["debug"]:
            raise
        fail(exc)
    except (KeyboardInterrupt, Interrupted, typer.Exit, BrokenPipeError):
        raise  # BrokenPipeError: stdout's reader went away, which main() ends quietly
    except Exception as exc:  # a bug still ends in one line; --debug shows the traceback
        if state["debug"]:
            raise
        fail(FerrumError(f"internal error: {type(exc).__name__}: {exc}".splitlines()[0]))


def quiet_broken_pipe() -> int:
    """The reader of stdout went away (e.g. `| head`): stop quietly, with success. stdout goes to
    /dev/null, so that the interpreter's last flush finds nowhere to fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 0
