"""The batched engine, the default: windows of speech cut at pauses, from one stream or many,
encoded and decoded together, several at a time. Memory stays flat because windows are cut
from a stream.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from .audio import SAMPLE_RATE
from .transcribe import (
    Compute,
    Segment,
    TranscribeOptions,
    Transcription,
    detect_language,
    encode_windows,
    get_tokenizer,
    language_windows,
    plan_compute,
    seeded_sampling,
)
from .vad import VadOptions, speech_after, speech_regions, speech_within
from .windows import WINDOW, plan_whole, plan_windows

if TYPE_CHECKING:
    import torch


def repetition_loop(tokens: list[int], min_repeats: int = 5, max_period: int = 16) -> tuple[int, int] | None:
    """(start, period) of the first run where the same 1..max_period tokens repeat min_repeats times.

    Whisper's failure mode on hard audio is a loop of one phrase; the compression ratio catches
    long loops, this catches short ones too.
    """
    n = len(tokens)
    for start in range(n):
        for period in range(1, max_period + 1):
            end = start + period * min_repeats
            if end > n:
                break
            unit = tokens[start : start + period]
            if all(tokens[start + k * period : start + (k + 1) * period] == unit for k in range(1, min_repeats)):
                return start, period
    return None


def _text_tokens(result, eot: int) -> list[int]:
    return [t for t in result.tokens if t < eot]


def _cut_loop(result, tokenizer):
    """Keep one copy of a loop that outlived every fallback temperature: the loop is never emitted."""
    text_tokens = _text_tokens(result, tokenizer.eot)
    found = repetition_loop(text_tokens)
    if found is None:
        return result
    start, period = found
    kept = text_tokens[: start + period]
    return replace(result, tokens=kept, text=tokenizer.decode(kept).strip())


def _needs_fallback(result, options: TranscribeOptions, eot: int) -> bool:
    if repetition_loop(_text_tokens(result, eot)):
        return True
    if (
        options.compression_ratio_threshold is not None
        and result.compression_ratio > options.compression_ratio_threshold
    ):
        return True
    if options.logprob_threshold is not None and result.avg_logprob < options.logprob_threshold:
        return not _is_silence(result, options)
    return False


def _is_silence(result, options: TranscribeOptions) -> bool:
    return (
        options.no_speech_threshold is not None
        and result.no_speech_prob > options.no_speech_threshold
        and options.logprob_threshold is not None
        and result.avg_logprob < options.logprob_threshold
    )


def _decode_batch(
    model,
    features: torch.Tensor,
    options: TranscribeOptions,
    prompt: list[int] | None,
    cache_dtype: torch.dtype,
    tokenizer,
    languages: list[str] | None = None,
    one_look: AbstractSet[int] = frozenset(),
    unfinished: torch.Tensor | None = None,
) -> list:
    """Decode encoded windows together; those that fail the thresholds go again at the next
    temperature, except the rows in one_look, which are decoded at the first temperature only.
    unfinished: see decoding.SpeechContinuation."""
    from whisper.decoding import DecodingOptions

    results: list = [None] * features.shape[0]
    pending = list(range(features.shape[0]))
    eot = tokenizer.eot
    for step, temperature in enumerate(options.temperature):
        kwargs = options.decode_kwargs(temperature)
        with seeded_sampling(int(temperature * 1000)):
            rows = [languages[i] for i in pending] if languages else None
            if rows:
                kwargs["language"] = None  # each row carries its own file's language
            decoded = model.decode(
                features[pending],
                DecodingOptions(**kwargs, prompt=prompt),
                fast_cache_dtype=cache_dtype,
                row_languages=rows,
                unfinished=None if unfinished is None else unfinished[pending],
            )
        still = []
        for index, result in zip(pending, decoded):
            results[index] = result
            if not (step == 0 and index in one_look) and _needs_fallback(result, options, eot):
                still.append(index)
        pending = still
        if not pending:
            break
    for index in pending:  # still failing at the last temperature: at least never emit a loop
        results[index] = _cut_loop(results[index], tokenizer)
    return results


def _segments_from_tokens(result, offset: float, duration: float, tokenizer, first_id: int) -> list[Segment]:
    """Split a window's tokens at its timestamp tokens; text after the last one ends with the window."""
    begin = tokenizer.timestamp_begin
    segments: list[Segment] = []
    start, text_tokens = 0.0, []

    def close(end: float) -> None:
        text = tokenizer.decode(text_tokens)
        if not text.strip():
            return
        start_s, end_s = min(start, duration), min(max(end, start), duration)
        segments.append(
            Segment(
                first_id + len(segments),
                round(offset + start_s, 3),
                round(offset + end_s, 3),
                text,
                list(text_tokens),
                result.avg_logprob,
                result.no_speech_prob,
                result.compression_ratio,
                result.temperature,
            )
        )

    for token in result.tokens:
        if token >= begin:
            stamp = (token - begin) * 0.02
            if text_tokens:
                close(stamp)
                text_tokens = []
            start = stamp
        else:
            text_tokens.append(token)
    if text_tokens:
        close(duration)
    return segments


