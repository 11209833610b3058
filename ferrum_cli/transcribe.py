"""Transcription of one audio stream: language detection, windowing, the two engines.

- batched (default): the audio is cut at pauses into windows of at most 30 s, and
  windows are encoded and decoded together, several at a time. Memory stays flat
  because windows are cut from a stream.
- sequential: openai-whisper's own transcribe() loop, exactly, on our model.
"""

from __future__ import annotations

import itertools
import re
import warnings
from collections.abc import Callable, Iterable, Iterator
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .audio import SAMPLE_RATE
from .vad import VadOptions, speech_after, speech_regions, speech_within
from .windows import WINDOW, pack, plan_whole, plan_windows

if TYPE_CHECKING:  # torch is imported where the model runs: batch.py and the CLI start before it loads
    import torch


@dataclass
class TranscribeOptions:
    language: str | None = None  # None: detect it
    task: str = "transcribe"
    beam_size: int | None = None
    best_of: int | None = None
    patience: float | None = None
    temperature: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    condition_on_previous_text: bool = True
    initial_prompt: str | None = None
    word_timestamps: bool = False
    sequential: bool = False
    batch_size: int = 12  # rows share each step's weight reads; 60 min stays as flat in memory as 10
    vad: bool = True
    vad_options: VadOptions = field(default_factory=VadOptions)
    multilingual: bool = False  # detect the language of each window, not once per file
    hotwords: str | None = None
    compute: str = "auto"  # batched engine on CPU: "auto" (float32 or bfloat16), "float32", "bfloat16", "int8"

    @property
    def runs_sequentially(self) -> bool:
        """Word timestamps and beam search exist only in openai-whisper's sequential algorithm."""
        return self.sequential or self.word_timestamps or (self.beam_size or 1) > 1

    def prompt_text(self) -> str | None:
        """Hotwords go ahead of the initial prompt: both bias the decoder towards their words."""
        parts = [p.strip() for p in (self.hotwords, self.initial_prompt) if p and p.strip()]
        return " ".join(parts) or None

    def decode_kwargs(self, temperature: float) -> dict:
        kwargs = {"task": self.task, "language": self.language, "temperature": temperature, "fp16": False}
        if temperature > 0:
            kwargs["best_of"] = self.best_of
        else:
            kwargs["beam_size"], kwargs["patience"] = self.beam_size, self.patience
        return kwargs


def language_code(language: str) -> str | None:
    """openai-whisper's code for a language given by code or English name; None for "auto"."""
    from whisper.tokenizer import LANGUAGES, TO_LANGUAGE_CODE

    from .errors import UsageError

    name = language.strip().lower()
    if name in ("auto", ""):
        return None
    code = TO_LANGUAGE_CODE.get(name, name)
    if code not in LANGUAGES:
        raise UsageError(f"unknown language {language!r}")
    return code


@dataclass
class Segment:
    id: int
    start: float
    end: float
    text: str
    tokens: list[int]
    avg_logprob: float
    no_speech_prob: float
    compression_ratio: float
    temperature: float
    words: list[dict] | None = None
    language: str | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None or k not in ("words", "language")}


@dataclass
class Transcription:
    text: str
    segments: list[Segment]
    language: str
    language_probability: float
    duration: float
    options: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The shape openai-whisper's writers read."""
        return {
            "text": self.text,
            "segments": [s.to_dict() for s in self.segments],
            "language": self.language,
            "language_probability": self.language_probability,
            "duration": self.duration,
            "options": self.options,
        }


@dataclass(frozen=True)
class Compute:
    """How the batched engine computes: the encoder's products, and the dtype of the decoder's
    cross-attention cache (and of its vocabulary projection where that is not on float16-weight
    products, see decoding.HalfWeightProducts)."""

    encoder: str  # "int8", "bfloat16" (autocast) or the model's own dtype
    cache_dtype: torch.dtype


def plan_compute(model, options: TranscribeOptions) -> Compute:
    """`--compute` on a float32 model on a CPU (auto: see devices.cpu_auto_compute); GPUs and
    half-precision models compute in the model's dtype."""
    import torch

    from .devices import cpu_auto_compute

    weights = next(model.parameters()).dtype
    if model.device.type != "cpu" or weights != torch.float32:
        return Compute(str(weights).removeprefix("torch."), weights)
    choice = cpu_auto_compute() if options.compute == "auto" else options.compute
    return Compute(choice, torch.bfloat16 if choice == "bfloat16" else weights)


