"""Speakers labelled while a live stream goes on: the voices of each stretch the engine has
decoded are told apart by the diarizer, then matched to the voices heard before (cosine
similarity at or above SAME_VOICE) or taken as new speakers. A label, once shown, stays."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..audio.constants import SAMPLE_RATE
from ..results import Segment, SpeakerTurn, Transcription
from . import diarizer
from .diarizer import SpeakerCount, Turn
from .speakers import assign_speakers, label


@dataclass
class Voice:
    """A speaker of the stream: their label, and their stretches' voices summed, each weighted
    by the seconds it was heard (None until a voice of theirs is heard)."""

    label: str
    total: np.ndarray | None = None

    def similarity(self, voice: np.ndarray) -> float:
        if self.total is None:
            return -1.0
        return float(self.total @ voice / (np.linalg.norm(self.total) * np.linalg.norm(voice)))

    def add(self, voice: np.ndarray, seconds: float) -> None:
        heard = np.asarray(voice, np.float64) / np.linalg.norm(voice) * seconds
        self.total = heard if self.total is None else self.total + heard


class LiveSpeakers:
    """The speakers of one live stream, labelled stretch by stretch."""

    def __init__(
        self,
        count: SpeakerCount,
        names: tuple[str, ...] = (),
        known: dict[str, np.ndarray] | None = None,
        device: str = "cpu",
    ) -> None:
        """count: at most `exactly` or `at_most` speakers (a voice past them goes to the most
        alike); known: voices to name, matched like any other before a new speaker is made."""
        self.limit = count.exactly or count.at_most
        self.names, self.device = names, device
        self.voices: list[Voice] = []
        for name, voice in (known or {}).items():
            self.voices.append(Voice(name))
            self.voices[-1].add(voice, 1.0)
        self.unnamed = 0  # speakers labelled SPEAKER_NN (or by --speaker-names) so far
        self.segments: list[Segment] = []  # the stream's segments labelled so far, split at changes
        self.turns: list[SpeakerTurn] = []
        self.taken = 0  # the engine's segments labelled so far

    def label_new(self, result: Transcription, samples: np.ndarray) -> list[Segment]:
        """Labels the segments of `result` (the stream so far) that are not labelled yet, hearing
        their span of `samples` (the stream's audio so far); returns them, split where the
        speaker changes."""
        new = result.segments[self.taken :]
        if not new:
            return []
        self.taken = len(result.segments)
        start, end = new[0].start, new[-1].end
        stretch = np.array(samples[int(start * SAMPLE_RATE) : int(end * SAMPLE_RATE) + 1], dtype=np.float32)
        turns = self._turns(stretch, start) or [Turn(start, end, self._speaker_before())]
        labels = {i: voice.label for i, voice in enumerate(self.voices)}
        stretch_result = assign_speakers(replace(result, segments=new), turns, known=labels)
        self.turns += stretch_result.turns
        labelled = [replace(s, id=len(self.segments) + i) for i, s in enumerate(stretch_result.segments)]
        self.segments += labelled
        return labelled

    def result(self, result: Transcription) -> Transcription:
        """The stream so far (label_new has seen `result`) with the labels given as it went."""
        labelled = replace(result, segments=list(self.segments))
        labelled.turns = list(self.turns)
        return labelled

    def _turns(self, stretch: np.ndarray, start: float) -> list[Turn]:
        """The stretch's turns, speakers numbered as self.voices (new ones added); [] when no
        voice is heard. With too little speech to tell voices apart, one voice: the longest heard."""
        if len(stretch) < SAMPLE_RATE // 2:
            return []
        found = diarizer.diarize(stretch, SpeakerCount(), self.device)
        heard: dict[int, float] = {}
        for turn in found.turns:
            heard[turn.speaker] = heard.get(turn.speaker, 0.0) + turn.end - turn.start
        voiced = [s for s in dict.fromkeys(t.speaker for t in found.turns) if s in found.voices]  # as first heard
        if not voiced:
            return []
        if sum(heard.values()) < diarizer.MIN_SPEECH_SECONDS:
            longest = max(voiced, key=heard.get)
            speaker = self._match({longest: found.voices[longest]}, {longest: sum(heard.values())})[longest]
            return [Turn(start + t.start, start + t.end, speaker) for t in found.turns]
        mapping = self._match({s: found.voices[s] for s in voiced}, heard)
        return [Turn(start + t.start, start + t.end, mapping[t.speaker]) for t in found.turns if t.speaker in mapping]

    def _match(self, voices: dict[int, np.ndarray], seconds: dict[int, float]) -> dict[int, int]:
        """{stretch's speaker: stream's speaker}. The diarizer told the stretch's voices apart, so
        each takes a different speaker heard before, the most alike pairs first, at SAME_VOICE or
        above; the others are new speakers, or past the count the most alike."""
        pairs = sorted(
            ((voice.similarity(voices[s]), s, i) for s in voices for i, voice in enumerate(self.voices)), reverse=True
        )
        mapping: dict[int, int] = {}
        for score, s, i in pairs:
            if score >= diarizer.SAME_VOICE and s not in mapping and i not in mapping.values():
                mapping[s] = i
        for s in voices:
            if s not in mapping:
                if self._room():
                    mapping[s] = self._new_speaker()
                else:
                    mapping[s] = max(range(len(self.voices)), key=lambda i: self.voices[i].similarity(voices[s]))
        for s, i in mapping.items():
            self.voices[i].add(voices[s], seconds[s])
        return mapping

    def _new_speaker(self) -> int:
        self.voices.append(Voice(label(self.unnamed, self.names)))
        self.unnamed += 1
        return len(self.voices) - 1

    def _speaker_before(self) -> int:
        """For a stretch with no voice heard in it: who spoke last, or a first speaker."""
        if self.segments:
            return next(i for i, v in enumerate(self.voices) if v.label == self.segments[-1].speaker)
        return self._new_speaker() if self._room() else 0

    def _room(self) -> bool:
        """Whether the count allows another speaker."""
        return self.limit is None or len(self.voices) < self.limit
