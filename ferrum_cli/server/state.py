"""The state behind the endpoints: what `ferrum serve` was started with, the model and its
engine (loaded on a thread while /health says so), the queue's admission, and a request's way
from its upload to its answer."""

from __future__ import annotations

import asyncio
import logging
import math
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from .. import Ticket
from ..errors import FerrumError, ModelNotFoundError, OverloadedError, ServiceError, UsageError
from ..options import TranscribeOptions
from ..results import Transcription
from .job import Job
from .metrics import ServerMetrics
from .openai_format import APIError, delta_event, diarized_segment, done_event, response_body, sse, token_encoding
from .requests import TranscriptionRequest, Upload
from .uploads import decode_upload

log = logging.getLogger("ferrum.server")
MODEL_ALIASES = ("whisper-1",)  # what clients written for OpenAI send
# OpenAI's other transcription models, which clients of its Realtime API name: served by this model, not listed
OPENAI_TRANSCRIPTION_MODELS = (
    "gpt-4o-transcribe", "gpt-4o-mini-transcribe", "gpt-4o-mini-transcribe-2025-12-15", "gpt-4o-transcribe-diarize",
    "gpt-transcribe", "gpt-live-transcribe", "gpt-realtime-whisper",
)  # fmt: skip
DEFAULT_RATE = 10.0  # audio seconds per second assumed for Retry-After until the server has measured its own
RATE_MEMORY_SECONDS = 600.0  # busy time after which the measured rate halves its past
DISCONNECT_POLL_SECONDS = 0.25


@dataclass(frozen=True)
class ServerSettings:
    """What `ferrum serve` was started with."""

    model: str = "base"
    device: str = "auto"
    dtype: str = "auto"
    threads: int | None = None
    api_key: str | None = None
    max_queue_seconds: float = 3600.0  # audio queued or being decoded, over all requests
    max_upload_mb: float = 25.0  # OpenAI's own limit
    share_batches: bool = True  # False: one request at a time (to measure what sharing gains)
    max_streams: int = 32  # live streams open at once (/v1/realtime, /v1/audio/stream)
    options: TranscribeOptions = TranscribeOptions()  # batch size, compute; the rest comes per request


class Admission:
    """Audio seconds in the queue, and the 429 when a request would take them over the limit.

    Retry-After comes from the throughput measured while requests were queued (audio seconds
    finished per second of wall time with work in hand, all requests together), not from one
    request's time, which includes its wait behind the others."""

    def __init__(self, limit: float) -> None:
        self.limit, self.queued, self.requests = limit, 0.0, 0
        self.finished_seconds, self.busy_seconds = 0.0, 0.0  # audio finished; wall time with work in hand
        self._counted_to = time.monotonic()
        self._lock = threading.Lock()

    @property
    def rate(self) -> float:
        """Audio seconds the server finishes per second, once measured (DEFAULT_RATE before)."""
        if self.busy_seconds < 1.0 or self.finished_seconds <= 0:
            return DEFAULT_RATE
        return self.finished_seconds / self.busy_seconds

    def reserve(self, seconds: float) -> None:
        with self._lock:
            if self.queued and self.queued + seconds > self.limit:
                room_in = min(self.queued, self.queued + seconds - self.limit) / self.rate
                raise OverloadedError(
                    f"the server is busy: {self.queued:.0f} s of audio queued, limit {self.limit:.0f} s; retry later",
                    max(1, math.ceil(room_in)),
                )
            self._count_busy()
            self.queued += seconds
            self.requests += 1

    def release(self, seconds: float, finished: bool) -> None:
        """A request left the queue; finished: its audio was transcribed (not cancelled or refused)."""
        with self._lock:
            self._count_busy()
            self.queued = max(0.0, self.queued - seconds)
            self.requests -= 1
            if finished:
                self.finished_seconds += seconds
            if self.busy_seconds > RATE_MEMORY_SECONDS:  # the recent past counts most
                self.finished_seconds, self.busy_seconds = self.finished_seconds / 2, self.busy_seconds / 2

    def _count_busy(self) -> None:
        """Add the time since the last count to busy_seconds if requests were in hand all along."""
        now = time.monotonic()
        if self.requests:
            self.busy_seconds += now - self._counted_to
        self._counted_to = now


