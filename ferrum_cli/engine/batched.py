"""The batched engine, the default: windows of speech cut at pauses, from any number of
sources, encoded and decoded together, several at a time. Memory stays flat because windows
are cut from a stream as it is read.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from ..audio.constants import SAMPLE_RATE, TIMESTAMP_SAMPLES, WINDOW_SAMPLES
from ..audio.live import LiveWindows
from ..audio.vad import SpeechFrames, speech_after, speech_regions, speech_within
from ..audio.windows import PACK_GAP, plan_whole, plan_windows, side_by_side
from ..errors import FerrumError
from ..options import TranscribeOptions, VadOptions
from ..results import Segment, Transcription
from .decoding import pack_decoder_ahead
from .encoder import encode_windows, plan_compute
from .fallback import decode_with_fallback, is_loop, is_silence, is_unsure, needs_fallback
from .interface import EngineEvents, SourceRequest, withdraw
from .language import detect_language, window_languages
from .segments import repeats_the_end, segments_from_tokens
from .tokenizer import get_tokenizer
from .words import AlignmentRow, align_batch, place_words, snap_to_speech, typed_words

if TYPE_CHECKING:
    import torch

TIMESTAMPS = WINDOW_SAMPLES // TIMESTAMP_SAMPLES + 1  # Whisper's timestamp tokens in a window
GO_ON_SPEECH = 2 * SAMPLE_RATE  # speech left after a timestamp at which end-of-text is not allowed
TAIL_SPEECH = SAMPLE_RATE // 2  # speech that makes the rest of an early-ended window worth a second look
HOP_LENGTH = SAMPLE_RATE // 100  # samples per mel frame
STRADDLE = SAMPLE_RATE // 5  # speech of a second packed input under a segment that makes it theirs too
PACKED_SURE_LOGPROB = -0.5  # a packed input's own tokens' mean log probability under which it is decoded alone


class CountedChunks:
    """Passes chunks through and counts their samples and their peak: the duration and level of a stream."""

    def __init__(self, chunks: Iterable[np.ndarray]) -> None:
        self.chunks, self.samples, self.peak = chunks, 0, 0.0

    def __iter__(self) -> Iterator[np.ndarray]:
        for chunk in self.chunks:
            self.samples += len(chunk)
            if len(chunk):
                self.peak = max(self.peak, float(np.abs(chunk).max()))
            yield chunk


@dataclass
class Source:
    """One input of the engine: its planned windows, its language, what has been decoded."""

    key: object
    requested_language: str | None = None
    word_timestamps: bool = False
    live: bool = False  # windows come from LiveWindows, as the speaker talks
    word_probabilities: bool = True  # with word times, each word's probability (False: times only)
    detect_on_read: bool = False  # live, language not given: detected on its first window
    counted: CountedChunks | None = None
    windows: Iterator[tuple[float, np.ndarray]] | None = None  # (offset seconds, samples), planned as read
    language: str = "und"
    probability: float = 0.0
    segments: list[Segment] = field(default_factory=list)  # in time order, handed on
    found: list[Segment] = field(default_factory=list)  # decoded, not yet in segments
    error: FerrumError | None = None
    reading: bool = True  # more windows may come
    pending: int = 0  # windows queued or being decoded
    speech: list[tuple[int, int]] = field(default_factory=list)  # VAD's, unpadded, absolute samples
    planned_to: float = 0.0  # seconds: where the last window queued ends; those after it start there or later
    short: np.ndarray | None = None  # the audio of an input read whole, until its windows are planned
    cancelled: bool = False  # its text, still decoded in a packed window, is dropped
    packed: bool = False  # its text was read in a window shared with other inputs
    frames: SpeechFrames | None = None  # VAD's probabilities, kept where the request asks for them

    @property
    def done(self) -> bool:
        return not self.reading and self.pending == 0

    def forget_speech_before(self, sample: int) -> None:
        """Drop the speech regions that end before `sample`, where no window is left to check.
        In place: the planner goes on adding to this list."""
        self.speech[:] = [region for region in self.speech if region[1] > sample]

    def result(self, options: TranscribeOptions) -> Transcription:
        text = "".join(s.text for s in self.segments).strip()
        duration = self.counted.samples / SAMPLE_RATE if self.counted else 0.0
        used = {**options.record(), "language": options.language or self.requested_language or self.language}
        used.update(engine="batched", word_timestamps=options.word_timestamps or self.word_timestamps)
        used["word_probabilities"] = options.word_probabilities and self.word_probabilities
        if self.packed:
            used["packed"] = True
        language, probability = (self.language, self.probability) if self.segments else ("und", 0.0)
        result = Transcription(text, self.segments, language, probability, duration, used)
        result.peak = self.counted.peak if self.counted else 0.0
        if self.frames is not None and self.counted:
            result.speech_frames = self.frames.covering(self.counted.samples)
        result.warnings.extend(getattr(self.counted.chunks if self.counted else None, "warnings", ()))
        if used["word_timestamps"] and options.task == "translate" and self.segments:  # as openai-whisper warns
            result.warnings.append(
                "Word-level timestamps on translations may not be reliable."
                if used["word_probabilities"]  # else words were timed only to place speakers (--diarize)
                else "speaker changes are placed at word times, which may not be reliable on translations"
            )
        return result


@dataclass
class Part:
    """A short input's window inside a packed window."""

    source: Source
    offset: float  # seconds from the start of its source
    at: int  # the sample where it starts in the packed window
    length: int  # its samples

    def speech(self) -> list[tuple[int, int]]:
        """The source's unpadded speech within this part, in samples of the packed window."""
        first = round(self.offset * SAMPLE_RATE)
        return [
            (self.at + max(a, first) - first, self.at + min(b, first + self.length) - first)
            for a, b in self.source.speech
            if b > first and a < first + self.length
        ]


