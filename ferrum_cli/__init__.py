"""ferrum-cli: fast, careful Whisper speech-to-text on the command line."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import deferred_numba

__version__ = "0.1.0"

deferred_numba.install()

if TYPE_CHECKING:
    from .executor import WhisperModelExecutor

__all__ = ["WhisperModelExecutor", "__version__"]


def __getattr__(name: str):
    # torch is imported only when the executor is used, so `ferrum --help` stays fast
    if name == "WhisperModelExecutor":
        from .executor import WhisperModelExecutor

        return WhisperModelExecutor
    raise AttributeError(name)
