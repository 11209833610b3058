"""Turns of speech in audio that arrives piece by piece, as OpenAI's server VAD finds them: a
turn starts where Silero hears speech (with prefix_padding_ms of the audio before it) and stops
after silence_duration_ms without it. Between turns only that padding is kept, so an endless
stream of silence holds no memory; a turn that runs MAX_TURN_SECONDS is cut at its quietest
point, so that each fits Whisper's window and its text comes while the speaker goes on.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from ..platform.cpu import single_threaded
from .constants import SAMPLE_RATE, VAD_FRAME
from .level import REACH, frame_levels, gain_to_normal
from .windows import quietest_cut

MAX_TURN_SECONDS = 28.0  # a turn this long is cut: one Whisper window, and text while the speaker goes on
CUT_SEARCH_SECONDS = 8.0  # the cut of a long turn falls in the quietest pause of its last seconds
HYSTERESIS = 0.15  # once speech has started, frames down to threshold - this still count as speech (Silero's own rule)


@dataclass(frozen=True)
class TurnSettings:
    """OpenAI's server_vad settings."""

    threshold: float = 0.5  # Silero's speech probability at or above which a frame is speech
    prefix_padding_ms: int = 300  # audio before the speech that the turn opens with
    silence_duration_ms: int = 500  # silence that ends a turn


@dataclass(frozen=True)
class Turn:
    """Audio of one turn (or of one commit), with its place in the stream."""

    start_ms: int  # from the start of all audio the stream has received
    end_ms: int
    samples: np.ndarray  # 16 kHz mono float32


@dataclass(frozen=True)
class SpeechStarted:
    start_ms: int  # the turn's start, its prefix padding included


@dataclass(frozen=True)
class SpeechStopped:
    turn: Turn


class InputBuffer:
    """A stream's audio not yet committed. With TurnSettings, feed() finds turns and commits each
    itself; with None, audio is held until the caller commits it."""

    def __init__(self, turns: TurnSettings | None = None) -> None:
        self.turns = turns
        self.received = 0  # samples received since the stream began
        self._held: list[np.ndarray] = []
        self._held_from = 0  # the stream's sample at which the held audio begins
        self._unread = np.zeros(0, np.float32)  # audio the VAD has not read yet (under one frame)
        self._levels: deque[float] = deque(maxlen=REACH)
        self._speech_from: int | None = None  # the turn in progress: where it begins
        self._silent = 0
        self._vad = None

    @property
    def held_seconds(self) -> float:
        return (self.received - self._held_from) / SAMPLE_RATE

    @property
    def speaking(self) -> bool:
        return self._speech_from is not None

    def feed(self, samples: np.ndarray) -> list[SpeechStarted | SpeechStopped]:
        """Hold the samples; with turn detection, the turns they start and stop."""
        if len(samples):
            self._held.append(samples)
        self.received += len(samples)
        if self.turns is None:
            return []
        events: list[SpeechStarted | SpeechStopped] = []
        unread = np.concatenate([self._unread, samples])
        whole = len(unread) // VAD_FRAME * VAD_FRAME
        first = self.received - len(unread)  # the stream's sample of unread[0]
        for at in range(0, whole, VAD_FRAME):
            events.extend(self._frame(unread[at : at + VAD_FRAME], first + at + VAD_FRAME))
        self._unread = unread[whole:]
        if not self.speaking:
            self._keep_padding()
        return events

    def commit(self) -> Turn:
        """All held audio, as the client commits it (a turn in progress ends here)."""
        turn = self._take(self._speech_from if self.speaking else self._held_from, self.received)
        self._speech_from, self._silent = None, 0
        return turn

    def clear(self) -> None:
        self._held, self._held_from = [], self.received
        self._speech_from, self._silent = None, 0

    def _frame(self, frame: np.ndarray, end: int) -> list[SpeechStarted | SpeechStopped]:
        settings = self.turns
        probability = self._speech_probability(frame)
        if not self.speaking:
            if probability < settings.threshold:
                return []
            pad = settings.prefix_padding_ms * SAMPLE_RATE // 1000
            self._speech_from, self._silent = max(self._held_from, end - VAD_FRAME - pad), 0
            return [SpeechStarted(_ms(self._speech_from))]
        self._silent = self._silent + VAD_FRAME if probability < settings.threshold - HYSTERESIS else 0
        if self._silent >= settings.silence_duration_ms * SAMPLE_RATE // 1000:
            turn = self._take(self._speech_from, end)
            self._speech_from, self._silent = None, 0
            return [SpeechStopped(turn)]
        if end - self._speech_from >= MAX_TURN_SECONDS * SAMPLE_RATE:
            held = self._audio(self._speech_from, end)
            cut = self._speech_from + quietest_cut(held, len(held) - int(CUT_SEARCH_SECONDS * SAMPLE_RATE), len(held))
            turn = self._take(self._speech_from, cut)
            self._speech_from = cut
            return [SpeechStopped(turn), SpeechStarted(_ms(cut))]
        return []

    def _speech_probability(self, frame: np.ndarray) -> float:
        """Silero's, on the frame raised as the loudest of the second before it allows (files look both ways)."""
        import torch

        self._levels.append(float(frame_levels(frame)[0]))
        gain = float(gain_to_normal(np.array([max(self._levels)]))[0])
        with single_threaded(), torch.no_grad(), torch.jit.optimized_execution(False):
            if self._vad is None:
                from .vad import _silero

                self._vad = _silero().load_silero_vad()  # its own: Silero keeps state from frame to frame
            raised = np.clip(frame * gain, -1.0, 1.0) if gain > 1.0 else frame
            return float(self._vad(torch.from_numpy(np.ascontiguousarray(raised)), SAMPLE_RATE))

    def _audio(self, start: int, end: int) -> np.ndarray:
        held = np.concatenate(self._held) if len(self._held) != 1 else self._held[0]
        self._held = [held] if len(held) else []
        return held[start - self._held_from : end - self._held_from]

    def _take(self, start: int, end: int) -> Turn:
        """The audio [start, end) as a turn, and everything held before end let go."""
        samples = self._audio(start, end).copy()
        rest = self._audio(end, self.received)
        self._held, self._held_from = ([rest] if len(rest) else []), end
        return Turn(_ms(start), _ms(end), samples)

    def _keep_padding(self) -> None:
        """Between turns, only what the next turn could open with."""
        keep = self.turns.prefix_padding_ms * SAMPLE_RATE // 1000 + VAD_FRAME
        if self.received - self._held_from > 2 * keep:
            rest = self._audio(self.received - keep, self.received).copy()
            self._held, self._held_from = [rest], self.received - keep


def _ms(sample: int) -> int:
    return sample * 1000 // SAMPLE_RATE
