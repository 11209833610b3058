"""WS /v1/audio/stream: live audio in, one JSON event per segment out as the engine decodes it.

Query parameters: model, language, prompt, temperature, task (transcribe or translate) as in the
transcription endpoints, and audio_format: `pcm16` (the default: 16 kHz mono 16-bit little-endian
frames) or `any` (a container ffmpeg reads, such as ogg/opus, webm or mp3, as it is recorded).

The client sends the audio as binary messages, then the text message {"type": "end"} (or "end").
The server sends {"type": "segment", "id", "start", "end", "text", "language"} for each segment,
seconds from the start of the stream, then {"type": "done", "text", "language", "duration"}; on
an error {"type": "error", "error": OpenAI's error object}, then it closes.
"""

from __future__ import annotations

import asyncio
import json
import queue
from collections.abc import Iterator

import numpy as np
from starlette.websockets import WebSocket, WebSocketDisconnect

from .. import AudioStream, Ticket
from ..errors import FerrumError, ServiceError
from ..writers import strict_json
from .job import Job
from .openai_format import APIError
from .requests import TranscriptionRequest

AUDIO_FORMATS = ("pcm16", "any")
FEED_CHUNKS = 256  # messages buffered for the engine; past that the socket is read no further
FULL_WAIT_SECONDS = 0.01
CLOSE_ERROR = 1008  # policy violation: the stream was refused or its audio was bad
CLOSE_SERVER_ERROR = 1011
REFUSED_DRAIN_SECONDS = 10.0  # a refused stream's audio is read and dropped this long, for the error to be read


class AudioFeed:
    """Bytes from the socket's task to the engine's reader thread, bounded: a client that sends
    faster than the engine reads is held back by TCP, not buffered here without end."""

    def __init__(self) -> None:
        self._queue: queue.Queue[bytes | None] = queue.Queue(FEED_CHUNKS)
        self.ended = False

    async def put(self, data: bytes) -> None:
        while not self.ended:
            try:
                self._queue.put_nowait(data)
                return
            except queue.Full:
                await asyncio.sleep(FULL_WAIT_SECONDS)

    def end(self) -> None:
        """No more audio: the reader sees the stream end once it has read what came before."""
        if not self.ended:
            self.ended = True
            while True:  # the end marker must get in even if the reader has stopped reading
                try:
                    self._queue.put_nowait(None)
                    return
                except queue.Full:
                    self._queue.get_nowait()

    def __iter__(self) -> Iterator[bytes]:
        while (data := self._queue.get()) is not None:
            yield data


def pcm16_chunks(feed: AudioFeed) -> Iterator[np.ndarray]:
    """float32 samples of 16-bit frames, which messages may split anywhere."""
    pending = b""
    for data in feed:
        data = pending + data
        usable = len(data) - len(data) % 2
        pending = data[usable:]
        if usable:
            yield np.frombuffer(data[:usable], "<i2").astype(np.float32) / 32768.0


def opener(feed: AudioFeed, audio_format: str):
    if audio_format == "pcm16":
        return lambda: pcm16_chunks(feed)
    return lambda: iter(AudioStream("pipe:0", live=True, feed=feed))


def segment_event(segment, language: str) -> dict:
    return {
        "type": "segment", "id": segment.id, "start": segment.start, "end": segment.end,
        "text": segment.text, "language": language,
    }  # fmt: skip


async def stream(websocket: WebSocket, server) -> None:
    """One live stream, from accept to close; server: the app's Server (its engine, options, metrics)."""
    await websocket.accept()
    params = websocket.query_params
    try:
        audio_format = params.get("audio_format", "pcm16").strip()
        if audio_format not in AUDIO_FORMATS:
            raise APIError(400, f"audio_format must be one of {', '.join(AUDIO_FORMATS)}", param="audio_format")
        asked = TranscriptionRequest.checked(
            params.get("task"), params.get("model"), params.get("language"), params.get("prompt"),
            params.get("temperature"), model_required=False,
        )  # fmt: skip
        server.check_model(asked.model)
        options = server.options_for(asked)
    except APIError as exc:
        await _refuse(websocket, exc)
        return
    feed, job = AudioFeed(), Job(asyncio.get_running_loop())
    ticket = Ticket(opener(feed, audio_format), options, job.segment, job.done, live=True)
    try:
        server.service.submit(ticket)
    except ServiceError as exc:
        await _close_with(websocket, APIError.of(exc), CLOSE_SERVER_ERROR)
        return
    server.metrics.live_streams.inc()
    reader = asyncio.create_task(_read_audio(websocket, feed, job))
    finished = False
    try:
        while True:
            kind, value = await job.events.get()
            if kind == "gone":
                return
            if kind == "segment":
                await websocket.send_text(strict_json(segment_event(*value)))
                continue
            finished = True
            if isinstance(value, FerrumError):
                await _close_with(websocket, APIError.of(value, "audio"), CLOSE_ERROR)
                return
            server.metrics.audio_seconds.inc(value.duration)
            done = {"type": "done", "text": value.text, "language": value.language, "duration": value.duration}
            await websocket.send_text(strict_json(done))
            await websocket.close()
            return
    except (WebSocketDisconnect, RuntimeError):  # the client went away while we wrote
        return
    finally:
        reader.cancel()
        feed.end()
        server.metrics.live_streams.dec()
        if not finished:
            server.service.cancel(ticket)
            server.metrics.cancelled.inc()


async def _read_audio(websocket: WebSocket, feed: AudioFeed, job: Job) -> None:
    """The client's messages into the feed until "end"; a client that goes away before it is gone."""
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            if message.get("bytes") is not None:
                await feed.put(message["bytes"])
            elif _is_end(message.get("text")):
                feed.end()
                return
    except (WebSocketDisconnect, RuntimeError):
        pass
    feed.end()
    job.events.put_nowait(("gone", None))


def _is_end(text: str | None) -> bool:
    if text is None:
        return False
    if text.strip() == "end":
        return True
    try:
        return json.loads(text).get("type") == "end"
    except (ValueError, AttributeError):
        return False


async def _refuse(websocket: WebSocket, error: APIError) -> None:
    """The error, then the client's audio read and dropped until its "end" (at most REFUSED_DRAIN_SECONDS)
    before the close: a client that sends all its audio before it reads still finds the error."""
    try:
        await websocket.send_text(strict_json({"type": "error", **error.body()}))
        deadline = asyncio.get_running_loop().time() + REFUSED_DRAIN_SECONDS
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            message = await asyncio.wait_for(websocket.receive(), left)
            if message["type"] == "websocket.disconnect" or _is_end(message.get("text")):
                break
    except (WebSocketDisconnect, RuntimeError, asyncio.TimeoutError):
        pass
    await _close(websocket, CLOSE_ERROR, error.message)


async def _close_with(websocket: WebSocket, error: APIError, code: int) -> None:
    try:
        await websocket.send_text(strict_json({"type": "error", **error.body()}))
    except (WebSocketDisconnect, RuntimeError):
        return
    await _close(websocket, code, error.message)


async def _close(websocket: WebSocket, code: int, reason: str) -> None:
    """The close, with as much of reason as its 123 bytes hold."""
    try:
        await websocket.close(code, reason.encode()[:120].decode("utf-8", "ignore"))
    except (WebSocketDisconnect, RuntimeError):
        pass
