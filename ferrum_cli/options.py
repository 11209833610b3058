"""The options of a transcription: what a caller may set, grouped as the CLI's help panels are."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace

from .errors import UsageError
from .languages import language_code

MAX_BATCH_SIZE = 64  # windows in one forward pass; the CLI's limit and the executor's capabilities()
COMPUTES = ("auto", "float32", "bfloat16", "int8")
TASKS = ("transcribe", "translate")


FALLBACK_INCREMENT = 0.2  # openai-whisper's --temperature_increment_on_fallback


def temperatures(start: float, increment: float | None) -> tuple[float, ...]:
    """The temperatures tried in turn: from `start`, raised by `increment` on each fallback, up to 1."""
    _within("temperature", start, 0.0, 1.0)  # nan passes a range check; it would fail below
    if increment is not None:
        _within("temperature_increment_on_fallback", increment, -math.inf, math.inf)
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

    def check(self) -> None:
        """UsageError for the first value out of its range."""
        _within("vad threshold", self.threshold, 0.0, 1.0)
        if self.neg_threshold is not None:
            _within("vad neg_threshold", self.neg_threshold, 0.0, 1.0)
        _within("vad max_speech_duration_s", self.max_speech_duration_s, 1.0, math.inf, finite=False)
        for name in ("min_speech_duration_ms", "min_silence_duration_ms", "speech_pad_ms"):
            _within(f"vad {name}", getattr(self, name), 0, math.inf)


@dataclass(frozen=True)
class KnownSpeaker:
    """A speaker to name where diarization hears their voice: a sample of them alone, 2 to 10 s."""

    name: str
    reference: bytes = field(repr=False)  # audio in any format ffmpeg reads


@dataclass(frozen=True)
class TranscribeOptions:
    """Everything that changes the text of a transcription, with openai-whisper's defaults."""

    # what to read
    audio_stream: int | None = None  # which of an input's audio streams, from 0; None: the one ffmpeg picks

    # what to produce
    language: str | None = None  # a Whisper language code; None: detect it
    languages: tuple[str, ...] = ()  # with language None: the languages detection may pick, codes; (): any
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
    word_probabilities: bool = True  # each timed word's probability; False: times only (batched engine)

    # where speech is
    vad: bool = True  # False: every sample is decoded
    vad_options: VadOptions = field(default_factory=VadOptions)

    # the engine and its speed
    sequential: bool = False  # openai-whisper's own transcribe() loop
    batch_size: int = 12  # windows decoded together; memory stays flat over an hour at 12
    pack_short: bool = True  # short inputs of one known language share windows (docs/performance.md)
    compute: str = "auto"  # the batched encoder on a CPU: one of COMPUTES

    # who spoke when: the post-processing stage's, after the engine (ferrum_cli.post)
    diarize: bool = False  # a speaker on every segment and word
    speakers: int | None = None  # exactly this many speakers
    min_speakers: int | None = None
    max_speakers: int | None = None
    speaker_names: tuple[str, ...] = ()  # names for the speakers in order of first appearance
    known_speakers: tuple[KnownSpeaker, ...] = ()  # named where their voice is heard; others as above

    def __post_init__(self) -> None:
        """The forms a caller writes by hand, as openai-whisper and faster-whisper take them: one
        temperature, "en,de" for languages and "Ann,Bob" for speaker names (a string was read
        letter by letter: speakers named "A", "n", "n"), a dict of VAD settings, numpy's numbers."""
        for f in fields(self):
            object.__setattr__(self, f.name, _plain(getattr(self, f.name)))
        if isinstance(self.temperature, numbers.Real):
            object.__setattr__(self, "temperature", (self.temperature,))
        for name in ("temperature", "languages", "speaker_names", "known_speakers"):
            value = getattr(self, name)
            if isinstance(value, str):
                value = [part.strip() for part in value.split(",") if part.strip()]
            if isinstance(value, (list, tuple)):
                object.__setattr__(self, name, tuple(map(_plain, value)))
        if isinstance(self.known_speakers, KnownSpeaker):
            object.__setattr__(self, "known_speakers", (self.known_speakers,))
        elif isinstance(self.known_speakers, dict):  # {"Ann": sample bytes}
            pairs = tuple(KnownSpeaker(name, sample) for name, sample in self.known_speakers.items())
            object.__setattr__(self, "known_speakers", pairs)
        if isinstance(self.vad_options, dict):
            try:
                object.__setattr__(self, "vad_options", VadOptions(**self.vad_options))
            except TypeError:
                known = ", ".join(f.name for f in fields(VadOptions))
                raise UsageError(f"vad_options takes {known}; not {sorted(self.vad_options)}") from None

    @property
    def runs_sequentially(self) -> bool:
        """openai-whisper's own loop, asked for by name."""
        return self.sequential

    def check(self, named: Callable[[str], str] = str) -> None:
        """Every option in its range, once, for every caller (the CLI, the server, a library user):
        UsageError naming the first that is not. compute, and the model's and the machine's limits
        (an English-only model, int8 on this CPU), are the executor's check_options. named: an
        option as the caller's users know it (the CLI: its flag) where two options disagree."""
        for name in WHOLE_FIELDS:
            if getattr(self, name) is not None and not _is_whole(getattr(self, name)):
                raise UsageError(f"{name} must be a whole number, not {getattr(self, name)!r}")
        for name in FLAG_FIELDS:
            if not isinstance(getattr(self, name), bool):
                raise UsageError(f"{name} must be True or False, not {getattr(self, name)!r}")
        for name in ("initial_prompt", "hotwords"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise UsageError(f"{name} must be text, not {getattr(self, name)!r}")
        if not isinstance(self.vad_options, VadOptions):
            raise UsageError(f"vad_options must be a VadOptions or a dict of its fields, not {self.vad_options!r}")
        if self.audio_stream is not None:
            _within("audio_stream", self.audio_stream, 0, math.inf)
        if self.task not in TASKS:
            raise UsageError(f"task must be one of {', '.join(TASKS)}, not {self.task!r}")
        if self.language is not None and language_code(self.language) != self.language:
            raise UsageError(f"language must be a Whisper language code such as 'en', not {self.language!r}")
        if bad := [code for code in self.languages if language_code(code) != code]:
            raise UsageError(f"languages must be Whisper language codes such as 'en', not {bad[0]!r}")
        if self.language is not None and self.languages:
            either = f"{named('language')}, or {named('languages')} for detection to choose from"
            raise UsageError(f"give {either}, not both")
        _within("batch_size", self.batch_size, 1, MAX_BATCH_SIZE)
        for name in ("beam_size", "best_of"):
            if getattr(self, name) is not None:
                _within(name, getattr(self, name), 1, math.inf)
        if self.patience is not None:
            _within("patience", self.patience, 0.0, math.inf)
            if self.beam_size is None:
                raise UsageError(f"{named('patience')} needs {named('beam_size')}")
            if round(self.beam_size * self.patience) < 1:  # beam search ends at round(size x patience) finished
                least = f"above {0.5 / self.beam_size:g} with {named('beam_size')} {self.beam_size}"
                raise UsageError(f"{named('patience')} must be {least}, not {self.patience!r}")
        if not self.temperature:
            raise UsageError("temperature needs at least one value")
        for temperature in self.temperature:
            _within("temperature", temperature, 0.0, 1.0)
        if self.no_speech_threshold is not None:
            _within("no_speech_threshold", self.no_speech_threshold, 0.0, 1.0)
        for name in ("compression_ratio_threshold", "logprob_threshold"):
            if getattr(self, name) is not None:
                _within(name, getattr(self, name), -math.inf, math.inf)
        self.vad_options.check()
        for name in ("speakers", "min_speakers", "max_speakers"):
            if getattr(self, name) is not None:
                _within(name, getattr(self, name), 1, 100)
        if self.min_speakers and self.max_speakers and self.min_speakers > self.max_speakers:
            least, most = named("min_speakers"), named("max_speakers")
            raise UsageError(f"{least} ({self.min_speakers}) is above {most} ({self.max_speakers})")
        if self.speakers and (self.min_speakers or self.max_speakers):
            either = f"{named('speakers')}, or {named('min_speakers')} and {named('max_speakers')}"
            raise UsageError(f"give {either}, not both")
        given = [name for name in SPEAKER_FIELDS if getattr(self, name)]
        if given and not self.diarize:
            verb = "needs" if len(given) == 1 else "need"
            raise UsageError(f"{', '.join(map(named, given))} {verb} {named('diarize')}")
        for name in self.speaker_names:
            if not isinstance(name, str):
                raise UsageError(f"{named('speaker_names')} must be text, not {type(name).__name__}")
        for known in self.known_speakers:
            if not isinstance(known, KnownSpeaker):
                raise UsageError(
                    f"{named('known_speakers')} holds KnownSpeaker(name, sample), not {type(known).__name__}"
                )
            if not isinstance(known.name, str):
                raise UsageError(f"a known speaker's name must be text, not {type(known.name).__name__}")
            if not isinstance(known.reference, (bytes, bytearray)):
                sample = type(known.reference).__name__
                raise UsageError(
                    f"a known speaker's sample is its audio's bytes (Path(...).read_bytes()), not {sample}"
                )
        names = [*self.speaker_names, *(known.name for known in self.known_speakers)]
        if any(not name.strip() for name in names):
            raise UsageError("a speaker name is empty")
        known = [known.name for known in self.known_speakers]
        if len(set(known)) < len(known):
            raise UsageError("each known speaker needs a name of their own")

    def for_engine(self) -> TranscribeOptions:
        """What the engine runs: without the stages after it, and with word times when a stage
        needs them (diarization gives each word its speaker; then, unless they are asked for,
        the words are times only, which spares about a third of the alignment: docs/performance.md)."""
        post = {f.name: f.default for f in fields(self) if f.name in POST_FIELDS}
        if self.diarize and not self.word_timestamps:
            return replace(self, **post, word_timestamps=True, word_probabilities=False)
        return replace(self, **post)

    def record(self) -> dict:
        """The options as a transcription's result records them: the stages after the engine only
        where they ran, so a plain run's record is what it was before they existed."""
        used = asdict(replace(self, known_speakers=()))  # not a deep copy of their samples' audio
        if not self.diarize:
            for name in POST_FIELDS:
                used.pop(name)
        else:  # the names, not the audio of their samples
            used["known_speakers"] = [known.name for known in self.known_speakers]
        return used

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


SPEAKER_FIELDS = ("speakers", "min_speakers", "max_speakers", "speaker_names", "known_speakers")  # with diarize only
WHOLE_FIELDS = ("audio_stream", "beam_size", "best_of", "batch_size", "speakers", "min_speakers", "max_speakers")
FLAG_FIELDS = ("multilingual", "condition_on_previous_text", "word_timestamps", "word_probabilities", "vad",
               "sequential", "pack_short", "diarize")  # fmt: skip
POST_FIELDS = ("diarize", *SPEAKER_FIELDS)


def _plain(value):
    """numpy's numbers as Python's: json writes those (a result records its options)."""
    return value.item() if isinstance(value, numbers.Number) and hasattr(value, "item") else value


def _is_whole(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)  # numpy's integers too


def _within(name: str, value, low: float, high: float, finite: bool = True) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value):
        raise UsageError(f"{name} must be a number, not {value!r}")
    if (finite and not math.isfinite(value)) or not low <= value <= high:
        if low == -math.inf and high == math.inf:
            raise UsageError(f"{name} must be a finite number, not {value!r}")
        bounds = f"at least {low}" if high == math.inf else f"between {low} and {high}"
        raise UsageError(f"{name} must be {bounds}, not {value!r}")
