"""A request to transcribe, as OpenAI's fields give it, checked once: the two upload endpoints take
it from their form (FastAPI dependencies), the WebSocket from its query."""

from __future__ import annotations

import base64
import binascii
import math
from dataclasses import dataclass, replace

from fastapi import File, Form, UploadFile

from ..errors import UsageError
from ..languages import language_code, language_codes
from ..options import FALLBACK_INCREMENT, KnownSpeaker, TranscribeOptions, temperatures
from .openai_format import GRANULARITIES, INCLUDES, RESPONSE_FORMATS, SPEAKER_LETTERS, APIError

TASKS = ("transcribe", "translate")
MAX_KNOWN_SPEAKERS = 4  # as OpenAI


@dataclass(frozen=True)
class TranscriptionRequest:
    """What a client asked for; the server's own settings (batch size, compute) come from options()."""

    task: str  # transcribe or translate
    model: str | None  # as sent; the server checks it against the model it serves
    language: str | None = None  # Whisper's code; None: detected
    prompt: str | None = None
    temperature: float = 0.0  # of the first try, 0 to 1
    response_format: str = "json"  # one of RESPONSE_FORMATS
    granularities: tuple[str, ...] = ()  # "segment" and "word", with verbose_json
    stream: bool = False  # server-sent events as segments are decoded
    known_speakers: tuple[KnownSpeaker, ...] = ()  # diarized_json: voices to name where they are heard
    logprobs: bool = False  # include[]=logprobs: each token's log probability, with json
    languages: tuple[str, ...] = ()  # languages[]: those detection may choose from (no language given)
    keywords: str | None = None  # keywords[]: words to expect, as hotwords

    @classmethod
    def checked(
        cls, task: str | None, model: str | None, language: str | None = None, prompt: str | None = None,
        temperature: str | float | None = None, response_format: str | None = None,
        granularities: list[str] | None = None, stream: bool = False, model_required: bool = True,
        known_names: list[str] | None = None, known_references: list[str] | None = None,
        include: list[str] | None = None, languages: list[str] | None = None, keywords: list[str] | None = None,
    ) -> TranscriptionRequest:  # fmt: skip
        """The request, or the APIError (400) of its first bad field."""
        task = (task or "transcribe").strip()
        if task not in TASKS:
            raise APIError(400, "task must be transcribe or translate", param="task")
        fmt = (response_format or "json").strip()
        if fmt not in RESPONSE_FORMATS:
            raise APIError(
                400, f"response_format must be one of {', '.join(RESPONSE_FORMATS)}", param="response_format"
            )
        wanted = tuple(dict.fromkeys(g.strip() for g in granularities or [] if g.strip()))
        if bad := [g for g in wanted if g not in GRANULARITIES]:
            raise APIError(400, f"unknown timestamp granularity {bad[0]!r}; use segment or word",
                           param="timestamp_granularities")  # fmt: skip
        if fmt == "diarized_json" and task != "transcribe":
            raise APIError(400, "diarized_json is for transcriptions", param="response_format")
        if wanted and fmt != "verbose_json":
            raise APIError(400, "timestamp_granularities need response_format=verbose_json",
                           param="timestamp_granularities")  # fmt: skip
        if model_required and not (model or "").strip():  # as OpenAI: the field is required
            raise APIError(400, "you must provide a model parameter (whisper-1 or the model served)", param="model")
        try:
            code = language_code(language) if language else None
        except UsageError as exc:
            raise APIError.of(exc, "language") from None
        try:
            candidates = language_codes(languages or [])
        except UsageError as exc:
            raise APIError.of(exc, "languages") from None
        if code and candidates:
            raise APIError(400, "give language, or languages[] for detection to choose from, not both",
                           param="languages")  # fmt: skip
        expected = ", ".join(word.strip() for word in keywords or [] if word.strip()) or None
        known = _known_speakers(known_names or [], known_references or [], fmt)
        logprobs = _logprobs(include or [], fmt)
        return cls(
            task, model, code, prompt or None, _temperature(temperature), fmt, wanted, stream, known, logprobs,
            candidates, expected,
        )  # fmt: skip

    def options(self, base: TranscribeOptions) -> TranscribeOptions:
        """base (the server's batch size and compute) with this request's task, language and decoding.
        OpenAI's rule: at temperature 0 it rises on fallback; above 0, fallback starts there."""
        words = "word" in self.granularities
        diarize = self.response_format == "diarized_json"
        return replace(
            base, task=self.task, language=self.language, languages=self.languages, initial_prompt=self.prompt,
            hotwords=self.keywords,
            temperature=temperatures(self.temperature, FALLBACK_INCREMENT), word_timestamps=words,
            diarize=diarize, speaker_names=SPEAKER_LETTERS if diarize else (), known_speakers=self.known_speakers,
        )  # fmt: skip


