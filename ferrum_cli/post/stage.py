"""The stage between the engine and every writer: what is done to one input's transcription
after the engine has decoded it. The CLI, the server, live mode and the cluster's workers all
reach the writers through it (the executor and the engine service apply it).

Its steps run in order: speakers (diarization) onto the words the engine timed, then the words
dropped again where only the speakers needed them. A new step (punctuation, merging short
segments) goes in steps().
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

import numpy as np

from ..audio.ffmpeg import decode_bytes
from ..audio.spool import AudioSpool
from ..errors import FerrumError, UsageError
from ..options import POST_FIELDS, TranscribeOptions
from ..results import Segment, Transcription
from . import diarizer
from .diarizer import Turn
from .live_speakers import LiveSpeakers
from .speakers import assign_speakers, match_known

AudioOpener = Callable[[], Iterable[np.ndarray]]
TELLING_SPEAKERS_APART = "telling speakers apart"  # the diarization step, as progress names it


class PostProcess:
    """The stage for one input. tap() its audio opener before the engine opens it, so that a step
    that needs the audio (diarization) has it; apply() the engine's result; close() always."""

    def __init__(self, options: TranscribeOptions, device: str = "cpu", live: bool = False) -> None:
        """live: the input is a live stream, whose speakers are labelled stretch by stretch (partial)."""
        self.options, self.device = options, device
        self.engine_options = options.for_engine()
        self._spool = AudioSpool() if self.runs_for(options) else None
        self._known_samples = self._decode_known() if self.runs_for(options) else {}
        if options.diarize:
            diarizer.preload(device)
        self.live_speakers: LiveSpeakers | None = None
        if options.diarize and live:
            count = diarizer.SpeakerCount(options.speakers, options.min_speakers, options.max_speakers)
            known = self._known_voices() if options.known_speakers else {}
            self.live_speakers = LiveSpeakers(count, options.speaker_names, known, device)

    @staticmethod
    def runs_for(options: TranscribeOptions) -> bool:
        """Whether these options have a step after the engine; without one, its result is final."""
        return options.diarize

    @property
    def reads_speech(self) -> bool:
        """Whether a step reads where speech is (diarization of a whole input): the engine then
        hands on its VAD's frame probabilities, and the step does not run VAD again."""
        return self.options.diarize and self.live_speakers is None

    @property
    def idle(self) -> bool:
        """No step to run: the engine's result is final."""
        return not self.runs_for(self.options)

    def tap(self, open_audio: AudioOpener) -> AudioOpener:
        return self._spool.tap(open_audio) if self._spool else open_audio

    def apply(self, result: Transcription, on_step: Callable[[str], None] | None = None) -> Transcription:
        """on_step: the name of each step that takes a while, as it begins (the CLI's progress shows it)."""
        try:
            for name, step in self.steps():
                if name and on_step:
                    on_step(name)
                result = step(result)
            return result
        finally:
            self.close()

    def steps(self) -> list[tuple[str | None, Callable[[Transcription], Transcription]]]:
        """(what it is doing, for the user; None for a step too quick to name, the step) in order."""
        if self.idle:
            return []
        speakers = self._speakers if self.live_speakers is None else self._live_speakers
        return [(TELLING_SPEAKERS_APART, speakers), (None, self._record), (None, self._words_as_asked)]

    def partial(self, result: Transcription) -> tuple[Transcription, list[Segment]]:
        """A live stream so far through the steps, its new segments labelled; and those segments,
        as the writers get them."""
        told = self.told
        for _, step in self.steps():
            result = step(result)
        return result, result.segments[told:]

    @property
    def told(self) -> int:
        """Segments already handed on by partial(): apply() hands on the ones after them."""
        return len(self.live_speakers.segments) if self.live_speakers is not None else 0

    def close(self) -> None:
        if self._spool:
            self._spool.close()

    # -- the steps -----------------------------------------------------------------------

    def _speakers(self, result: Transcription) -> Transcription:
        """Turns even where Whisper gave no text (rttm says who spoke); with too little speech to
        tell voices apart, one speaker and a warning."""
        samples = self._spool.samples()
        opts = self.options
        count = diarizer.SpeakerCount(opts.speakers, opts.min_speakers, opts.max_speakers)
        frames, result = result.speech_frames, replace(result, speech_frames=None)
        found = diarizer.diarize(samples, count, self.device, frames)
        del samples, frames
        turns = found.turns
        heard = sum(t.end - t.start for t in turns)
        if not result.segments and not turns:
            return result  # silence: no speakers, and the no-speech warning says so
        if heard < diarizer.MIN_SPEECH_SECONDS and result.segments:
            result.warnings.append(
                f"too little speech to tell speakers apart ({heard:.1f} s; diarization needs "
                f"{diarizer.MIN_SPEECH_SECONDS:.0f} s): all of it is given to one speaker"
            )
            spans = [(t.start, t.end) for t in turns] or [(s.start, s.end) for s in result.segments]
            return assign_speakers(result, [Turn(a, b, 0) for a, b in spans], opts.speaker_names)
        wanted, told = opts.speakers or opts.min_speakers, len({t.speaker for t in turns})
        if wanted and told < wanted:
            result.warnings.append(f"{told} speakers told apart where {wanted} were asked for: too little speech")
        known = match_known(found.voices, self._known_voices(), diarizer.SAME_VOICE) if opts.known_speakers else {}
        return assign_speakers(result, turns, opts.speaker_names, known)

    def _live_speakers(self, result: Transcription) -> Transcription:
        """The labels given as the stream went, with the segments not labelled yet labelled now."""
        samples = self._spool.samples()
        self.live_speakers.label_new(result, samples)
        del samples
        return self.live_speakers.result(result)

    def _decode_known(self) -> dict[str, np.ndarray]:
        """The known speakers' samples, decoded before any work, so that one that is not audio
        fails the input at once rather than after its transcription."""
        decoded = {}
        for known in self.options.known_speakers:
            try:
                decoded[known.name] = decode_bytes(known.reference).samples
            except FerrumError as exc:
                raise UsageError(f"the sample of known speaker {known.name!r} is not audio: {exc.message}") from None
        return decoded

    def _known_voices(self) -> dict[str, np.ndarray]:
        voices = {}
        for name, samples in self._known_samples.items():
            voice = diarizer.voice_of(samples, self.device)
            if voice is None:
                raise UsageError(f"the sample of known speaker {name!r} has no speech")
            voices[name] = voice
        return voices

    def _record(self, result: Transcription) -> Transcription:
        post = {k: v for k, v in self.options.record().items() if k in POST_FIELDS}
        asked = {"word_timestamps": self.options.word_timestamps, "word_probabilities": self.options.word_probabilities}
        return replace(result, options={**result.options, **post, **asked})

    def _words_as_asked(self, result: Transcription) -> Transcription:
        """Words were timed for the speakers; they are written out only when asked for."""
        if self.options.word_timestamps:
            return result
        return replace(result, segments=[replace(s, words=None) for s in result.segments])