STAMP = SAMPLE_RATE // 50  # Whisper's timestamps are 20 ms apart
N_STAMPS = WINDOW // STAMP + 1
GO_ON_SPEECH = 2 * SAMPLE_RATE


def _speech_after_stamps(window: _Window) -> np.ndarray:
    """For each of Whisper's timestamps, whether 2 s of speech or more follow it in the window:
    where end-of-text would leave speech out (see decoding.SpeechContinuation).

    Less is left to _unfinished_tail. In a window that is done, Whisper's last timestamp often
    falls a second or two before VAD's end of speech; forced on there, it made text up.
    """
    start = round(window.offset * SAMPLE_RATE)
    after = speech_after(window.file.speech, start, start + len(window.samples), STAMP)[:N_STAMPS]
    out = np.zeros(N_STAMPS, dtype=bool)
    out[: len(after)] = after >= GO_ON_SPEECH
    return out


def _unfinished_tail(
    result, pieces: list[Segment], window: _Window, options: TranscribeOptions, tokenizer
) -> tuple[float, np.ndarray] | None:
    """The audio after the last closed segment, when Whisper stopped early and speech goes on.

    Whisper sometimes ends a window with a complete segment and end-of-text although the
    window holds more speech; openai-whisper's sequential loop then seeks to that timestamp.
    With 2 s of speech left or more, the row was kept going (SpeechContinuation); what still
    ends early, or without VAD, has the rest of its window decoded again, so no sentence is lost.
    """
    if not pieces or not result.tokens or result.tokens[-1] < tokenizer.timestamp_begin:
        return None
    covered = pieces[-1].end - window.offset
    rest = window.samples[int(covered * SAMPLE_RATE) :]
    if covered < 0.5 or len(rest) < SAMPLE_RATE:
        return None
    if options.vad:  # at least half a second of speech itself, not of the padding around it
        start = round((window.offset + covered) * SAMPLE_RATE)
        speech = speech_within(window.file.speech, start, start + len(rest))
    else:  # no regions were found: the VAD looks at the rest alone (it hears quiet speech as well as loud)
        speech = speech_within(speech_regions(rest, VadOptions(speech_pad_ms=0)), 0, len(rest))
    return (window.offset + covered, rest) if speech >= SAMPLE_RATE // 2 else None


class _Counted:
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
class _File:
    """One input of a batch: its planned windows, its language, what has been decoded."""

    key: object
    counted: _Counted | None = None
    windows: Iterator[tuple[float, np.ndarray]] | None = None
    language: str = "und"
    probability: float = 0.0
    segments: list[Segment] = field(default_factory=list)
    found: list[Segment] = field(default_factory=list)  # decoded, not yet in segments
    error: Exception | None = None
    reading: bool = True
    pending: int = 0
    speech: list[tuple[int, int]] = field(default_factory=list)  # VAD's, unpadded, absolute samples
    planned_to: float = 0.0  # seconds: where the last window queued ends; those after it start there or later
    short: np.ndarray | None = None  # the audio of an input read whole, until its windows are planned

    def forget_speech_before(self, sample: int) -> None:
        """Drop the speech regions that end before `sample`, where no window is left to check.
        In place: the planner goes on adding to this list."""
        self.speech[:] = [region for region in self.speech if region[1] > sample]

    def result(self, options: TranscribeOptions) -> Transcription:
        text = "".join(s.text for s in self.segments).strip()
        duration = self.counted.samples / SAMPLE_RATE if self.counted else 0.0
        used = {**asdict(options), "language": options.language or self.language, "engine": "batched"}
        language, probability = (self.language, self.probability) if self.segments else ("und", 0.0)
        result = Transcription(text, self.segments, language, probability, duration, used)
        result.peak = self.counted.peak if self.counted else 0.0
        if warning := getattr(self.counted.chunks if self.counted else None, "warning", None):
            result.warnings.append(warning)
        return result