def _known_speakers(names: list[str], references: list[str], fmt: str) -> tuple[KnownSpeaker, ...]:
    """OpenAI's known_speaker_names[] with known_speaker_references[] (data URLs of their audio)."""
    if not names and not references:
        return ()
    param = "known_speaker_names"
    if fmt != "diarized_json":
        raise APIError(400, "known speakers need response_format=diarized_json", param=param)
    if len(names) != len(references):
        raise APIError(400, "give a known_speaker_references[] for each known_speaker_names[]", param=param)
    if len(names) > MAX_KNOWN_SPEAKERS:
        raise APIError(400, f"at most {MAX_KNOWN_SPEAKERS} known speakers", param=param)
    if len(set(names)) < len(names) or not all(name.strip() for name in names):
        raise APIError(400, "each known speaker needs a name of their own", param=param)
    return tuple(KnownSpeaker(name.strip(), _data_url(ref)) for name, ref in zip(names, references))


def _logprobs(include: list[str], fmt: str) -> bool:
    """Whether OpenAI's include[] asks for logprobs, which come with response_format=json only (as OpenAI's)."""
    asked = [value.strip() for value in include if value.strip()]
    if bad := [value for value in asked if value not in INCLUDES]:
        raise APIError(400, f"unknown include[] value {bad[0]!r}; the one there is: logprobs", param="include")
    if asked and fmt != "json":
        raise APIError(400, "include[]=logprobs needs response_format=json", param="include")
    return bool(asked)


def _data_url(value: str) -> bytes:
    head, comma, data = value.partition(",")
    if not (comma and head.startswith("data:") and head.endswith(";base64")):
        raise APIError(400, "a known speaker reference must be a data URL: data:audio/...;base64,...",
                       param="known_speaker_references")  # fmt: skip
    try:
        audio = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, "a known speaker reference is not valid base64", param="known_speaker_references") from None
    if not audio:
        raise APIError(400, "a known speaker reference is empty", param="known_speaker_references")
    return audio


def _temperature(value: str | float | None) -> float:
    try:
        temperature = float(value) if value not in (None, "") else 0.0
    except ValueError:
        raise APIError(400, "temperature must be a number", param="temperature") from None
    if not (math.isfinite(temperature) and 0.0 <= temperature <= 1.0):
        raise APIError(400, "temperature must be between 0 and 1", param="temperature")
    return temperature


class Upload:
    """The form of POST /v1/audio/transcriptions: the file and the checked request."""

    def __init__(
        self,
        file: UploadFile | None = File(None),
        model: str | None = Form(None),
        language: str | None = Form(None),
        prompt: str | None = Form(None),
        response_format: str | None = Form(None),
        temperature: str | None = Form(None),
        timestamp_granularities: list[str] | None = Form(None, alias="timestamp_granularities[]"),
        stream: bool = Form(False),
        known_speaker_names: list[str] | None = Form(None, alias="known_speaker_names[]"),
        known_speaker_references: list[str] | None = Form(None, alias="known_speaker_references[]"),
        include: list[str] | None = Form(None, alias="include[]"),
        languages: list[str] | None = Form(None, alias="languages[]"),
        keywords: list[str] | None = Form(None, alias="keywords[]"),
    ) -> None:
        self.file = _the_file(file)
        self.request = TranscriptionRequest.checked(
            "transcribe", model, language, prompt, temperature, response_format, timestamp_granularities, stream,
            known_names=known_speaker_names, known_references=known_speaker_references, include=include,
            languages=languages, keywords=keywords,
        )  # fmt: skip


class TranslationUpload(Upload):
    """The form of POST /v1/audio/translations: no language, granularities or streaming."""

    def __init__(
        self,
        file: UploadFile | None = File(None),
        model: str | None = Form(None),
        prompt: str | None = Form(None),
        response_format: str | None = Form(None),
        temperature: str | None = Form(None),
    ) -> None:
        self.file = _the_file(file)
        self.request = TranscriptionRequest.checked("translate", model, None, prompt, temperature, response_format)


def _the_file(file) -> UploadFile:
    if file is None or isinstance(file, str):
        raise APIError(400, "no file: send the audio as the multipart field 'file'", param="file")
    return file
