"""The sequential engine: openai-whisper's own transcribe() loop, exactly, on our model. It
serves `--sequential` (with any decoding: greedy, best_of, beam search); it reads each input
whole and decodes one input a step.
"""

from __future__ import annotations

import warnings
from collections import deque
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..audio.constants import SAMPLE_RATE, WINDOW_SAMPLES
from ..audio.level import raised_spans
from ..audio.vad import speech_regions_and_core
from ..audio.windows import first_read, pack
from ..errors import FerrumError
from ..options import TranscribeOptions
from ..results import Segment, Transcription
from .fallback import seeded_sampling
from .interface import EngineEvents, SourceRequest, withdraw
from .language import detect_language
from .tokenizer import get_tokenizer
from .words import snap_to_speech, typed_words


class SequentialEngine:
    """The engine interface (interface.py) over openai-whisper's loop: each step reads one input
    whole and transcribes it."""

    def __init__(self, model, options: TranscribeOptions, events: EngineEvents = EngineEvents()) -> None:
        self.model, self.options, self.events = model, options, events
        self.inbox: deque[SourceRequest] = deque()
        self.last_batch = 0

    def submit(self, request: SourceRequest) -> None:
        self.inbox.append(request)

    @property
    def busy(self) -> bool:
        return bool(self.inbox)

    def expect_inputs(self, more: bool) -> None:
        """Nothing waits for more inputs here: each is read alone."""

    def cancel(self, key) -> bool:
        return withdraw(self.inbox, key)

    def step(self) -> list[tuple[object, Transcription | FerrumError]]:
        self.last_batch = 0
        if not self.inbox:
            return []
        request = self.inbox.popleft()
        self.last_batch = 1
        try:
            chunks = request.open_audio()
            samples = np.concatenate([np.zeros(0, np.float32), *chunks])
        except FerrumError as exc:
            return [(request.key, exc)]
        options = replace(
            self.options,
            language=self.options.language or request.language,
            word_timestamps=self.options.word_timestamps or request.word_timestamps,
        )
        result = transcribe_sequential(self.model, samples, options)
        result.warnings.extend(getattr(chunks, "warnings", ()))  # a truncated input's: known once it is read
        for segment in result.segments if self.events.on_segment else ():
            self.events.on_segment(request.key, segment, result.language)
        if self.events.on_progress:
            self.events.on_progress(request.key, result.duration)
        return [(request.key, result)]


def transcribe_sequential(model, samples: np.ndarray, options: TranscribeOptions) -> Transcription:
    """openai-whisper's transcribe() on our model: same algorithm, same text."""
    duration = len(samples) / SAMPLE_RATE
    used = {**options.record(), "engine": "sequential"}
    peak = float(np.abs(samples).max()) if len(samples) else 0.0
    samples, spans, core = _speech_windows(samples, options)
    windows = [samples[a:b] for a, b in spans]
    language, probability = options.language, 1.0
    if language is None:
        language, probability = detect_language(model, windows, among=options.languages)
    if not windows or language == "und":
        return Transcription("", [], "und", 0.0, duration, used, peak=peak)
    with warnings.catch_warnings(record=True) as caught, seeded_sampling(0):  # its warnings: the input's own
        warnings.simplefilter("always")
        result = _whisper_transcribe(model, samples, options, language, first_read(spans) / SAMPLE_RATE)
    segments = [_segment(i, s, duration) for i, s in enumerate(result["segments"])]
    if options.vad:
        snap_to_speech(segments, core)
    typed_words(segments)
    if not segments:
        language, probability = "und", 0.0
    out = Transcription(result["text"].strip(), segments, language, probability, duration, used, peak=peak)
    # what openai-whisper tells of the input (UserWarning); its housekeeping (a ResourceWarning of the
    # file its tokenizer leaves open) goes through the caller's filters, which ignore it by default
    ours = [w for w in caught if "whisper" in Path(w.filename).parts and issubclass(w.category, UserWarning)]
    out.warnings.extend(dict.fromkeys(str(w.message) for w in ours))  # each message once
    for other in (w for w in caught if w not in ours):  # through the caller's filters, which "always" set aside
        warnings.warn_explicit(other.message, other.category, other.filename, other.lineno)
    return out


def _speech_windows(
    samples: np.ndarray, options: TranscribeOptions
) -> tuple[np.ndarray, list[tuple[int, int]], list[tuple[int, int]]]:
    """The samples with quiet speech raised (as the batched engine reads them), the (start, end)
    windows of speech, and the speech itself (unpadded; none without VAD). VAD only decides
    whether there is speech at all, where openai-whisper's loop starts and where segments start:
    the algorithm stays openai-whisper's."""
    core: list[tuple[int, int]] = []
    if options.vad:
        regions, core = speech_regions_and_core(samples, options.vad_options)
    else:
        regions = [(i, min(i + WINDOW_SAMPLES, len(samples))) for i in range(0, len(samples), WINDOW_SAMPLES)]
    samples = raised_spans(samples, regions)
    return samples, pack(samples, regions, merge=True) if options.vad else regions, core


def _whisper_transcribe(model, samples: np.ndarray, options: TranscribeOptions, language: str, start: float) -> dict:
    import torch
    from whisper.transcribe import transcribe

    decode = {"beam_size": options.beam_size, "best_of": options.best_of, "patience": options.patience}
    get_tokenizer(model.is_multilingual, num_languages=model.num_languages, language=language, task=options.task)
    return transcribe(
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
        clip_timestamps=[start],
        language=language,
        task=options.task,
        # float16 decoding options are for CUDA: on the CPU openai-whisper warns and uses float32
        fp16=model.device.type != "cpu" and next(model.parameters()).dtype == torch.float16,
        **{k: v for k, v in decode.items() if v is not None},
    )


def _segment(index: int, s: dict, duration: float) -> Segment:
    """openai-whisper's segment dict as a Segment, its end inside the input."""
    return Segment(
        index,
        round(float(s["start"]), 3),
        round(min(float(s["end"]), duration), 3),
        s["text"],
        list(s["tokens"]),
        s["avg_logprob"],
        s["no_speech_prob"],
        s["compression_ratio"],
        s["temperature"],
        [dict(word) for word in s["words"]] if s.get("words") is not None else None,
    )