def get_tokenizer(multilingual: bool, *, num_languages: int = 99, language: str | None = None, task: str | None = None):
    """openai-whisper's tokenizer, with its non-speech token list read from our cache.

    Computing that list compiles a regex of every special token: 0.4 s of each cold start.
    """
    from whisper.tokenizer import get_tokenizer as whisper_tokenizer

    from .cache import remembered

    tokenizer = whisper_tokenizer(multilingual, num_languages=num_languages, language=language, task=task)
    if "non_speech_tokens" not in tokenizer.__dict__:
        name = f"non-speech-tokens-{tokenizer.encoding.name}"
        tokens = remembered(name, lambda: list(tokenizer.non_speech_tokens))
        if isinstance(tokens, list) and all(isinstance(t, int) for t in tokens):
            tokenizer.__dict__["non_speech_tokens"] = tuple(tokens)
    return tokenizer


# Windows per encoder pass on a CPU. One is fastest: a window's activations (12 MB at most for
# base) are reused from the heap, while four (49 MB) are mapped fresh from the OS each time and
# every page faults in: 0.41 against 0.375 s a window on 2 AVX-512 cores, with 250k page faults
# per 8 windows against none.
ENCODER_BATCH = 1


def encode_windows(model, windows: list[np.ndarray], compute: str | None = None) -> torch.Tensor:
    """Log-mel of each window, padded to 30 s, through the encoder: int8 products, autocast to
    bfloat16, or (None) the model's own dtype."""
    import torch
    from whisper.audio import N_FRAMES, log_mel_spectrogram, pad_or_trim

    weights = next(model.parameters()).dtype
    encoder, dtype = model.encoder, weights
    if compute == "int8":
        from .quantize import int8_encoder

        encoder = int8_encoder(model)
    elif compute is not None:
        from .devices import torch_dtype

        dtype = torch_dtype(compute)
    step = ENCODER_BATCH if model.device.type == "cpu" else len(windows)
    out = []
    for i in range(0, len(windows), max(step, 1)):
        mels = [
            pad_or_trim(log_mel_spectrogram(torch.from_numpy(w), model.dims.n_mels), N_FRAMES)
            for w in windows[i : i + step]
        ]
        mel = torch.stack(mels).to(model.device, weights)
        with torch.no_grad(), torch.autocast(model.device.type, dtype=dtype, enabled=dtype != weights):
            out.append(encoder(mel).to(weights))
    return out[0] if len(out) == 1 else torch.cat(out)


def _loudness(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(samples, dtype=np.float64)))) if samples.size else 0.0


def language_windows(windows: list[np.ndarray], count: int = 3) -> list[int]:
    """Indices of up to `count` windows, spread over those given, that hold sound."""
    audible = [i for i, w in enumerate(windows) if _loudness(w) > 1e-3]
    if len(audible) <= count:
        return audible
    return [audible[round(k * (len(audible) - 1) / (count - 1))] for k in range(count)]


def detect_language(model, features: torch.Tensor, tokenizer) -> tuple[str, float]:
    """Average the language probabilities of several encoded windows; 'und' when there are none."""
    import torch

    if not model.is_multilingual:
        return "en", 1.0
    if features.shape[0] == 0:
        return "und", 0.0
    with torch.no_grad():
        _, probs = model.detect_language(features, tokenizer)
    total: dict[str, float] = {}
    for p in probs:
        for lang, value in p.items():
            total[lang] = total.get(lang, 0.0) + value / len(probs)
    language = max(total, key=total.get)
    return language, total[language]


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


