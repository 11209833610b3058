"""The options of a transcription: what a caller may set, grouped as the CLI's help panels are."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_BATCH_SIZE = 64  # windows in one forward pass; the CLI's limit and the executor's capabilities()
COMPUTES = ("auto", "float32", "bfloat16", "int8")
TASKS = ("transcribe", "translate")


FALLBACK_INCREMENT = 0.2  # openai-whisper's --temperature_increment_on_fallback


def temperatures(start: float, increment: float | None) -> tuple[float, ...]:
    """The temperatures tried in turn: from `start`, raised by `increment` on each fallback, up to 1."""
    if increment is None or increment <= 0:
        return (start,)
    steps = int(round((1.0 - start) / increment)) + 1
    return tuple(round(start + i * increment, 4) for i in range(max(steps, 1)))


@dataclass(frozen=True)
class VadOptions:
    """Where speech is: the same knobs as faster-whisper's VadOptions."""

    threshold: float = 0.5  # speech probability at or above which a frame is speech
    neg_threshold: float | None = None  # below this speech ends; None: threshold - 0.15
    min_speech_duration_ms: int = 0  # speech shorter than this is dropped
    max_speech_duration_s: float = float("inf")  # speech longer than this is split
    min_silence_duration_ms: int = 2000  # silence needed to end speech
    speech_pad_ms: int = 400  # audio kept on each side of speech


@dataclass(frozen=True)
class TranscribeOptions:
    """Everything that changes the text of a transcription, with openai-whisper's defaults."""

    # what to produce
    language: str | None = None  # a Whisper language code; None: detect it
    task: str = "transcribe"  # or "translate" (to English)
    multilingual: bool = False  # detect the language of each window, not once per input

    # decoding, as openai-whisper's DecodingOptions and transcribe()
    beam_size: int | None = None  # None: greedy
    best_of: int | None = None  # candidates when sampling at a temperature above 0
    patience: float | None = None  # beam search patience
    temperature: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)  # tried in turn while a window fails
    compression_ratio_threshold: float | None = 2.4  # fails above this gzip ratio (a loop)
    logprob_threshold: float | None = -1.0  # fails under this mean log probability
    no_speech_threshold: float | None = 0.6  # with a failing logprob, silence above this no-speech probability
    condition_on_previous_text: bool = True  # the sequential engine feeds each window's text to the next
    initial_prompt: str | None = None  # text the first window is conditioned on
    hotwords: str | None = None  # names and jargon put ahead of the prompt
    word_timestamps: bool = False  # time each word from the alignment heads' cross-attention

    # where speech is
    vad: bool = True  # False: every sample is decoded
    vad_options: VadOptions = field(default_factory=VadOptions)

    # the engine and its speed
    sequential: bool = False  # openai-whisper's own transcribe() loop
    batch_size: int = 12  # windows decoded together; memory stays flat over an hour at 12
    compute: str = "auto"  # the batched encoder on a CPU: one of COMPUTES

    @property
    def runs_sequentially(self) -> bool:
        """Beam search exists only in openai-whisper's sequential algorithm."""
        return self.sequential or (self.beam_size or 1) > 1

    def prompt_text(self) -> str | None:
        """Hotwords go ahead of the initial prompt: both bias the decoder towards their words."""
        parts = [p.strip() for p in (self.hotwords, self.initial_prompt) if p and p.strip()]
        return " ".join(parts) or None

    def decode_kwargs(self, temperature: float) -> dict:
        """openai-whisper's DecodingOptions for one temperature."""
        kwargs = {"task": self.task, "language": self.language, "temperature": temperature, "fp16": False}
        if temperature > 0:
            kwargs["best_of"] = self.best_of
        else:
            kwargs["beam_size"], kwargs["patience"] = self.beam_size, self.patience
        return kwargs
