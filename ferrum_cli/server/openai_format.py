"""Bodies in the shapes of OpenAI's audio API: the five response formats, stream events, errors."""

from __future__ import annotations

from functools import lru_cache

from fastapi.responses import JSONResponse

from ..errors import (
    AudioDecodeError,
    FerrumError,
    InputError,
    ModelNotFoundError,
    OverloadedError,
    ServiceError,
    TooLargeError,
    UsageError,
)
from ..languages import language_name
from ..results import Segment, Transcription
from ..writers import WRITERS, render, strict_json

RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json", "diarized_json")
LETTERS = tuple(chr(ord("A") + i) for i in range(26))
# OpenAI's labels for speakers it does not know, A to Z; then AA, AB, ... as spreadsheets go on
SPEAKER_LETTERS = LETTERS + tuple(first + second for first in LETTERS for second in LETTERS)
GRANULARITIES = ("segment", "word")
INCLUDES = ("logprobs",)
MEDIA_TYPES = {  # OpenAI's names for the writers'
    "json": WRITERS["json"].media_type,
    "verbose_json": WRITERS["json"].media_type,
    "diarized_json": WRITERS["json"].media_type,
    "text": WRITERS["txt"].media_type,
    "srt": WRITERS["srt"].media_type,
    "vtt": WRITERS["vtt"].media_type,
}


class APIError(Exception):
    """An error response: HTTP status and OpenAI's error object."""

    def __init__(
        self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
        code: str | None = None, headers: dict | None = None,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)

    @classmethod
    def of(cls, exc: FerrumError, param: str | None = None) -> APIError:
        """The status of one of ferrum's typed errors."""
        if isinstance(exc, OverloadedError):
            headers = {"Retry-After": str(exc.retry_after)}
            return cls(429, exc.message, "rate_limit_error", None, "queue_full", headers)
        if isinstance(exc, TooLargeError):
            return cls(413, exc.message, param=param, code="too_large")
        if isinstance(exc, AudioDecodeError):
            return cls(400, f"the file is not audio ffmpeg can read: {exc.message}", param=param, code="invalid_audio")
        if isinstance(exc, (InputError, UsageError)):
            return cls(400, exc.message, param=param)
        if isinstance(exc, ModelNotFoundError):
            return cls(404, exc.message, param="model", code="model_not_found")
        if isinstance(exc, ServiceError):
            return cls(503, exc.message, "server_error", code="unavailable")
        return cls(500, exc.message, "server_error")


def segment_object(segment: Segment) -> dict:
    return {
        "id": segment.id,
        "seek": round(segment.start * 100),  # the mel frame it starts at, as Whisper counts them
        "start": segment.start,
        "end": segment.end,
        "text": segment.text,
        "tokens": segment.tokens,
        "temperature": segment.temperature,
        "avg_logprob": segment.avg_logprob,
        "compression_ratio": segment.compression_ratio,
        "no_speech_prob": segment.no_speech_prob,
    }


def word_objects(result: Transcription) -> list[dict]:
    return [{"word": w.word.strip(), "start": w.start, "end": w.end} for s in result.segments for w in (s.words or [])]


@lru_cache(maxsize=2)
def token_encoding(multilingual: bool):
    """The model's tiktoken encoding, which names each token's bytes for logprob_objects."""
    from whisper.tokenizer import get_encoding

    return get_encoding("multilingual" if multilingual else "gpt2")


def logprob_objects(segments: list[Segment], encoding) -> list[dict] | None:
    """OpenAI's Logprob for each text token: its text, its bytes (a character can span tokens),
    its log probability as decoded. None where a segment's decoding kept none (openai-whisper's own
    beam search, `--sequential`)."""
    if any(s.token_logprobs is None for s in segments):
        return None
    found = []
    for segment in segments:
        for token, logprob in zip(segment.tokens, segment.token_logprobs):
            raw = encoding.decode_single_token_bytes(token)
            found.append({"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)})
    return found


def response_body(
    result: Transcription, fmt: str, task: str, granularities: tuple[str, ...], logprobs_encoding=None
) -> tuple[str, str]:
    """(body, media type) of a finished transcription in one of RESPONSE_FORMATS.
    logprobs_encoding: the model's token_encoding where include[]=logprobs asked for them (json)."""
    if fmt == "json":
        body = {"text": result.text}
        if logprobs_encoding is not None:
            body["logprobs"] = logprob_objects(result.segments, logprobs_encoding)
        body["usage"] = {"type": "duration", "seconds": round(result.duration, 3)}
        body = strict_json(body)
    elif fmt == "text":
        body = result.text + "\n"
    elif fmt in ("srt", "vtt"):
        body = render(result, fmt)
    elif fmt == "diarized_json":
        body = strict_json({
            "task": "transcribe", "duration": result.duration, "text": result.text,
            "segments": [diarized_segment(s) for s in result.segments],
            "usage": {"type": "duration", "seconds": round(result.duration, 3)},
        })  # fmt: skip
    else:
        verbose = {"task": task, "language": language_name(result.language), "duration": result.duration}
        verbose["text"] = result.text
        if "segment" in granularities or not granularities:
            verbose["segments"] = [segment_object(s) for s in result.segments]
        if "word" in granularities:
            verbose["words"] = word_objects(result)
        verbose["usage"] = {"type": "duration", "seconds": round(result.duration, 3)}
        body = strict_json(verbose)
    return body, MEDIA_TYPES[fmt]


def diarized_segment(segment: Segment) -> dict:
    """A segment as OpenAI's TranscriptionDiarizedSegment; also the stream's segment event."""
    return {
        "type": "transcript.text.segment", "id": f"seg_{segment.id}", "start": segment.start, "end": segment.end,
        "speaker": segment.speaker or "A", "text": segment.text.strip(),
    }  # fmt: skip


def sse(event: dict, name: str | None = None) -> str:
    """One server-sent event."""
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {strict_json(event)}\n\n"


def delta_event(segment: Segment, first: bool, logprobs_encoding=None) -> str:
    """The text the segment adds; the deltas joined are the done event's text.
    logprobs_encoding: as response_body's."""
    text = segment.text.lstrip() if first else segment.text
    event = {"type": "transcript.text.delta", "delta": text}
    if logprobs_encoding is not None:
        event["logprobs"] = logprob_objects([segment], logprobs_encoding)
    return sse(event)


def done_event(result: Transcription, logprobs_encoding=None) -> str:
    event = {"type": "transcript.text.done", "text": result.text}
    if logprobs_encoding is not None:
        event["logprobs"] = logprob_objects(result.segments, logprobs_encoding)
    return sse(event)
