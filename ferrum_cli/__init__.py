"""ferrum-cli: fast, careful Whisper speech-to-text. The library's API is here: the executor,
its options and its results, the writers' table, and the long-lived engine (EngineService) with
its Ticket; ferrum_cli.errors has the typed errors."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .options import TranscribeOptions, VadOptions
from .platform import deferred_numba
from .results import Segment, Transcription
from .writers import FORMATS, WRITERS, SubtitleLayout, render

__version__ = "0.1.0"

deferred_numba.install()

if TYPE_CHECKING:
    from .engine.service import EngineService, Ticket
    from .executor import WhisperModelExecutor

__all__ = [
    "FORMATS", "WRITERS", "EngineService", "Segment", "SubtitleLayout", "Ticket", "TranscribeOptions", "Transcription",
    "VadOptions", "WhisperModelExecutor", "__version__", "render",
]  # fmt: skip


def __getattr__(name: str):
    # torch is imported only when the engine is used, so `ferrum --help` stays fast
    if name == "WhisperModelExecutor":
        from .executor import WhisperModelExecutor

        return WhisperModelExecutor
    if name in ("EngineService", "Ticket"):
        from .engine import service

        return getattr(service, name)
    raise AttributeError(name)
