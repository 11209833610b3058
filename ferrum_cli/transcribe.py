"""Transcription of one audio stream: language detection, windowing, the two engines.

- batched (default): the audio is cut at pauses into windows of at most 30 s, and
  windows are encoded and decoded together, several at a time. Memory stays flat
  because windows are cut from a stream.
- sequential: openai-whisper's own transcribe() loop, exactly, on our model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from .audio import SAMPLE_RATE

WINDOW = 30 * SAMPLE_RATE
FRAME = SAMPLE_RATE // 50  # 20 ms, for finding pauses


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
    batch_size: int = 8

    def decode_kwargs(self, temperature: float) -> dict:
        kwargs = {"task": self.task, "language": self.language, "temperature": temperature, "fp16": False}
        if temperature > 0:
            kwargs["best_of"] = self.best_of
        else:
            kwargs["beam_size"], kwargs["patience"] = self.beam_size, self.patience
        return kwargs


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

    def to_dict(self) -> dict:
        d = asdict(self)
        if self.words is None:
            d.pop("words")
        return d


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


def _mel_windows(model, windows: list[np.ndarray]) -> torch.Tensor:
    from whisper.audio import N_FRAMES, log_mel_spectrogram, pad_or_trim

    mels = [pad_or_trim(log_mel_spectrogram(torch.from_numpy(w), model.dims.n_mels), N_FRAMES) for w in windows]
    return torch.stack(mels).to(model.device)


def _speech_energy(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(samples, dtype=np.float64)))) if samples.size else 0.0


def detect_language(model, windows: list[np.ndarray], tokenizer) -> tuple[str, float]:
    """Average the language probabilities of up to three windows that hold sound."""
    loud = [w for w in windows if _speech_energy(w) > 1e-3][:3]
    if not loud or not model.is_multilingual:
        return ("en" if not model.is_multilingual else "und"), (1.0 if not model.is_multilingual else 0.0)
    mel = _mel_windows(model, loud).to(next(model.parameters()).dtype)
    with torch.no_grad():
        _, probs = model.detect_language(model.encoder(mel), tokenizer)
    total: dict[str, float] = {}
    for p in probs:
        for lang, value in p.items():
            total[lang] = total.get(lang, 0.0) + value / len(probs)
    language = max(total, key=total.get)
    return language, total[language]


def quietest_cut(samples: np.ndarray, lo: int, hi: int) -> int:
    """Sample index of the quietest 20 ms frame in [lo, hi): a pause, where no word is cut."""
    region = samples[lo:hi]
    n = len(region) // FRAME
    if n == 0:
        return hi
    energy = np.square(region[: n * FRAME].reshape(n, FRAME)).mean(axis=1)
    return lo + int(np.argmin(energy)) * FRAME + FRAME // 2


def cut_windows(chunks: Iterable[np.ndarray]) -> Iterator[tuple[float, np.ndarray]]:
    """(offset seconds, samples) windows of at most 30 s, cut at pauses, from a stream."""
    buffer = np.zeros(0, np.float32)
    offset = 0
    for chunk in chunks:
        buffer = np.concatenate([buffer, chunk])
        while len(buffer) > WINDOW:
            cut = quietest_cut(buffer, WINDOW * 2 // 3, WINDOW)
            yield offset / SAMPLE_RATE, buffer[:cut]
            buffer, offset = buffer[cut:], offset + cut
    if len(buffer) > 0:
        yield offset / SAMPLE_RATE, buffer


def _needs_fallback(result, options: TranscribeOptions) -> bool:
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


def _decode_batch(model, mel: torch.Tensor, options: TranscribeOptions, prompt: list[int] | None) -> list:
    """Decode windows together; those that fail the thresholds go again at the next temperature."""
    from whisper.decoding import DecodingOptions

    results: list = [None] * mel.shape[0]
    pending = list(range(mel.shape[0]))
    with torch.no_grad():
        features = model.encoder(mel.to(next(model.parameters()).dtype))
    for temperature in options.temperature:
        kwargs = options.decode_kwargs(temperature)
        decoded = model.decode(features[pending], DecodingOptions(**kwargs, prompt=prompt))
        still = []
        for index, result in zip(pending, decoded):
            results[index] = result
            if _needs_fallback(result, options):
                still.append(index)
        pending = still
        if not pending:
            break
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


def transcribe_batched(
    model,
    chunks: Iterable[np.ndarray],
    options: TranscribeOptions,
    on_segment: Callable[[Segment], None] | None = None,
    on_progress: Callable[[float], None] | None = None,
) -> Transcription:
    from whisper.tokenizer import get_tokenizer

    windows = cut_windows(chunks)
    first: list[tuple[float, np.ndarray]] = []
    for item in windows:
        first.append(item)
        if len(first) >= options.batch_size:
            break
    language, probability = options.language, 1.0
    tokenizer = get_tokenizer(model.is_multilingual, num_languages=model.num_languages, task=options.task)
    if language is None:
        language, probability = detect_language(model, [w for _, w in first], tokenizer)
    opts = TranscribeOptions(**{**options.__dict__, "language": None if language == "und" else language})
    tokenizer = get_tokenizer(
        model.is_multilingual, num_languages=model.num_languages, language=opts.language or "en", task=opts.task
    )
    prompt = tokenizer.encode(" " + opts.initial_prompt.strip()) if opts.initial_prompt else None

    segments: list[Segment] = []
    duration = 0.0

    def batches() -> Iterator[list[tuple[float, np.ndarray]]]:
        batch = list(first)
        for item in windows:
            if len(batch) == opts.batch_size:
                yield batch
                batch = []
            batch.append(item)
        if batch:
            yield batch

    for batch in batches():
        audible = [(off, w) for off, w in batch if _speech_energy(w) > 1e-4]
        if audible and language != "und":
            mel = _mel_windows(model, [w for _, w in audible])
            results = _decode_batch(model, mel, opts, prompt)
            for (offset, window), result in zip(audible, results):
                if _is_silence(result, opts):
                    continue
                for segment in _segments_from_tokens(
                    result, offset, len(window) / SAMPLE_RATE, tokenizer, len(segments)
                ):
                    segments.append(segment)
                    if on_segment:
                        on_segment(segment)
        duration = batch[-1][0] + len(batch[-1][1]) / SAMPLE_RATE
        if on_progress:
            on_progress(duration)
    text = "".join(s.text for s in segments).strip()
    return Transcription(text, segments, language, probability, duration, {**asdict(opts), "engine": "batched"})


def transcribe_sequential(
    model,
    samples: np.ndarray,
    options: TranscribeOptions,
    on_segment: Callable[[Segment], None] | None = None,
) -> Transcription:
    """openai-whisper's transcribe() on our model: same algorithm, same text."""
    from whisper.tokenizer import get_tokenizer
    from whisper.transcribe import transcribe

    language, probability = options.language, 1.0
    if language is None:
        tokenizer = get_tokenizer(model.is_multilingual, num_languages=model.num_languages)
        windows = [samples[i : i + WINDOW] for i in range(0, max(len(samples), 1), WINDOW)]
        language, probability = detect_language(model, windows, tokenizer)
    duration = len(samples) / SAMPLE_RATE
    if language == "und":
        return Transcription("", [], language, probability, duration, {**asdict(options), "engine": "sequential"})
    decode = {"beam_size": options.beam_size, "best_of": options.best_of, "patience": options.patience}
    result = transcribe(
        model,
        samples,
        verbose=None,
        temperature=options.temperature,
        compression_ratio_threshold=options.compression_ratio_threshold,
        logprob_threshold=options.logprob_threshold,
        no_speech_threshold=options.no_speech_threshold,
        condition_on_previous_text=options.condition_on_previous_text,
        initial_prompt=options.initial_prompt,
        word_timestamps=options.word_timestamps,
        language=language,
        task=options.task,
        fp16=next(model.parameters()).dtype == torch.float16,
        **{k: v for k, v in decode.items() if v is not None},
    )
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
            s.get("words"),
        )
        segments.append(seg)
        if on_segment:
            on_segment(seg)
    return Transcription(
        result["text"].strip(), segments, language, probability, duration, {**asdict(options), "engine": "sequential"}
    )