@dataclass
class _Window:
    file: _File
    offset: float
    samples: np.ndarray
    features: torch.Tensor | None = None
    tail: bool = False  # the rest of a window Whisper ended early: a second look
    follows: str = ""  # a tail: the text of the segment it comes after


def transcribe_stream(
    model,
    sources: Iterable[tuple[object, Callable[[], Iterable[np.ndarray]]]],
    options: TranscribeOptions,
    on_segment: Callable[[object, Segment], None] | None = None,
    on_progress: Callable[[object, float], None] | None = None,
) -> Iterator[tuple[object, Transcription | Exception]]:
    """The batched engine over many inputs: windows of several files share a batch.

    sources yields (key, open) where open() gives the input's audio chunks (and may raise).
    Results come back in input order, each as soon as its last window is decoded; an input
    that cannot be read comes back as its exception, and the others go on.
    """
    from .errors import FerrumError

    if not model.is_multilingual:  # as openai-whisper: an English-only model is told its language
        options = replace(options, language="en", multilingual=False)
    compute = plan_compute(model, options)
    size = options.batch_size
    per_window = options.multilingual and options.language is None
    opts = replace(options, language=options.language if not per_window else None)
    tokenizer = get_tokenizer(
        model.is_multilingual, num_languages=model.num_languages, language=opts.language or "en", task=opts.task
    )
    prompt_text = opts.prompt_text()
    prompt = tokenizer.encode(" " + prompt_text) if prompt_text else None
    sources = iter(sources)
    files: list[_File] = []  # started, not yet returned, in input order
    queue: list[_Window] = []

    def enqueue(file: _File, offset: float, samples: np.ndarray, features=None) -> None:
        queue.append(_Window(file, offset, samples, features))
        file.pending += 1
        file.planned_to = offset + len(samples) / SAMPLE_RATE

    def publish(file: _File) -> None:
        """Segments in time order, each once no window still queued can come before it."""
        file.found.sort(key=lambda seg: seg.start)
        frontier = min((w.offset for w in queue if w.file is file), default=float("inf"))
        while file.found and file.found[0].start < frontier:
            segment = file.found.pop(0)
            segment.id = len(file.segments)
            file.segments.append(segment)
            if on_segment:
                on_segment(file.key, segment)

    def open_file(key, open_audio) -> _File:
        """Open an input. One that ends within its first 30 s is read whole (`short`), so that
        its VAD runs together with that of other short ones; a longer one is planned as it streams."""
        file = _File(key)
        try:
            file.counted = _Counted(open_audio())
            chunks = iter(file.counted)
            head = list(itertools.islice(chunks, 2))
        except FerrumError as exc:
            file.error, file.reading = exc, False
            return file
        if len(head) <= 1 and sum(len(c) for c in head) <= WINDOW:
            file.short = head[0] if head else np.zeros(0, np.float32)
        else:
            file.windows = plan_windows(
                itertools.chain(head, chunks), opts.vad, opts.vad_options, not opts.multilingual, file.speech
            )
        return file

    def plan_short(group: list[_File]) -> None:
        planned = plan_whole([file.short for file in group], opts.vad, opts.vad_options, not opts.multilingual)
        for file, (windows, speech) in zip(group, planned):
            file.windows, file.speech, file.short = iter(windows), speech, None

    def start(file: _File, whole: bool) -> _File:
        """Language and first windows of an opened input; `whole`: all its windows are planned."""
        if file.error is not None:
            return file
        try:
            first = list(file.windows if whole else itertools.islice(file.windows, size))
        except FerrumError as exc:
            file.error, file.reading = exc, False
            return file
        features = encode_windows(model, [w for _, w in first], compute.encoder) if first else None
        if options.language is not None:
            file.language, file.probability = options.language, 1.0
        elif features is not None:
            chosen = language_windows([w for _, w in first])
            probe = get_tokenizer(model.is_multilingual, num_languages=model.num_languages, task=opts.task)
            file.language, file.probability = detect_language(model, features[chosen], probe)
        if file.language == "und":
            for _ in file.windows:  # no speech to decode; read on for the duration
                pass
            file.reading = False
        else:
            for i, (offset, samples) in enumerate(first):
                enqueue(file, offset, samples, features[i : i + 1])
            file.reading = file.reading and not whole
        return file

    def fill() -> None:
        while len(queue) < size:
            if files and files[-1].reading:
                try:
                    enqueue(files[-1], *next(files[-1].windows))
                except StopIteration:
                    files[-1].reading = False
                continue
            group: list[_File] = []  # short inputs, opened in a row
            other = None  # the input after them: long, or unreadable
            while len(group) < size and other is None:
                item = next(sources, None)
                if item is None:
                    break
                file = open_file(*item)
                if file.short is None:
                    other = file
                else:
                    group.append(file)
            if not group and other is None:
                return
            if group:
                plan_short(group)
            files.extend(start(file, whole=True) for file in group)
            if other is not None:
                files.append(start(other, whole=False))

    while True:
        fill()
        while files and not files[0].reading and files[0].pending == 0:
            done = files.pop(0)
            yield done.key, (done.error or done.result(opts))
        if not queue:
            if not files:
                return
            continue
        batch, queue[:] = queue[:size], queue[size:]
        found, tails = _decode_windows(model, batch, opts, prompt, compute, tokenizer, per_window)
        queue[:0] = tails  # tails go first into the next batch
        for window in batch:
            window.file.pending -= 1
        for window in tails:
            window.file.pending += 1
        for segment, file in found:
            file.found.append(segment)
        for file in {id(w.file): w.file for w in batch}.values():
            publish(file)
            frontier = min([w.offset for w in queue if w.file is file] + [file.planned_to])
            file.forget_speech_before(round(frontier * SAMPLE_RATE))
        release_freed_memory()
        if on_progress:
            last = batch[-1]
            on_progress(last.file.key, last.offset + len(last.samples) / SAMPLE_RATE)


