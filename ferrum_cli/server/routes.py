"""The endpoints, by area: `audio` (OpenAI's uploads, its Realtime WebSocket and ferrum's live one) and `service`
(models, health, metrics). Each takes the Server from the app and its checked request from
requests.py; the work is the Server's."""

from __future__ import annotations

import logging
import time

from fastapi import APIRouter, Depends, Request, WebSocket
from fastapi.responses import JSONResponse, PlainTextResponse

from ..errors import ModelNotFoundError
from .openai_format import APIError
from .realtime import realtime, refuse_busy
from .requests import TranslationUpload, Upload
from .state import Server, model_list
from .stream import stream

log = logging.getLogger("ferrum.server")
audio = APIRouter()
service = APIRouter()


def server_of(request: Request) -> Server:
    return request.app.state.server


async def answer(request: Request, server: Server, upload: Upload):
    """The Server's answer; a bug is one line in the log and a 500 in OpenAI's shape."""
    start = time.perf_counter()
    try:
        response = await server.transcribe(request, upload)
    except APIError as exc:
        response = exc.response()
    except Exception as exc:
        log.error("internal error on %s: %s: %s", request.url.path, type(exc).__name__, exc)
        log.debug("internal error", exc_info=True)
        response = APIError(500, "internal server error", "server_error").response()
    server.metrics.latency.labels(request.url.path).observe(time.perf_counter() - start)
    return response


@audio.post("/v1/audio/transcriptions")
async def transcriptions(request: Request, upload: Upload = Depends(), server: Server = Depends(server_of)):
    return await answer(request, server, upload)


@audio.post("/v1/audio/translations")
async def translations(
    request: Request, upload: TranslationUpload = Depends(), server: Server = Depends(server_of)
):  # fmt: skip
    return await answer(request, server, upload)


@audio.websocket("/v1/audio/stream")
async def audio_stream(websocket: WebSocket):
    await live(websocket, stream)


@audio.websocket("/v1/realtime")
async def realtime_stream(websocket: WebSocket):
    await live(websocket, realtime)


async def live(websocket: WebSocket, handler) -> None:
    """A live stream in one of the server's slots for them (429 when all are taken); a bug is one line in the log."""
    server: Server = websocket.app.state.server
    if not server.streams.open():
        await refuse_busy(websocket, server.streams.limit)
        return
    try:
        await handler(websocket, server)
    except Exception as exc:
        log.error("internal error on %s: %s: %s", websocket.url.path, type(exc).__name__, exc)
        log.debug("internal error", exc_info=True)
    finally:
        server.streams.close()


@service.get("/v1/models")
async def models(server: Server = Depends(server_of)):
    return {"object": "list", "data": model_list(server)}


@service.get("/v1/models/{model:path}")
async def model(model: str, server: Server = Depends(server_of)):
    """One of the names /v1/models lists (the openai client's models.retrieve)."""
    for listed in model_list(server):
        if listed["id"] == model:
            return listed
    raise APIError.of(ModelNotFoundError(f"the model {model!r} does not exist here; GET /v1/models lists those served"))


@service.get("/health")
async def health(server: Server = Depends(server_of)):
    status = 200 if server.state == "ready" else 503
    return JSONResponse({"status": server.state, "model": server.model_name}, status_code=status)


@service.get("/metrics")
async def metrics(server: Server = Depends(server_of)):
    body, media_type = server.metrics.exposition()
    return PlainTextResponse(body, media_type=media_type)
