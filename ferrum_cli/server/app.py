"""The FastAPI app: OpenAI's audio endpoints (routes.py), errors in OpenAI's shape, the Gate in
front, and one Server (state.py) whose engine all requests share."""

from __future__ import annotations

import inspect
import threading
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from .gate import Gate
from .openai_format import APIError
from .routes import audio, service
from .state import Server, ServerSettings

__all__ = ["ServerSettings", "create_app"]


def create_app(settings: ServerSettings, on_fatal=None) -> Gate:
    """The app behind its Gate; on_fatal(error) when the model cannot load or the engine cannot go on."""
    server = Server(settings, on_fatal)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        threading.Thread(target=server.load, name="ferrum-load", daemon=True).start()
        yield
        await run_in_threadpool(server.close)

    max_upload_bytes = int(settings.max_upload_mb * 1e6)
    app = FastAPI(
        title="ferrum", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan,
        **_text_fields_up_to(max_upload_bytes),
    )  # fmt: skip
    app.state.server = server
    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.include_router(audio)
    app.include_router(service)

    def counted(path: str, status: int) -> None:
        server.metrics.requests.labels(path, str(status)).inc()

    return Gate(app, settings.api_key, max_upload_bytes, counted)


def _text_fields_up_to(limit: int) -> dict:
    """A form's text fields up to the upload limit (the Gate bounds the whole body): a known
    speaker's data URL of a 10 s WAV at 48 kHz is 2.6 MB, past Starlette's 1 MB for a field.
    FastAPI takes the setting from 0.165; before it, the 1 MB stays."""
    if "form_limits" not in inspect.signature(FastAPI).parameters:
        return {}
    return {"form_limits": {"max_part_size": limit}}


async def api_error(request: Request, exc: APIError) -> JSONResponse:
    return exc.response()


async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    codes = {413: "too_large", 404: "not_found", 405: "method_not_allowed"}
    message = exc.detail if isinstance(exc.detail, str) else "bad request"
    if exc.status_code == 400 and message == "There was an error parsing the body":
        message = "the request body is not a valid multipart form"
    return APIError(exc.status_code, message, code=codes.get(exc.status_code)).response()


async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    param = str(first.get("loc", ["", ""])[-1]) or None
    message = f"invalid {param}: {first.get('msg', 'bad value')}" if param else "invalid request"
    return APIError(400, message, param=param).response()