@dataclass
class Window:
    """Up to 30 s of one source's samples, or of several short inputs side by side (`parts`),
    waiting for or in a batch."""

    source: Source | None  # None for a packed window: its parts name their sources
    offset: float  # seconds from the start of its source
    samples: np.ndarray
    features: torch.Tensor | None = None  # encoded already (the first windows, for the language)
    tail: bool = False  # the rest of a window Whisper ended early: a second look
    follows: str = ""  # a tail: the text of the segment it comes after
    parts: list[Part] = field(default_factory=list)  # a packed window: 1 s of silence between parts

    @property
    def end(self) -> float:
        return self.offset + len(self.samples) / SAMPLE_RATE

    @property
    def sources(self) -> list[Source]:
        return [part.source for part in self.parts] if self.parts else [self.source]

    @property
    def lead(self) -> Source:
        """The source whose language and word timing the window is decoded with: a packed
        window's parts share them."""
        return self.parts[0].source if self.parts else self.source

    def start_in(self, source: Source) -> float | None:
        """Where the window starts in `source`, seconds; None if it holds none of it."""
        if not self.parts:
            return self.offset if self.source is source else None
        return next((part.offset for part in self.parts if part.source is source), None)

    @property
    def reached(self) -> tuple[Source, float]:
        """The source whose audio the window ends with, and how far into it: for progress."""
        if not self.parts:
            return self.source, self.end
        part = self.parts[-1]
        return part.source, part.offset + part.length / SAMPLE_RATE


