"""What a transcription gives back: segments of text with their times, and the input's language."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class Word:
    """One word with its time, as the engine aligned it to the audio."""

    word: str  # with its leading space, as in the segment's text
    start: float  # seconds from the start of the input
    end: float
    probability: float | None  # the mean probability of its tokens; None: times only (word_probabilities)
    speaker: str | None = None  # with diarization: who said it
    tokens: tuple[int, ...] = field(default=(), compare=False)  # its tokens, where known (not written out)

    def to_dict(self) -> dict:
        record = {"word": self.word, "start": self.start, "end": self.end, "probability": self.probability}
        return record if self.speaker is None else {**record, "speaker": self.speaker}


@dataclass
class Segment:
    """A stretch of text as Whisper closed it between two timestamps."""

    id: int  # position in its transcription, from 0
    start: float  # seconds from the start of the input
    end: float
    text: str  # with Whisper's leading space
    tokens: list[int]  # the text's tokens
    avg_logprob: float  # of the window the segment came from; of the input's own tokens where it was packed
    no_speech_prob: float
    compression_ratio: float  # of the window's text; of the input's own text where it was packed
    temperature: float  # the temperature the window was decoded at
    words: list[Word] | None = None  # with --word-timestamps
    language: str | None = None  # with --multilingual: the language of its window
    speaker: str | None = None  # with diarization: who said it
    token_logprobs: list[float] | None = field(default=None, compare=False)  # one a token, as decoded (not written out)

    def to_dict(self) -> dict:
        record = {k: v for k, v in asdict(self).items() if v is not None or k not in ("words", "language", "speaker")}
        record.pop("token_logprobs")
        if self.words is not None:
            record["words"] = [word.to_dict() for word in self.words]
        return record


@dataclass(frozen=True)
class SpeakerTurn:
    """A stretch of one speaker's speech, as diarization heard it (text or not)."""

    start: float  # seconds from the start of the input
    end: float
    speaker: str  # the label its segments carry


@dataclass
class Transcription:
    """The result for one input."""

    text: str  # the segments' text joined
    segments: list[Segment]
    language: str  # "und" exactly when no speech was found
    language_probability: float
    duration: float  # seconds of audio read
    options: dict = field(default_factory=dict)  # the options used, and the engine
    warnings: list[str] = field(default_factory=list)  # about the input (ffmpeg's, a truncated file)
    peak: float = 0.0  # the input's largest absolute sample, full scale 1.0
    turns: list[SpeakerTurn] = field(default_factory=list)  # with diarization: who spoke when
    name: str | None = None  # the input's name, where a writer needs one (rttm's file id)
    # VAD's speech probability per 32 ms frame, from the engine to the stage after it (diarization
    # reads speech with thresholds of its own instead of running VAD again); not written out
    speech_frames: np.ndarray | None = field(default=None, compare=False, repr=False)

    @property
    def speech(self) -> bool:
        """Whether any speech was transcribed; without it the caller must be told (no_speech_warning)."""
        return bool(self.segments)

    def no_speech_warning(self) -> str | None:
        """The one line that says an input gave no text, with its level, so that no audio is lost unseen."""
        if self.speech:
            return None
        level = f"{20 * math.log10(self.peak):.0f}" if self.peak > 0 else "-inf"
        return f"no speech found (peak {level} dBFS)"

    def to_dict(self) -> dict:
        """The shape openai-whisper's writers read."""
        return {
            "text": self.text,
            "segments": [s.to_dict() for s in self.segments],
            "language": self.language,
            "language_probability": self.language_probability,
            "duration": self.duration,
            "speech": self.speech,
            "options": self.options,
        }
