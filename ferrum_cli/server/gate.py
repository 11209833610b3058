"""What every request passes before any of it is read: the API key, and the upload limit."""

from __future__ import annotations

import json
import secrets

from starlette.exceptions import HTTPException

OPEN_PATHS = ("/health",)  # a load balancer's probe carries no key
DRAIN_BYTES = 64 << 20  # read on past the limit, so that the client sees the 413 and not a reset


def error_bytes(message: str, type_: str, code: str | None, param: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}}).encode()


class Gate:
    """A pure ASGI middleware: a request without the key gets 401 before its body is read, and a
    body over the limit stops being parsed at the limit (413)."""

    def __init__(self, app, api_key: str | None, max_upload_bytes: int, on_response=None) -> None:
        self.app, self.api_key, self.max_upload_bytes = app, api_key, max_upload_bytes
        self.on_response = on_response  # (path, status) of every answer: the metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "websocket":
            if self._refused(scope):
                await self._refuse_websocket(scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.on_response:
            send = self._counted(scope.get("path", ""), send)
        if self._refused(scope):
            await self._drain(receive)
            await respond(send, 401, self._refusal(scope), [(b"www-authenticate", b"Bearer")])
            return
        await self.app(scope, self._limited(receive), send)

    def _refused(self, scope) -> bool:
        headers = dict(scope.get("headers") or [])
        return bool(self.api_key) and scope.get("path") not in OPEN_PATHS and not self._authorized(headers)

    def _refusal(self, scope) -> bytes:
        given = b"authorization" in dict(scope.get("headers") or [])
        message = "Incorrect API key provided." if given else "You didn't provide an API key."
        return error_bytes(message + " Send it as 'Authorization: Bearer KEY'.", "invalid_request_error",
                           "invalid_api_key")  # fmt: skip

    async def _refuse_websocket(self, scope, receive, send) -> None:
        """A 401 in place of the handshake's 101, where the server can send one; else a close."""
        await receive()  # websocket.connect
        if "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008})
            return
        body = self._refusal(scope)
        await send({
            "type": "websocket.http.response.start", "status": 401,
            "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
        })  # fmt: skip
        await send({"type": "websocket.http.response.body", "body": body})

    def _counted(self, path: str, send):
        async def counted_send(message):
            if message["type"] == "http.response.start":
                self.on_response(path, message["status"])
            await send(message)

        return counted_send

    def _authorized(self, headers: dict) -> bool:
        value = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, key = value.partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(key.strip().encode(), self.api_key.encode())

    def _limited(self, receive):
        received = 0
        limit = self.max_upload_bytes

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    await self._drain(receive, message.get("more_body", False))
                    raise HTTPException(413, f"the upload is over this server's limit of {limit / 1e6:.0f} MB")
            return message

        return limited_receive

    @staticmethod
    async def _drain(receive, more: bool = True) -> None:
        drained = 0
        while more and drained < DRAIN_BYTES:
            message = await receive()
            if message["type"] != "http.request":
                return
            drained += len(message.get("body", b""))
            more = message.get("more_body", False)


async def respond(send, status: int, body: bytes, headers: list | None = None) -> None:
    await send({
        "type": "http.response.start", "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        + (headers or []),
    })  # fmt: skip
    await send({"type": "http.response.body", "body": body})