class BatchedEngine:
    """Windows from any number of sources share each batch; segments come back per source.

    State: `sources`, the inputs started and not yet handed back, in input order, and `queue`,
    the windows waiting for a batch. Each batch takes up to batch_size windows from the front of
    the queue, whatever sources they come from; tails (the rest of a window Whisper ended early)
    go first into the next batch. A source is handed back once its last window is decoded.

    How it reads its inputs is chosen at construction. in_order (a batch of files): one input
    is read to its end before the next is opened, so each finishes as early as it can and an
    interruption loses little. Otherwise (a server's requests): inputs submitted are opened
    before more windows are read, and windows are read from every input in turn, so a long
    input never holds a short one back.
    """

    def __init__(
        self, model, options: TranscribeOptions, events: EngineEvents = EngineEvents(), in_order: bool = False
    ) -> None:
        if not model.is_multilingual:  # as openai-whisper: an English-only model is told its language
            options = replace(options, language="en", multilingual=False)
        self.model, self.options = model, options
        self.compute = plan_compute(model, options)
        pack_decoder_ahead(model)  # while the first input is read and encoded
        self.per_window = options.multilingual and options.language is None  # a language per window
        self.decoding = replace(options, language=None if self.per_window else options.language)
        self.tokenizer = get_tokenizer(
            model.is_multilingual,
            num_languages=model.num_languages,
            language=self.decoding.language or "en",
            task=options.task,
        )
        prompt_text = options.prompt_text()
        self.prompt = self.tokenizer.encode(" " + prompt_text) if prompt_text else None
        self.events, self.in_order = events, in_order
        self.sources: list[Source] = []  # opened, not yet handed back, in the order opened
        self.queue: list[Window] = []
        self.incoming: Iterator[SourceRequest] = iter(())
        self.inbox: deque[SourceRequest] = deque()  # submitted, not yet opened
        self.last_batch = 0  # windows in the batch step() decoded last
        self.forming: list[Source] = []  # in order: short inputs opened, waiting for the next ones to share windows
        self.more_may_come = in_order  # in order, while the caller is to submit more soon (expect_inputs)

    def submit(self, request: SourceRequest) -> None:
        """Queue an input; a later step() opens it."""
        self.inbox.append(request)

    def expect_inputs(self, more: bool) -> None:
        """False: the caller's list has ended or pauses, and a row of short inputs waiting for
        its next ones goes on as it is."""
        self.more_may_come = more and self.in_order

    def _take_submitted(self) -> Iterator[SourceRequest]:
        while self.inbox:
            yield self.inbox.popleft()

    @property
    def busy(self) -> bool:
        return bool(self.inbox or self.sources or self.queue or self.forming)

    def step(self) -> list[tuple[object, Transcription | FerrumError]]:
        """Open what was submitted, decode one batch, and hand back every source that is done."""
        self.incoming = self._take_submitted()
        self._fill()
        self.last_batch = 0
        if self.queue:
            self.last_batch = min(len(self.queue), self.options.batch_size)
            last, reached = self._decode_next_batch().reached
            release_freed_memory()
            if self.events.on_progress:
                self.events.on_progress(last.key, reached)
        done = [source for source in self.sources if source.done]
        self.sources = [source for source in self.sources if not source.done]
        return [(source.key, source.error or source.result(self.decoding)) for source in done]

    def cancel(self, key) -> bool:
        """Forget an input: its windows leave the queue and its audio is closed. False if it is not here."""
        if withdraw(self.inbox, key):
            return True
        if any(source.key is key for source in self.forming):
            self.forming = [source for source in self.forming if source.key is not key]
            return True
        for source in self.sources:
            if source.key is key:
                source.cancelled = True
                self.queue[:] = [w for w in self.queue if not all(s.cancelled for s in w.sources)]
                self.sources.remove(source)
                if hasattr(source.windows, "close"):
                    source.windows.close()  # a stream stops its decoder
                return True
        return False

    # -- taking sources in ---------------------------------------------------------------

    def _fill(self) -> None:
        """Queue windows until a batch is full or no source has more."""
        while len(self.queue) < self.options.batch_size:
            if not self.in_order:
                if self._open_some():
                    continue
                progressed = False
                for source in [source for source in self.sources if source.reading]:
                    if len(self.queue) < self.options.batch_size:  # in turn: a long input never holds others back
                        progressed = self._read_window(source) or progressed
                if not progressed:
                    return
                continue
            if self.sources and self.sources[-1].reading:
                if not self._read_window(self.sources[-1]):
                    return  # a live source has nothing yet: decode what is queued
                continue
            if not self._open_some():
                return

    def _open_some(self) -> bool:
        """Open the next inputs and queue their first windows; False when none is waiting."""
        group, other = self._open_next()
        if not group and other is None:
            return False
        packed = self._pack(group, self._plan_short(group)) if group else set()
        self.sources.extend(source if id(source) in packed else self._start(source, whole=True) for source in group)
        if other is not None:
            self.sources.append(self._start(other, whole=False))
        return True

    def _read_window(self, source: Source) -> bool:
        """Queue the source's next window; False when a live source has none ready (the service
        waits for its LiveWindows to call, so the engine's thread is never held by a read)."""
        if source.live and not source.windows.ready():
            return False
        try:
            offset, samples = next(source.windows)
        except StopIteration:
            source.reading = False
            return True
        except FerrumError as exc:  # the stream broke off: what was decoded of it is kept
            source.error, source.reading = exc, False
            return True
        features = None
        if source.detect_on_read:
            features = encode_windows(self.model, [samples], self.compute.encoder)
            source.language, source.probability = detect_language(
                self.model, [samples], features=features, among=self.options.languages
            )
            source.detect_on_read = False
        self._enqueue(source, offset, samples, features)
        return True

    def _open_next(self) -> tuple[list[Source], Source | None]:
        """Short inputs opened in a row (up to a batch of them), and the input after them: long, or
        unreadable. In order, a row that has run through what was submitted waits for the
        caller's next inputs (queued windows are decoded meanwhile): which inputs share a window
        changes their text, and must not depend on how fast the caller lists them."""
        group, self.forming = self.forming, []
        while len(group) < self.options.batch_size:
            item = next(self.incoming, None)
            if item is None:
                if group and self.more_may_come:
                    self.forming = group
                    return [], None
                return group, None
            source = self._open(item)
            if source.short is None:
                return group, source
            group.append(source)
        return group, None

    def _open(self, request: SourceRequest) -> Source:
        """An input that ends within its first 30 s is read whole (`short`), so that its VAD runs
        together with that of other short ones; a longer one is planned as it streams."""
        timing = {"word_timestamps": request.word_timestamps, "word_probabilities": request.word_probabilities}
        source = Source(request.key, request.language, live=request.live, **timing)
        if request.speech_frames and not request.live:
            source.frames = SpeechFrames()
        try:
            source.counted = CountedChunks(request.open_audio())
            if request.live:
                vad = self.options.vad_options
                source.windows = LiveWindows(source.counted, vad, source.speech, self.events.on_live_ready)
                return source
            chunks = iter(source.counted)
            head = list(itertools.islice(chunks, 2))
        except FerrumError as exc:
            source.error, source.reading = exc, False
            return source
        if len(head) <= 1 and sum(len(c) for c in head) <= WINDOW_SAMPLES:
            source.short = head[0] if head else np.zeros(0, np.float32)
        else:
            opts = self.options
            merge = not opts.multilingual  # one language per window: regions are not packed together
            chunks = itertools.chain(head, chunks)
            source.windows = plan_windows(chunks, opts.vad, opts.vad_options, merge, source.speech, source.frames)
        return source

    def _plan_short(self, group: list[Source]) -> list[list[tuple[float, np.ndarray]]]:
        """The windows of inputs read whole, with one VAD pass over them all."""
        opts = self.options
        planned = plan_whole([source.short for source in group], opts.vad, opts.vad_options, not opts.multilingual)
        for source, (windows, speech, probs) in zip(group, planned):
            if source.frames is not None and probs is not None:
                source.frames.add(0, probs)
            source.windows, source.speech, source.short = iter(windows), speech, None
        return [windows for windows, _, _ in planned]

    def _pack(self, group: list[Source], planned: list[list[tuple[float, np.ndarray]]]) -> set[int]:
        """Short inputs of one window each, in a language known beforehand, side by side in shared
        windows: alone, each would cost a whole 30 s of encoding. Returns the ids of those packed.
        VAD's speech is what their text is split back by (_split_packed)."""
        if not self.options.pack_short or self.per_window or not self.options.vad:
            return set()
        alike: dict[tuple[str, bool, bool], list[tuple[Source, float, np.ndarray]]] = {}
        for source, windows in zip(group, planned):
            language = self.options.language or source.requested_language
            if source.error is None and language is not None and len(windows) == 1:
                timing = (source.word_timestamps, source.word_probabilities)  # the lead's are the window's
                alike.setdefault((language, *timing), []).append((source, *windows[0]))
        packed: set[int] = set()
        for (language, *_), members in alike.items():
            for indices in side_by_side([len(samples) for _, _, samples in members]):
                if len(indices) < 2:
                    continue
                parts, pieces, at = [], [], 0
                for i in indices:
                    source, offset, samples = members[i]
                    parts.append(Part(source, offset, at, len(samples)))
                    pieces += [samples, np.zeros(PACK_GAP, np.float32)]
                    at += len(samples) + PACK_GAP
                    source.language, source.probability, source.reading = language, 1.0, False
                    source.windows, source.pending = iter(()), source.pending + 1
                    source.planned_to = offset + len(samples) / SAMPLE_RATE
                    packed.add(id(source))
                self.queue.append(Window(None, 0.0, np.concatenate(pieces[:-1]), parts=parts))
        return packed

    def _start(self, source: Source, whole: bool) -> Source:
        """Language and first windows of an opened source; `whole`: all its windows are planned."""
        if source.error is not None:
            return source
        if (given := self.options.language or source.requested_language) is not None:
            source.language, source.probability = given, 1.0
        if source.live:  # windows come as the speaker talks: none is waited for here
            source.detect_on_read = given is None
            return source
        try:
            first = list(source.windows if whole else itertools.islice(source.windows, self.options.batch_size))
        except FerrumError as exc:
            source.error, source.reading = exc, False
            return source
        samples = [w for _, w in first]
        features = encode_windows(self.model, samples, self.compute.encoder) if first else None
        if given is None and features is not None:
            source.language, source.probability = detect_language(
                self.model, samples, features=features, among=self.options.languages
            )
        if source.language == "und":
            for _ in source.windows:  # no speech to decode; read on for the duration
                pass
            source.reading = False
            return source
        for i, (offset, window) in enumerate(first):
            self._enqueue(source, offset, window, features[i : i + 1])
        source.reading = source.reading and not whole
        return source

    def _enqueue(self, source: Source, offset: float, samples: np.ndarray, features=None) -> None:
        window = Window(source, offset, samples, features)
        self.queue.append(window)
        source.pending += 1
        source.planned_to = window.end

    # -- decoding ------------------------------------------------------------------------

    def _decode_next_batch(self) -> Window:
        """Decode the front of the queue; its segments go to their sources, its tails to the front. The
        batch's last window is returned, for progress."""
        size = self.options.batch_size
        batch, self.queue[:] = self.queue[:size], self.queue[size:]
        found, again = self._decode(batch)
        self.queue[:0] = again
        for window in batch:
            for source in window.sources:
                source.pending -= 1
        for window in again:
            window.source.pending += 1
        for segment, source in found:
            source.found.append(segment)
        for source in {id(s): s for w in batch for s in w.sources if not s.cancelled}.values():
            if self._publish(source) and source.live and self.events.on_partial:
                self.events.on_partial(source.key, source.result(self.decoding))
            frontier = min(self._queued_from(source), source.planned_to)
            source.forget_speech_before(round(frontier * SAMPLE_RATE))
        return batch[-1]

    def _queued_from(self, source: Source) -> float:
        """Where the earliest window still queued for `source` starts, seconds; inf if none is."""
        return min((at for w in self.queue if (at := w.start_in(source)) is not None), default=float("inf"))

    def _decode(self, batch: list[Window]) -> tuple[list[tuple[Segment, Source]], list[Window]]:
        """A batch's segments, and the windows to decode next: unfinished tails, like openai-whisper's
        seek, and packed inputs to be decoded alone."""
        import torch

        opts = self.decoding
        missing = [w for w in batch if w.features is None]
        if missing:
            encoded = encode_windows(self.model, [w.samples for w in missing], self.compute.encoder)
            for i, window in enumerate(missing):
                window.features = encoded[i : i + 1]
        features = torch.cat([w.features for w in batch])
        languages = None if self.per_window or opts.language else [w.lead.language for w in batch]
        if self.per_window and opts.languages:  # detected window by window, among those given
            languages = window_languages(self.model, features, opts.languages)
        unfinished = None
        if opts.vad:
            unfinished = torch.from_numpy(np.stack([speech_after_stamps(w) for w in batch])).to(features.device)
        tail_rows = {i for i, w in enumerate(batch) if w.tail or w.parts}  # packed: any doubt, and each goes alone
        results = decode_with_fallback(
            self.model, features, opts, self.prompt, self.compute.cache_dtype, self.tokenizer, languages, tail_rows,
            unfinished,
        )  # fmt: skip
        found: list[tuple[Segment, Source]] = []
        tails: list[Window] = []
        timed: list[tuple[int, Window, list[Segment], str]] = []  # rows whose words are to be timed
        packed: list[tuple[Window, list[Segment]]] = []
        for i, (window, result) in enumerate(zip(batch, results)):
            window.features = None  # the batch holds the only other reference: freed with it
            if window.parts:  # a loop is judged input by input: inputs alike would compress well together
                if is_silence(result, opts) or is_unsure(result, opts):
                    tails += [alone(window, part) for part in window.parts if not part.source.cancelled]
                    continue
                pieces = segments_from_tokens(result, 0.0, len(window.samples) / SAMPLE_RATE, self.tokenizer)
                packed.append((window, pieces))
                if (opts.word_timestamps or window.lead.word_timestamps) and pieces:
                    timed.append((i, window, pieces, window.lead.language))
                continue
            if is_silence(result, opts) or (window.tail and needs_fallback(result, opts, self.tokenizer.eot)):
                continue  # a tail is a second look: kept only when Whisper is sure of it
            pieces = segments_from_tokens(result, window.offset, len(window.samples) / SAMPLE_RATE, self.tokenizer)
            if window.tail and pieces and repeats_the_end(pieces[0].text, window.follows):
                pieces = pieces[1:]
            for piece in pieces:
                piece.language = result.language if self.per_window else None
                found.append((piece, window.source))
            if (opts.word_timestamps or window.source.word_timestamps) and pieces:
                timed.append((i, window, pieces, result.language if self.per_window else window.source.language))
            if tail := unfinished_tail(result, pieces, window, opts, self.tokenizer):
                tails.append(Window(window.source, *tail, tail=True, follows=pieces[-1].text))
        if timed:
            self._time_words(features, timed)
        for window, pieces in packed:
            self._split_packed(window, pieces, found, tails)
        if opts.vad:  # timed words were fitted to the speech already
            for piece, source in found:
                if piece.words is None:
                    snap_to_speech([piece], source.speech)
        return found, tails

    def _split_packed(
        self, window: Window, pieces: list[Segment], found: list[tuple[Segment, Source]], again: list[Window]
    ) -> None:
        """A packed window's segments handed to the inputs whose speech they cover, in those
        inputs' times. An input that cannot be told apart (a segment over two inputs' speech), that
        got no text, or whose text is a loop, is decoded again alone; one Whisper ended early gets
        a tail, as alone."""
        spoken = [part.speech() for part in window.parts]
        centres = [part.at + part.length / 2 for part in window.parts]
        owners: list[int | None] = []
        redo: set[int] = set()
        for piece in pieces:
            a, b = round(piece.start * SAMPLE_RATE), round(piece.end * SAMPLE_RATE)
            heard = [k for k, regions in enumerate(spoken) if speech_within(regions, a, b) > STRADDLE]
            if len(heard) > 1:
                redo.update(heard)
                owners.append(None)
            elif heard:
                owners.append(heard[0])
            else:  # over no one's speech: the nearest input's
                owners.append(min(range(len(centres)), key=lambda k: abs(centres[k] - (a + b) / 2)))
        timed = any(piece.words is not None for piece in pieces)
        for k, part in enumerate(window.parts):
            if part.source.cancelled:
                continue
            mine = [piece for piece, owner in zip(pieces, owners) if owner == k]
            view = alone(window, part)
            if mine:
                self._score_own(mine)
            if k in redo or not mine or self._loops(mine) or self._unsure_of(mine):
                again.append(view)
                continue
            duration = part.length / SAMPLE_RATE
            for piece in mine:
                shift_segment(piece, part.offset - part.at / SAMPLE_RATE, part.offset, part.offset + duration)
            if timed:
                self._fit_words(mine, part.source)
            found += [(piece, part.source) for piece in mine]
            part.source.packed = True
            if tail := rest_of_speech(mine, view, self.decoding):
                again.append(Window(part.source, *tail, tail=True, follows=mine[-1].text))

    def _time_words(self, features: torch.Tensor, timed: list[tuple[int, Window, list[Segment], str]]) -> None:
        """Word times for the batch's rows in one decoder pass (engine/words.py), then fitted to
        their segments and to the speech VAD found."""
        model, task = self.model, self.options.task
        rows = []
        for i, window, pieces, language in timed:
            scored = self.options.word_probabilities and window.lead.word_probabilities
            prefix = get_tokenizer(
                model.is_multilingual, num_languages=model.num_languages, language=language, task=task
            )
            text = [t for piece in pieces for t in piece.tokens]
            frames = len(window.samples) // HOP_LENGTH
            rows.append(AlignmentRow(i, list(prefix.sot_sequence), text, frames, language, scored))
        bfloat16 = self.compute.encoder == "bfloat16"
        alignments = align_batch(model, features, rows, self.tokenizer, bfloat16)
        for (_, window, pieces, _), alignment in zip(timed, alignments):
            place_words(pieces, alignment, window.offset, window.offset)
            if not window.parts:  # a packed window's words are fitted once split
                self._fit_words(pieces, window.source)

    @staticmethod
    def _score_own(pieces: list[Segment]) -> None:
        """An input's segments from a packed window take the compression ratio of its own text and
        the mean log probability of its own tokens (greedy decoding and beam search keep them; not
        openai-whisper's own loop), not the whole window's: they are what it is judged by."""
        from whisper.utils import compression_ratio

        ratio = compression_ratio("".join(piece.text for piece in pieces).strip())
        logprobs = [value for piece in pieces for value in piece.token_logprobs or ()]
        known = logprobs and all(piece.token_logprobs is not None for piece in pieces)
        for piece in pieces:
            piece.compression_ratio = ratio
            if known:
                piece.avg_logprob = sum(logprobs) / len(logprobs)

    def _loops(self, pieces: list[Segment]) -> bool:
        """Whether an input's own text from a packed window is a loop (fallback.is_loop)."""
        tokens = [token for piece in pieces for token in piece.tokens]
        return is_loop(tokens, pieces[0].compression_ratio, self.decoding)

    @staticmethod
    def _unsure_of(pieces: list[Segment]) -> bool:
        """Whether Whisper read a packed input's own tokens (_score_own) with a mean log probability
        under PACKED_SURE_LOGPROB. The inputs before it in the window are context its words are read
        in: where Whisper is sure of them that context hardly matters, where it is unsure it can tip
        them, so such an input is read again in a window of its own, as it is without packing."""
        return pieces[0].avg_logprob < PACKED_SURE_LOGPROB

    def _fit_words(self, pieces: list[Segment], source: Source) -> None:
        if self.options.vad:
            snap_to_speech(pieces, source.speech)
        typed_words(pieces)

    def _publish(self, source: Source) -> int:
        """Segments in time order, each once no window still queued can come before it; returns how many."""
        source.found.sort(key=lambda seg: seg.start)
        frontier = self._queued_from(source)
        published = 0
        while source.found and source.found[0].start < frontier:
            published += 1
            segment = source.found.pop(0)
            segment.id = len(source.segments)
            source.segments.append(segment)
            if self.events.on_segment:
                self.events.on_segment(source.key, segment, source.language)
        return published