@contextmanager
def seeded_sampling(seed: int) -> Iterator[None]:
    """Temperature sampling from a fixed seed, so that the same input gives the same text on
    every run; the caller's random state is left as it was."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


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


def identify_language(model, chunks: Iterable[np.ndarray], options: TranscribeOptions) -> tuple[str, float]:
    """Language and probability from up to three speech windows of the first batch; 'und' without speech."""
    import torch

    windows = plan_windows(chunks, options.vad, options.vad_options)
    first = [w for _, w in itertools.islice(windows, options.batch_size)]
    chosen = [first[i] for i in language_windows(first)]
    features = encode_windows(model, chosen, plan_compute(model, options).encoder) if chosen else torch.zeros(0)
    tokenizer = get_tokenizer(model.is_multilingual, num_languages=model.num_languages)
    return detect_language(model, features, tokenizer)


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
        has_speech = speech_within(window.file.speech, start, start + len(rest)) >= SAMPLE_RATE // 2
    else:
        has_speech = _loudness(rest) > 1e-3
    return (window.offset + covered, rest) if has_speech else None


class _Counted:
    """Passes chunks through and counts their samples: the duration of a stream."""

    def __init__(self, chunks: Iterable[np.ndarray]) -> None:
        self.chunks, self.samples = chunks, 0

    def __iter__(self) -> Iterator[np.ndarray]:
        for chunk in self.chunks:
            self.samples += len(chunk)
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
        result = Transcription(text, self.segments, self.language, self.probability, duration, used)
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


def snap_words_to_speech(segments: list[dict], regions: list[tuple[int, int]]) -> None:
    """A word that starts in silence starts where the next speech does: Whisper's alignment
    tends to stretch the first word of a stretch of speech back over the pause before it."""
    starts = [a / SAMPLE_RATE for a, _ in regions]
    ends = [b / SAMPLE_RATE for _, b in regions]
    for segment in segments:
        for word in segment.get("words") or []:
            inside = any(a <= word["start"] < b for a, b in zip(starts, ends))
            later = [a for a in starts if a > word["start"]]
            if not inside and later and later[0] < word["end"]:
                word["start"] = round(later[0], 3)
        if segment.get("words"):
            segment["start"] = segment["words"][0]["start"]


def _plain_words(words: list[dict] | None) -> list[dict] | None:
    """openai-whisper's word times and probabilities are numpy floats; a library user gets Python's."""
    if words is None:
        return None
    return [{k: v.item() if isinstance(v, np.generic) else v for k, v in word.items()} for word in words]


def transcribe_sequential(
    model,
    samples: np.ndarray,
    options: TranscribeOptions,
    on_segment: Callable[[Segment], None] | None = None,
) -> Transcription:
    """openai-whisper's transcribe() on our model: same algorithm, same text."""
    import torch
    from whisper.transcribe import transcribe

    duration = len(samples) / SAMPLE_RATE
    if options.vad:  # VAD only decides whether there is speech at all: the algorithm stays openai-whisper's
        windows = [samples[a:b] for a, b in pack(samples, speech_regions(samples, options.vad_options), merge=True)]
    else:
        windows = [samples[i : i + WINDOW] for i in range(0, len(samples), WINDOW)]
    language, probability = options.language, 1.0
    if language is None:
        tokenizer = get_tokenizer(model.is_multilingual, num_languages=model.num_languages)
        chosen = [windows[i] for i in language_windows(windows)]
        features = encode_windows(model, chosen) if chosen else torch.zeros(0)
        language, probability = detect_language(model, features, tokenizer)
    if not windows or language == "und":
        return Transcription("", [], language, probability, duration, {**asdict(options), "engine": "sequential"})
    decode = {"beam_size": options.beam_size, "best_of": options.best_of, "patience": options.patience}
    get_tokenizer(model.is_multilingual, num_languages=model.num_languages, language=language, task=options.task)
    with warnings.catch_warnings(record=True) as caught, seeded_sampling(0):  # its warnings: the input's own
        warnings.simplefilter("always")
        result = transcribe(
            model,
            samples,
            verbose=None,
            temperature=options.temperature,
            compression_ratio_threshold=options.compression_ratio_threshold,
            logprob_threshold=options.logprob_threshold,
            no_speech_threshold=options.no_speech_threshold,
            condition_on_previous_text=options.condition_on_previous_text,
            initial_prompt=options.prompt_text(),
            word_timestamps=options.word_timestamps,
            language=language,
            task=options.task,
            # float16 decoding options are for CUDA: on the CPU openai-whisper warns and uses float32
            fp16=model.device.type != "cpu" and next(model.parameters()).dtype == torch.float16,
            **{k: v for k, v in decode.items() if v is not None},
        )
    if options.word_timestamps and options.vad:
        snap_words_to_speech(result["segments"], speech_regions(samples, replace(options.vad_options, speech_pad_ms=0)))
    segments = []
    for i, s in enumerate(result["segments"]):
        seg = Segment(
            i,
            round(float(s["start"]), 3),
            round(min(float(s["end"]), duration), 3),
            s["text"],
            [t for t in s["tokens"]],
            s["avg_logprob"],
            s["no_speech_prob"],
            s["compression_ratio"],
            s["temperature"],
            _plain_words(s.get("words")),
        )
        segments.append(seg)
        if on_segment:
            on_segment(seg)
    out = Transcription(
        result["text"].strip(), segments, language, probability, duration, {**asdict(options), "engine": "sequential"}
    )
    ours = [w for w in caught if "whisper" in Path(w.filename).parts]
    out.warnings.extend(dict.fromkeys(str(w.message) for w in ours))  # each message once
    for other in (w for w in caught if w not in ours):
        warnings.showwarning(other.message, other.category, other.filename, other.lineno)
    return out
