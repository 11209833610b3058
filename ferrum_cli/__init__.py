"""ferrum-cli: fast, careful Whisper speech-to-text. The library's API is here: the executor,
its options and its results; ferrum_cli.errors has the typed errors."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .options import TranscribeOptions, VadOptions
from .platform import deferred_numba
from .results import Segment, Transcription

__version__ = "0.1.0"

deferred_numba.install()

if TYPE_CHECKING:
    from .executor import WhisperModelExecutor

__all__ = ["Segment", "TranscribeOptions", "Transcription", "VadOptions", "WhisperModelExecutor", "__version__"]


def __getattr__(name: str):
    # torch is imported only when the executor is used, so `ferrum --help` stays fast
    if name == "WhisperModelExecutor":
        from .executor import WhisperModelExecutor

        return WhisperModelExecutor
    raise AttributeError(name)