def speech_after_stamps(window: Window) -> np.ndarray:
    """For each of Whisper's timestamps, whether 2 s of speech or more follow it in the window:
    where end-of-text would leave speech out (see decoding.SpeechContinuation).

    Less is left to unfinished_tail: in a window that is done, Whisper's last timestamp often
    falls a second or two before VAD's end of speech, and forced on there it made text up.
    """
    if window.parts:
        speech, start = [region for part in window.parts for region in part.speech()], 0
    else:
        speech, start = window.source.speech, round(window.offset * SAMPLE_RATE)
    after = speech_after(speech, start, start + len(window.samples), TIMESTAMP_SAMPLES)[:TIMESTAMPS]
    out = np.zeros(TIMESTAMPS, dtype=bool)
    out[: len(after)] = after >= GO_ON_SPEECH
    return out


def unfinished_tail(
    result, pieces: list[Segment], window: Window, options: TranscribeOptions, tokenizer
) -> tuple[float, np.ndarray] | None:
    """(offset, samples) of the audio after the last closed segment, when Whisper stopped early
    and speech goes on.

    Whisper sometimes ends a window with a complete segment and end-of-text although the window
    holds more speech; openai-whisper's sequential loop then seeks to that timestamp. What ends
    early although SpeechContinuation kept it going, or without VAD, has the rest of its window
    decoded again, so no sentence is lost.
    """
    if not pieces or not result.tokens or result.tokens[-1] < tokenizer.timestamp_begin:
        return None
    return rest_of_speech(pieces, window, options)


