"""What every engine is: inputs submitted, one batch a step, each input's result handed back
once it is done, and what happens meanwhile told through the events given at construction.

Two engines implement it: the batched engine (batched.py, the default) and openai-whisper's
sequential loop (sequential.py: --sequential). The engine
service (service.py) is the one driver of both, for the CLI, the server and the cluster's workers.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from ..errors import FerrumError
    from ..results import Segment, Transcription

AudioOpener = Callable[[], Iterable[np.ndarray]]


@dataclass(frozen=True)
class SourceRequest:
    """An input for an engine, with the options a caller may set per input (the server's requests)."""

    key: object  # handed back with the input's events and result
    open_audio: AudioOpener  # gives the input's audio chunks, float32 16 kHz mono
    language: str | None = None  # None: the engine's option, else detected
    word_timestamps: bool = False  # time this input's words even if the engine's options do not
    live: bool = False  # audio arriving in real time: each stretch of speech decoded as soon as it ends
    word_probabilities: bool = True  # with word times, each word's probability (False: times only)
    speech_frames: bool = False  # the result keeps VAD's frame probabilities (for diarization's own reading)


@dataclass(frozen=True)
class EngineEvents:
    """What an engine tells its driver while it works, on the engine's thread; each is optional.
    `key` is the SourceRequest's."""

    on_segment: Callable[[object, Segment, str], None] | None = None  # a final segment and its input's language
    on_progress: Callable[[object, float], None] | None = None  # seconds of the input decoded so far
    on_partial: Callable[[object, Transcription], None] | None = None  # a live input so far, after new segments
    on_live_ready: Callable[[], None] | None = None  # a live input has a stretch to decode (its reader's thread)


class Engine(Protocol):
    """One model and one set of options; submit() inputs, step() until not busy."""

    last_batch: int  # windows the last step decoded; 0: it had nothing ready (live inputs wait for sound)

    def submit(self, request: SourceRequest) -> None:
        """Queue an input; a later step opens it."""

    @property
    def busy(self) -> bool:
        """Inputs submitted and not yet handed back."""

    def step(self) -> list[tuple[object, Transcription | FerrumError]]:
        """Decode one batch; (key, result or the input's error) for each input that is now done."""

    def cancel(self, key: object) -> bool:
        """Forget an input and close its audio; False if it is not here."""

    def expect_inputs(self, more: bool) -> None:
        """Whether the caller is to submit more soon: False once its list has ended or pauses."""


def withdraw(inbox: deque[SourceRequest], key) -> bool:
    """Take the request of `key` out of an engine's inbox (submitted, not yet opened); False if it is not there."""
    for request in inbox:
        if request.key is key:
            inbox.remove(request)
            return True
    return False
