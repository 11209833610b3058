"""WS /v1/realtime: OpenAI's Realtime API in transcription mode, so that clients written for it
(openai-python's `client.realtime.connect`, speaches' clients) work with only the URL changed.

The client appends audio (base64 in `input_audio_buffer.append`); with server_vad, each turn of
speech is committed when it ends, and without turn detection when the client commits. Each
committed item is transcribed by the server's one engine, in the same batches as the uploads
and the other streams, and comes back as `...input_audio_transcription.delta` events (one per
segment) and `.completed`. Bad events get an `error` event and the session goes on, as OpenAI's.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import secrets

from starlette.websockets import WebSocket, WebSocketDisconnect

from .. import SAMPLE_RATE, InputBuffer, PcmDecoder, SpeechStarted, SpeechStopped, Ticket, Turn
from ..errors import FerrumError, ServiceError
from ..options import TranscribeOptions
from ..results import Transcription
from ..writers import strict_json
from .job import Job
from .openai_format import APIError, logprob_objects, token_encoding
from .realtime_config import RealtimeError, SessionConfig
from .requests import TranscriptionRequest

log = logging.getLogger("ferrum.server")
MAX_MESSAGE_BYTES = 15 << 20  # OpenAI's limit on one client event
MAX_HELD_SECONDS = 600.0  # uncommitted audio a session holds at most; appends past it are refused
MIN_COMMIT_MS = 100  # OpenAI's least audio a commit takes
LOGPROBS = "item.input_audio_transcription.logprobs"  # what session.include names to get them
OUTBOX_EVENTS = 1024  # server events waiting for a slow reader, at most; past that the session ends


def event_id() -> str:
    return "event_" + secrets.token_hex(10)


def item_id() -> str:
    return "item_" + secrets.token_hex(10)


def error_event(message: str, code: str | None, param: str | None = None, client_event: str | None = None,
                kind: str = "invalid_request_error") -> dict:  # fmt: skip
    error = {"type": kind, "code": code, "message": message, "param": param, "event_id": client_event}
    return {"type": "error", "event_id": event_id(), "error": error}


class RealtimeSession:
    """One connection: its settings, its input buffer, and its items being transcribed."""

    def __init__(self, websocket: WebSocket, server) -> None:
        self.websocket, self.server = websocket, server
        self.config = SessionConfig()
        self.beta = False  # the client spoke the beta protocol: its session events come back in beta shape
        self.buffer = InputBuffer(self.config.turns)
        self.decoder = PcmDecoder(self.config.format)
        self.options = server.options_for(TranscriptionRequest.checked("transcribe", None, model_required=False))
        self.outbox: asyncio.Queue[str | None] = asyncio.Queue(OUTBOX_EVENTS)
        self.speech_item: str | None = None  # the item the turn in progress will become
        self.last_item: str | None = None
        self.items: dict[str, Ticket] = {}  # being transcribed
        self.deliveries: set[asyncio.Task] = set()
        self.delivered = asyncio.Event()  # the last committed item's events are all sent
        self.delivered.set()

    async def run(self) -> None:
        writer = asyncio.create_task(self._write())
        try:
            self.send({"type": "session.created", "event_id": event_id(), "session": self.config.session()})
            while True:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                await self._take(message)
        except (WebSocketDisconnect, RuntimeError, _Gone):
            return
        finally:
            for ticket in self.items.values():
                self.server.service.cancel(ticket)
            for task in self.deliveries:
                task.cancel()
            writer.cancel()

    def send(self, event: dict) -> None:
        try:
            self.outbox.put_nowait(strict_json(event))
        except asyncio.QueueFull:  # the client reads nothing: the session ends rather than hold its events without end
            raise _Gone() from None

    async def _write(self) -> None:
        try:
            while (text := await self.outbox.get()) is not None:
                await self.websocket.send_text(text)
        except (WebSocketDisconnect, RuntimeError):
            pass

    # -- client events -------------------------------------------------------------------

    async def _take(self, message: dict) -> None:
        text = message.get("text")
        if text is None:
            self.send(error_event("send client events as JSON text messages", "invalid_value"))
            return
        if len(text) > MAX_MESSAGE_BYTES:
            size = f"{len(text) / (1 << 20):.1f} MiB"
            limit = f"{MAX_MESSAGE_BYTES >> 20} MiB"
            self.send(
                error_event(
                    f"a client event may be {limit} at most; this one was {size}, not taken", "message_too_large"
                )
            )
            return
        try:
            event = json.loads(text)
        except ValueError as exc:
            self.send(error_event(f"the event is not valid JSON: {exc}", "invalid_json"))
            return
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            self.send(error_event("a client event is a JSON object with a string `type`", "invalid_value", "type"))
            return
        handler = HANDLERS.get(event["type"])
        client_event = event.get("event_id") if isinstance(event.get("event_id"), str) else None
        if handler is None:
            known = ", ".join(HANDLERS)
            self.send(error_event(f"unknown event type {event['type']!r}; this server takes {known}",
                                  "invalid_value", "type", client_event))  # fmt: skip
            return
        try:
            await handler(self, event)
        except RealtimeError as exc:
            self.send(error_event(exc.message, exc.code, exc.param, client_event))

    async def _session_update(self, event: dict) -> None:
        self._configure(self.config.updated(event.get("session")), beta=False)

    async def _beta_session_update(self, event: dict) -> None:
        self._configure(self.config.updated_beta(event.get("session")), beta=True)

    def _configure(self, config: SessionConfig, beta: bool) -> None:
        t = config.transcription
        try:
            asked = TranscriptionRequest.checked("transcribe", t.model, t.language, t.prompt, model_required=False)
            self.server.check_model(asked.model)
            options = self.server.options_for(asked)
        except APIError as exc:
            field = "session.input_audio_transcription" if beta else "session.audio.input.transcription"
            raise RealtimeError(exc.message, exc.code or "invalid_value", f"{field}.{exc.param or 'model'}") from None
        if config.format != self.config.format:
            self.buffer.feed(self.decoder.flush())
            self.decoder = PcmDecoder(config.format)
        if config.turns != self.config.turns:
            if self.buffer.speaking:  # the turn in progress is not lost: it is committed as it stands
                self._commit(self.buffer.commit())
            self.buffer.turns = config.turns
        self.config, self.options, self.beta = config, options, beta
        if beta:
            self.send(
                {"type": "transcription_session.updated", "event_id": event_id(), "session": config.session_beta()}
            )
        else:
            self.send({"type": "session.updated", "event_id": event_id(), "session": config.session()})

    async def _append(self, event: dict) -> None:
        audio = event.get("audio")
        if not isinstance(audio, str):
            raise RealtimeError("input_audio_buffer.append needs `audio`: base64 of the audio", param="audio")
        try:
            data = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise RealtimeError("`audio` is not valid base64", param="audio") from None
        seconds = len(data) / self.config.format.bytes_per_sample / self.config.format.rate
        if self.buffer.held_seconds + seconds > MAX_HELD_SECONDS:
            raise RealtimeError(
                f"the input audio buffer holds {self.buffer.held_seconds:.0f} s, and takes at most "
                f"{MAX_HELD_SECONDS:.0f} s: commit it (input_audio_buffer.commit) or turn on server_vad; "
                "this append was not added", "input_audio_buffer_full", "audio",
            )  # fmt: skip
        events = await asyncio.to_thread(self._hear, data)  # Silero reads the frames: off the event loop
        for found in events:
            if isinstance(found, SpeechStarted):
                self.speech_item = item_id()
                self.send({"type": "input_audio_buffer.speech_started", "event_id": event_id(),
                           "audio_start_ms": found.start_ms, "item_id": self.speech_item})  # fmt: skip
            elif isinstance(found, SpeechStopped):
                item = self.speech_item or item_id()
                self.send({"type": "input_audio_buffer.speech_stopped", "event_id": event_id(),
                           "audio_end_ms": found.turn.end_ms, "item_id": item})  # fmt: skip
                self.speech_item = None
                self._commit(found.turn, item)

    def _hear(self, data: bytes) -> list:
        return self.buffer.feed(self.decoder.decode(data))

    async def _commit_event(self, event: dict) -> None:
        self.buffer.feed(self.decoder.flush())
        if self.buffer.held_seconds * 1000 < MIN_COMMIT_MS and not self.buffer.speaking:
            held = self.buffer.held_seconds * 1000
            raise RealtimeError(f"Error committing input audio buffer: buffer too small. Expected at least "
                                f"{MIN_COMMIT_MS}ms of audio, but buffer only has {held:.2f}ms of audio.",
                                "input_audio_buffer_commit_empty")  # fmt: skip
        self._commit(self.buffer.commit(), self.speech_item)
        self.speech_item = None

    async def _clear(self, event: dict) -> None:
        self.decoder.flush()
        self.buffer.clear()
        self.speech_item = None
        self.send({"type": "input_audio_buffer.cleared", "event_id": event_id()})

    # -- items ---------------------------------------------------------------------------

    def _commit(self, turn: Turn, item: str | None = None) -> None:
        item = item or item_id()
        self.send({"type": "input_audio_buffer.committed", "event_id": event_id(), "item_id": item,
                   "previous_item_id": self.last_item})  # fmt: skip
        self.last_item = item
        self._transcribe(item, turn, self.options)

    def _transcribe(self, item: str, turn: Turn, options: TranscribeOptions) -> None:
        job = Job(asyncio.get_running_loop())
        ticket = Ticket(lambda samples=turn.samples: iter([samples]), options, job.segment, job.done)
        try:
            self.server.service.submit(ticket)
        except ServiceError as exc:
            self._failed(
                item, APIError.of(exc)
            )  # the items before it may still be decoding: this one has no text to wait with
            return
        self.items[item] = ticket
        before, self.delivered = self.delivered, asyncio.Event()
        task = asyncio.create_task(self._deliver(item, job, len(turn.samples), before, self.delivered))
        self.deliveries.add(task)
        task.add_done_callback(self.deliveries.discard)

    async def _deliver(self, item: str, job: Job, samples: int, before: asyncio.Event, done: asyncio.Event) -> None:
        """The item's segments as deltas while the engine decodes it, then its whole transcript;
        in the order the items were committed (the engine may finish a later, shorter one first)."""
        await before.wait()
        try:
            await self._deliver_events(item, job, samples)
        finally:
            done.set()

    def _logprobs(self, segments: list) -> dict:
        """The session's include asks for each token's log probability: {"logprobs": [...]}, else {}."""
        if LOGPROBS not in self.config.include:
            return {}
        return {"logprobs": logprob_objects(segments, token_encoding(self.server.multilingual))}

    async def _deliver_events(self, item: str, job: Job, samples: int) -> None:
        first = True
        while True:
            kind, value = await job.events.get()
            if kind == "segment":
                segment, _language = value
                delta = segment.text.lstrip() if first else segment.text
                first = False
                self.send({"type": "conversation.item.input_audio_transcription.delta", "event_id": event_id(),
                           "item_id": item, "content_index": 0, "delta": delta,
                           **self._logprobs([segment])})  # fmt: skip
                continue
            self.items.pop(item, None)
            if isinstance(value, FerrumError):
                self._failed(item, APIError.of(value))
                return
            self._completed(item, value, samples)
            return

    def _completed(self, item: str, result: Transcription, samples: int) -> None:
        self.server.metrics.audio_seconds.inc(result.duration)
        self.send({
            "type": "conversation.item.input_audio_transcription.completed", "event_id": event_id(),
            "item_id": item, "content_index": 0, "transcript": "".join(s.text for s in result.segments).strip(),
            **self._logprobs(result.segments),
            "usage": {"type": "duration", "seconds": round(samples / SAMPLE_RATE, 3)},
        })  # fmt: skip

    def _failed(self, item: str, error: APIError) -> None:
        self.send({
            "type": "conversation.item.input_audio_transcription.failed", "event_id": event_id(),
            "item_id": item, "content_index": 0,
            "error": {"type": error.type, "code": error.code, "message": error.message, "param": error.param},
        })  # fmt: skip


class _Gone(Exception):
    """The client stopped reading its events."""


HANDLERS = {
    "session.update": RealtimeSession._session_update,
    "transcription_session.update": RealtimeSession._beta_session_update,
    "input_audio_buffer.append": RealtimeSession._append,
    "input_audio_buffer.commit": RealtimeSession._commit_event,
    "input_audio_buffer.clear": RealtimeSession._clear,
}


async def realtime(websocket: WebSocket, server) -> None:
    """One Realtime connection, from the handshake to the close."""
    try:
        server.check_model(None)
    except APIError as exc:
        await _refuse_with_event(websocket, exc)
        return
    server.metrics.live_streams.inc()
    try:
        await websocket.accept()
        await RealtimeSession(websocket, server).run()
    finally:
        server.metrics.live_streams.dec()
        try:
            await websocket.close()
        except RuntimeError:
            pass


async def refuse_busy(websocket: WebSocket, limit: int) -> None:
    """A 429 in OpenAI's shape in place of the handshake where the server can send one; else the
    error as the first event and a close meaning "try again later"."""
    error = APIError(429, f"this server takes {limit} live streams at once, and has that many open; try again "
                     "shortly", "rate_limit_error", code="too_many_streams")  # fmt: skip
    try:
        await websocket.send_denial_response(error.response())
        return
    except RuntimeError:
        pass
    await _refuse_with_event(websocket, error)


async def _refuse_with_event(websocket: WebSocket, error: APIError) -> None:
    """The error as the connection's one event, then a close meaning "try again later"."""
    await websocket.accept()
    await websocket.send_text(strict_json(error_event(error.message, error.code, kind=error.type)))
    await websocket.close(1013)