def release_freed_memory() -> None:
    """Hand freed heap back to the OS after each batch (glibc), so peaks do not stack up over an hour."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to do


def _decode_windows(
    model, batch: list[_Window], opts: TranscribeOptions, prompt, compute: Compute, tokenizer, per_window: bool
) -> tuple[list[tuple[Segment, _File]], list[_Window]]:
    """Decode a batch of windows: their segments, and the unfinished tails to decode next,
    like openai-whisper's seek."""
    import torch

    missing = [w for w in batch if w.features is None]
    if missing:
        encoded = encode_windows(model, [w.samples for w in missing], compute.encoder)
        for i, window in enumerate(missing):
            window.features = encoded[i : i + 1]
    features = torch.cat([w.features for w in batch])
    languages = None if per_window or opts.language else [w.file.language for w in batch]  # files detected apart
    tail_rows = {i for i, w in enumerate(batch) if w.tail}
    unfinished = None
    if opts.vad:
        unfinished = torch.from_numpy(np.stack([_speech_after_stamps(w) for w in batch])).to(features.device)
    results = _decode_batch(
        model, features, opts, prompt, compute.cache_dtype, tokenizer, languages, tail_rows, unfinished
    )
    found: list[tuple[Segment, _File]] = []
    tails: list[_Window] = []
    for window, result in zip(batch, results):
        window.features = None  # the batch holds the only other reference: freed with it
        if _is_silence(result, opts) or (window.tail and _needs_fallback(result, opts, tokenizer.eot)):
            continue  # a tail is a second look: kept only when Whisper is sure of it
        duration = len(window.samples) / SAMPLE_RATE
        pieces = _segments_from_tokens(result, window.offset, duration, tokenizer, 0)
        if window.tail and pieces and _repeats_the_end(pieces[0].text, window.follows):
            pieces = pieces[1:]
        for piece in pieces:
            piece.language = result.language if per_window else None
            found.append((piece, window.file))
        if tail := _unfinished_tail(result, pieces, window, opts, tokenizer):
            tails.append(_Window(window.file, *tail, tail=True, follows=pieces[-1].text))
    return found, tails


def _repeats_the_end(text: str, before: str, most: int = 3) -> bool:
    """Whether `text` is only the last word or few of `before`. Whisper's last timestamp can fall
    inside the last word it read, and the tail decoded from there reads that word again."""
    words, previous = re.findall(r"\w+", text.lower()), re.findall(r"\w+", before.lower())
    return 0 < len(words) <= most and previous[-len(words) :] == words


def transcribe_batched(
    model,
    chunks: Iterable[np.ndarray],
    options: TranscribeOptions,
    on_segment: Callable[[Segment], None] | None = None,
    on_progress: Callable[[float], None] | None = None,
) -> Transcription:
    """One input through the batched engine."""
    ((_, result),) = transcribe_stream(
        model,
        [(None, lambda: chunks)],
        options,
        (lambda _, seg: on_segment(seg)) if on_segment else None,
        (lambda _, sec: on_progress(sec)) if on_progress else None,
    )
    if isinstance(result, Exception):
        raise result
    return result
