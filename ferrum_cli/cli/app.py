"""The `ferrum` app: its commands, one line for every error, and an exit that waits for nothing."""

from __future__ import annotations

import logging
import os
import sys
from typing import Annotated

import typer
import typer.rich_utils
from rich.markup import escape
from rich.table import Table

from .. import __version__
from ..errors import FerrumError
from . import describe
from . import serve as serve_command
from .console import err, quiet_broken_pipe, readable_stdout, state
from .transcribe import EXAMPLES, transcribe


class _WholeNamesTable(Table):
    """The help's option tables with the name columns never shrunk: rich narrows the widest column
    first, which cut '--temperature-increment-on-fallback' to '--temperature-increme…' at 80 columns;
    the help text wraps instead."""

    def add_row(self, *cells, **kwargs) -> None:
        super().add_row(*cells, **kwargs)
        for column in self.columns[:-2]:  # the names; the last two are the type and the help
            column.no_wrap = True


typer.rich_utils.Table = _WholeNamesTable  # typer builds each panel's table by this name (typer < 0.29)

app = typer.Typer(
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    rich_markup_mode="rich",
    context_settings={"max_content_width": 120},
    help="Fast, careful Whisper speech-to-text. Files, folders, globs or a pipe in; txt, srt, vtt, json out.",
)
app.command(epilog=EXAMPLES)(transcribe)
app.command(epilog=serve_command.EXAMPLES)(serve_command.serve)
app.command(epilog="[b]Examples[/b]\n\n  ferrum info\n  ferrum info --model tiny.en --json")(describe.info)
app.command(epilog="[b]Examples[/b]\n\n  ferrum status\n  ferrum status --json")(describe.status)
WARMUP_EXAMPLES = "\n  ".join(
    ("ferrum warmup", "ferrum warmup --model tiny.en --device cpu --json", "ferrum warmup --diarize")
)
app.command(epilog=f"[b]Examples[/b]\n\n  {WARMUP_EXAMPLES}")(describe.warmup)


class _WarningHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        err.print(f"[yellow]warning:[/] {escape(record.getMessage())}")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ferrum {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
) -> None:
    state["debug"] = debug
    log = logging.getLogger("ferrum")
    if not log.handlers:
        log.addHandler(_WarningHandler())
        log.setLevel(logging.INFO)


def main() -> None:
    """The console script. A usage error is one line and exit 2. Once the output is flushed the
    process ends at once: the interpreter's teardown (torch's, mostly) has nothing left to do."""
    readable_stdout()
    try:
        code = app(standalone_mode=False)
    except SystemExit as exc:
        code = exc.code
    except BrokenPipeError:
        code = quiet_broken_pipe()
    except FerrumError as exc:  # raised outside call(): stdout that cannot take a report
        err.print(f"[red]error:[/] {escape(exc.message)}")
        code = exc.exit_code
    except OSError as exc:  # outside every command's own handling: help onto a full disk
        where = f"{exc.filename}: " if exc.filename else ""
        err.print(f"[red]error:[/] {escape(where + str(exc.strerror or exc))}")
        code = 1
    except Exception as exc:
        code = _click_error(exc)
    if code is not None and not isinstance(code, int):  # sys.exit("message"): as Python ends it
        print(code, file=sys.stderr)
        code = 1
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        code = quiet_broken_pipe() if not code else code
    except OSError as exc:  # what it could not take was said per input; else it is said here
        if not code:
            err.print(f"[red]error:[/] cannot write to stdout: {escape(exc.strerror or str(exc))}")
            code = 1
        quiet_broken_pipe()  # nowhere left to fail at the interpreter's last flush
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code or 0)


def _click_error(exc: Exception) -> int:
    """click's own errors (typer carries its own copy of click, so they are known by their shape):
    a bad option is one line and exit 2; anything else is not ours to hide."""
    if type(exc).__name__ == "Abort":
        return 130
    if not (hasattr(exc, "exit_code") and hasattr(exc, "format_message")):
        raise exc
    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
        typer.echo(ctx.get_help())
        return exc.exit_code
    hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
    err.print(f"[red]error:[/] {escape(exc.format_message())}{escape(hint)}", markup=True, highlight=False)
    return exc.exit_code
