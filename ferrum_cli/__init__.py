"""ferrum-cli: fast, careful Whisper speech-to-text. The library's API is here: the executor,
its options and its results, the writers' table, ffmpeg's AudioStream, raw PCM's decoder and
the turns of live speech (PcmDecoder, InputBuffer), and the long-lived engine (EngineService)
with its Ticket and audio_opener; ferrum_cli.errors has the typed errors. The
CLI, the server and the cluster's workers use only this, the modules it names, and
ferrum_cli.executor (tests/test_layout.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .audio.constants import SAMPLE_RATE
from .audio.ffmpeg import AudioStream
from .audio.pcm import PcmDecoder, PcmFormat
from .audio.turns import InputBuffer, SpeechStarted, SpeechStopped, Turn, TurnSettings
from .options import TranscribeOptions, VadOptions
from .platform import deferred_numba
from .results import Segment, Transcription
from .writers import FORMATS, WRITERS, SubtitleLayout, render

__version__ = "0.1.0"

deferred_numba.install()

if TYPE_CHECKING:
    from .engine.service import EngineService, Ticket
    from .executor import WhisperModelExecutor, audio_opener

__all__ = [
    "FORMATS", "SAMPLE_RATE", "WRITERS", "AudioStream", "EngineService", "InputBuffer", "PcmDecoder", "PcmFormat",
    "Segment", "SpeechStarted", "SpeechStopped", "SubtitleLayout", "Ticket", "TranscribeOptions", "Transcription",
    "Turn", "TurnSettings", "VadOptions", "WhisperModelExecutor", "__version__", "audio_opener", "render",
]  # fmt: skip


def __getattr__(name: str):
    # torch is imported only when the engine is used, so `ferrum --help` stays fast
    if name in ("WhisperModelExecutor", "audio_opener"):
        from . import executor

        return getattr(executor, name)
    if name in ("EngineService", "Ticket"):
        from .engine import service

        return getattr(service, name)
    raise AttributeError(name)
