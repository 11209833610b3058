"""What both engines share: the options of a transcription, its result, the language, the encoder.

The engines themselves are batched.py (the default: windows cut at pauses, many decoded at
once) and sequential.py (openai-whisper's own transcribe() loop).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .vad import VadOptions
from .windows import plan_windows

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
    language: str  # "und" exactly when no speech was found
    language_probability: float
    duration: float
    options: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    peak: float = 0.0  # the input's largest absolute sample, full scale 1.0

    @property
    def speech(self) -> bool:
        """Whether any speech was transcribed; without it the caller must be told (no_speech_warning)."""
        return bool(self.segments)

    def no_speech_warning(self) -> str | None:
        """The one line that says an input gave no text, with its level, so that quiet audio is never lost unseen."""
        if self.speech:
            return None
        level = f"{20 * np.log10(self.peak):.0f}" if self.peak > 0 else "-inf"
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


def loudness(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(samples, dtype=np.float64)))) if samples.size else 0.0


AUDIBLE_RANGE = 10 ** (-40 / 20)  # a window this far below the loudest one is taken for silence


def language_windows(windows: list[np.ndarray], count: int = 3) -> list[int]:
    """Indices of up to `count` windows, spread over those given, that hold sound: level relative to
    the loudest window, never an absolute one, so a quiet recording is heard like a loud one."""
    levels = [loudness(w) for w in windows]
    loudest = max(levels, default=0.0)
    audible = [i for i, level in enumerate(levels) if level > 0 and level >= loudest * AUDIBLE_RANGE]
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


@contextmanager
def seeded_sampling(seed: int) -> Iterator[None]:
    """Temperature sampling from a fixed seed, so that the same input gives the same text on
    every run; the caller's random state is left as it was."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def identify_language(model, chunks: Iterable[np.ndarray], options: TranscribeOptions) -> tuple[str, float]:
    """Language and probability from up to three speech windows of the first batch; 'und' without speech."""
    windows = plan_windows(chunks, options.vad, options.vad_options)
    first = [w for _, w in itertools.islice(windows, options.batch_size)]
    return language_of(model, first, plan_compute(model, options).encoder)


def language_of(model, windows: list[np.ndarray], compute: str | None = None) -> tuple[str, float]:
    """Language and probability from up to three of the windows that hold sound; 'und' without any."""
    import torch

    chosen = [windows[i] for i in language_windows(windows)]
    features = encode_windows(model, chosen, compute) if chosen else torch.zeros(0)
    tokenizer = get_tokenizer(model.is_multilingual, num_languages=model.num_languages)
    return detect_language(model, features, tokenizer)