class StreamSlots:
    """Live streams open at once, bounded: each holds a VAD and audio, and feeds the engine in real time."""

    def __init__(self, limit: int) -> None:
        self.limit, self.open_now = limit, 0

    def open(self) -> bool:
        """Take a slot; False when all are taken (the caller refuses the stream)."""
        if self.open_now >= self.limit:
            return False
        self.open_now += 1
        return True

    def close(self) -> None:
        self.open_now -= 1


class Server:
    """The state behind the endpoints: the model (loaded on a thread while /health says so),
    the engine, the queue's admission, the metrics."""

    def __init__(self, settings: ServerSettings, on_fatal=None) -> None:
        self.settings, self.on_fatal = settings, on_fatal
        self.state, self.executor, self.service = "loading", None, None
        self.multilingual = True
        self.model_name = settings.model
        self.admission = Admission(settings.max_queue_seconds)
        self.streams = StreamSlots(settings.max_streams)
        self.metrics = ServerMetrics()
        self.folder = Path(tempfile.mkdtemp(prefix="ferrum-serve-"))

    def load(self) -> None:
        """Load and warm the model; a model that cannot load ends the server (on_fatal)."""
        from .. import WhisperModelExecutor

        start = time.perf_counter()
        settings = self.settings
        try:
            executor = WhisperModelExecutor.from_path(settings.model, settings.device, settings.dtype, settings.threads)
            executor.check_options(self.settings.options)
            executor.warmup()
        except FerrumError as exc:
            log.error("cannot load model %s: %s", self.settings.model, exc.message)
            self.state = "failed"
            if self.on_fatal:
                self.on_fatal(exc)
            return
        info = executor.info()
        self.executor, self.model_name, self.multilingual = executor, info["name"], info["multilingual"]
        self.service = executor.serve(self.settings.share_batches, self._batch_done)
        self.service.on_fatal = self._engine_stopped
        self.state = "ready"
        log.info(
            "ready: model %s on %s (%s) in %.1f s",
            self.model_name, executor.device, executor.dtype, time.perf_counter() - start,
        )  # fmt: skip

    def _engine_stopped(self, error: ServiceError) -> None:
        """The engine's thread cannot go on: /health says so and the process ends (on_fatal), never a hang."""
        log.error("cannot go on: %s", error.message)
        self.state = "failed"
        if self.on_fatal:
            self.on_fatal(error)

    def _batch_done(self, windows: int, batch_size: int) -> None:
        self.metrics.batch_fill.observe(windows / batch_size)

    def close(self) -> None:
        if self.service is not None:
            self.service.close()
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)

    # -- a request ---------------------------------------------------------------------

    def check_model(self, model: str | None) -> None:
        if self.state == "failed":
            raise APIError(503, "the engine stopped; the server is shutting down", "server_error", code="unavailable")
        if self.state != "ready":
            raise APIError(503, f"the model is {self.state}; try again shortly", "server_error", code="model_loading")
        accepted = {self.model_name, self.settings.model, *MODEL_ALIASES, *OPENAI_TRANSCRIPTION_MODELS}
        if model is not None and model.strip() and model.strip() not in accepted:
            raise APIError.of(
                ModelNotFoundError(
                    f"model {model!r} is not served here; this server runs {self.model_name!r} (or send whisper-1)"
                )
            )

    def options_for(self, asked: TranscriptionRequest) -> TranscribeOptions:
        """The request's options on the server's own; what this model cannot do is a 400."""
        options = asked.options(self.settings.options)
        try:
            self.executor.check_options(options)
        except UsageError as exc:
            raise APIError.of(exc, "language" if asked.task == "transcribe" else None) from None
        return options

    async def transcribe(self, request: Request, upload: Upload):
        """One upload, from its form to its answer in the format asked for."""
        asked = upload.request
        self.check_model(asked.model)
        options = self.options_for(asked)
        upload = upload.file
        name = upload.filename or "upload"
        try:
            decoded = await run_in_threadpool(decode_upload, upload.file, self.folder, self.settings.max_queue_seconds)
        except FerrumError as exc:
            raise APIError.of(exc, "file") from None
        finally:
            await upload.close()
        try:
            self.admission.reserve(decoded.seconds)
        except OverloadedError as exc:
            decoded.close()
            raise APIError.of(exc) from None
        self.metrics.queue_requests.set(self.admission.requests)
        self.metrics.queue_audio_seconds.set(self.admission.queued)
        job = Job(asyncio.get_running_loop())
        ticket = Ticket(lambda: decoded, options, job.segment, job.done)
        try:
            self.service.submit(ticket)
        except ServiceError as exc:
            self._finished(decoded, False)
            raise APIError.of(exc) from None
        if asked.stream:
            return StreamingResponse(
                self._events(request, job, ticket, decoded, name, asked),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )  # fmt: skip
        result = None
        try:
            result = await self._wait(request, job, ticket)
        finally:
            self._finished(decoded, isinstance(result, Transcription))
        if result is None:  # the client went away: nobody to answer
            return Response(status_code=499)
        if isinstance(result, FerrumError):
            raise APIError.of(result, "file")
        self._transcribed(result, name)
        body, media_type = response_body(
            result, asked.response_format, asked.task, asked.granularities, self.logprobs_encoding(asked)
        )
        return Response(body, media_type=media_type)

    def logprobs_encoding(self, asked: TranscriptionRequest):
        """The model's token encoding where the request asked for logprobs (include[]), else None."""
        return token_encoding(self.multilingual) if asked.logprobs else None

    def _transcribed(self, result: Transcription, name: str) -> None:
        """A result about to be answered: counted, and its warnings (a truncated upload, a stream
        left unread), which OpenAI's formats have no field for, in the server's log."""
        self.metrics.audio_seconds.inc(result.duration)
        for warning in result.warnings:
            log.warning("%r: %s", name, warning)

    def _finished(self, decoded, transcribed: bool) -> None:
        self.admission.release(decoded.seconds, transcribed)
        decoded.close()
        self.metrics.queue_requests.set(self.admission.requests)
        self.metrics.queue_audio_seconds.set(self.admission.queued)

    async def _wait(self, request: Request, job: Job, ticket: Ticket):
        """The result, or None if the client disconnects first (its windows are then dropped)."""
        while True:
            try:
                return await asyncio.wait_for(asyncio.shield(job.result), DISCONNECT_POLL_SECONDS)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    self.service.cancel(ticket)
                    self.metrics.cancelled.inc()
                    return None

    async def _events(
        self, request: Request, job: Job, ticket: Ticket, decoded, name: str, asked: TranscriptionRequest
    ):
        """Server-sent events: a delta per segment as it is decoded (diarized: a segment event with
        its speaker, once the speakers are known), then done (or an error)."""
        diarized, logprobs = asked.response_format == "diarized_json", self.logprobs_encoding(asked)
        finished, transcribed = False, False
        try:
            first = True
            while True:
                kind, value = await job.events.get()
                if kind == "segment":
                    yield sse(diarized_segment(value[0])) if diarized else delta_event(value[0], first, logprobs)
                    first = False
                    continue
                finished = True
                if isinstance(value, FerrumError):
                    yield sse(APIError.of(value, "file").body(), "error")
                else:
                    transcribed = True
                    self._transcribed(value, name)
                    yield done_event(value, logprobs)
                return
        finally:
            if not finished:  # the client went away mid-stream
                self.service.cancel(ticket)
                self.metrics.cancelled.inc()
            self._finished(decoded, transcribed)


def model_list(server: Server) -> list[dict]:
    """The model served and its OpenAI alias: the names a request may send. Other models on this
    machine need their own `ferrum serve --model NAME` (ferrum status lists them)."""
    created = int(time.time())
    return [
        {"id": name, "object": "model", "created": created, "owned_by": "ferrum"}
        for name in dict.fromkeys([server.model_name, *MODEL_ALIASES])
    ]