def rest_of_speech(
    pieces: list[Segment], window: Window, options: TranscribeOptions
) -> tuple[float, np.ndarray] | None:
    """(offset, samples) of the window after its last segment, when half a second of speech or more is there."""
    covered = pieces[-1].end - window.offset
    rest = window.samples[int(covered * SAMPLE_RATE) :]
    if covered < 0.5 or len(rest) < SAMPLE_RATE:
        return None
    if options.vad:  # speech itself, not the padding around it
        start = round((window.offset + covered) * SAMPLE_RATE)
        speech = speech_within(window.source.speech, start, start + len(rest))
    else:  # no regions were found: the VAD looks at the rest alone (it hears quiet speech as well as loud)
        speech = speech_within(speech_regions(rest, VadOptions(speech_pad_ms=0)), 0, len(rest))
    return (window.offset + covered, rest) if speech >= TAIL_SPEECH else None


def alone(window: Window, part: Part) -> Window:
    """A packed input's part as a window of its own."""
    return Window(part.source, part.offset, window.samples[part.at : part.at + part.length])


def shift_segment(segment: Segment, by: float, lo: float, hi: float) -> None:
    """Move a segment and its words (dicts, before typed_words) by `by` seconds, kept within [lo, hi]."""

    def moved(t: float) -> float:
        return round(min(max(t + by, lo), hi), 3)

    segment.start, segment.end = moved(segment.start), moved(segment.end)
    for word in segment.words or []:
        word["start"], word["end"] = moved(word["start"]), moved(word["end"])


def release_freed_memory() -> None:
    """Hand freed heap back to the OS after each batch (glibc), so peaks do not stack up over an hour."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to do
