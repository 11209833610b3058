"""What every command shares: the stderr console, and one clean line for every error."""

from __future__ import annotations

import codecs
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.markup import escape

from ..errors import FerrumError, OutputError, out_of_memory

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
        fail(out_of_memory(exc) or FerrumError(f"internal error: {type(exc).__name__}: {exc}".splitlines()[0]))


def quiet_broken_pipe() -> int:
    """The reader of stdout went away (e.g. `| head`): stop quietly, with success. stdout goes to
    /dev/null, so that the interpreter's last flush finds nowhere to fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 0


UNICODE_ENCODINGS = {"utf-8", "utf-16", "utf-32", "gb18030"}  # those that can write any text
UNSHOWN = "ferrum-unshown"  # the error handler of a stdout that cannot write every character


def readable_stdout() -> None:
    """Text in any script reaches stdout, whatever its encoding. Where that is not Unicode (a
    legacy locale; Windows' code page for a redirect), a pipe or file gets UTF-8, as ferrum's
    own files do. A terminal, or an encoding named in PYTHONIOENCODING, keeps its encoding,
    with '?' for what it cannot write and one warning, rather than a failed file. A file name
    that is not UTF-8 (rttm's ids) goes out as its own bytes, as Python read them."""
    stream = sys.stdout
    try:
        encoding = codecs.lookup(stream.encoding).name
    except (AttributeError, LookupError, TypeError):
        return
    if not hasattr(stream, "reconfigure") or stream.errors not in ("strict", "surrogateescape"):
        return  # not a text file of Python's own, or an error handler the user chose
    if encoding in UNICODE_ENCODINGS:
        stream.reconfigure(errors="surrogateescape")
    elif not stream.isatty() and "PYTHONIOENCODING" not in os.environ:
        stream.reconfigure(encoding="utf-8", errors="surrogateescape")
    else:
        codecs.register_error(UNSHOWN, _unshown)
        stream.reconfigure(errors=UNSHOWN)


_told: list[str] = []


def _unshown(error: UnicodeEncodeError) -> tuple[str, int]:
    if not _told:
        _told.append(error.encoding)
        err.print(
            f"[yellow]warning:[/] stdout's encoding ({error.encoding}) cannot write some of the text: "
            "'?' stands for it there; -o writes files in UTF-8"
        )
    return "?" * (error.end - error.start), error.end


@contextmanager
def writing_stdout() -> Iterator[None]:
    """Around writes to stdout: one that cannot take them (a full disk) is an OutputError, for
    the input whose text it is; a reader gone away (| head) stays a BrokenPipeError, which ends
    the batch quietly."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise OutputError(f"cannot write to stdout: {exc.strerror or exc}") from None


def write_stdout(*texts: str) -> None:
    """Results onto stdout, flushed."""
    with writing_stdout():
        for text in texts:
            sys.stdout.write(text)
        sys.stdout.flush()
