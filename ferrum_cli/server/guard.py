"""What uvicorn leaves to the application: a deadline for a request to arrive, a bound on open
connections, and a log that a flood cannot fill.

uvicorn's own limits start too late for a slow client: `limit_concurrency` answers 503 only once a
request's headers are in, and `timeout_keep_alive` runs only after a response. A client that sends
one header line every few seconds held its connection, and its file descriptor, for ever.
"""

from __future__ import annotations

import logging
import os
import resource
import time

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .gate import error_bytes

FDS_KEPT = 64  # descriptors kept for the engine (ffmpeg's pipes, uploads' temp files) and the log
BACKLOG = 32  # connections accepted in one go before any is looked at: uvicorn's 2048 overran the files


def connection_limit(wanted: int) -> int:
    """wanted, or fewer where the process may open too few files (the soft limit is raised to the
    hard one first): past the limit accept() fails, and the connections the guard would drop for
    room are never seen. Room is kept for those open now, the engine's and the accept bursts in flight."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > soft):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:  # not Linux
        open_now = 64
    return max(1, min(wanted, soft - open_now - FDS_KEPT - 4 * BACKLOG))


def guarded_protocol(max_connections: int, header_seconds: float, request_seconds: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the limits of `ferrum serve`, as the class uvicorn.Config takes."""
    return type(
        "GuardedH11Protocol",
        (GuardedH11Protocol,),
        {"max_connections": max_connections, "header_seconds": header_seconds, "request_seconds": request_seconds},
    )


class GuardedH11Protocol(H11Protocol):
    """A request's headers must arrive within header_seconds of the connection (or of the last
    response, on a kept-alive one), and the whole request within request_seconds; else 408 and
    the connection is closed.

    At max_connections, a new connection takes the place of the oldest one still waiting for its
    headers, the one most likely a slow client; where every connection is a request in progress,
    the new one gets 503 at once. So a flood of slow clients cannot keep /health from answering.
    """

    max_connections: int  # these three are set by guarded_protocol, from `ferrum serve`'s options
    header_seconds: float
    request_seconds: float

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.waiting_since = time.monotonic()
        self.deadline = None
        if len(self.connections) > self.max_connections:
            oldest = min(
                (c for c in self.connections if c is not self and isinstance(c, GuardedH11Protocol) and c.waiting),
                key=lambda c: c.waiting_since,
                default=None,
            )
            if oldest is None:
                self._answer(503, "too many connections to this server; retry shortly", "too_many_connections")
                return
            oldest._answer(408, "the request did not arrive in time", "timeout")
        self._arm(self.header_seconds)

    @property
    def waiting(self) -> bool:
        """No request has begun on this connection since it opened or since its last response."""
        return self.cycle is None or self.cycle.response_complete

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle and self.cycle is not None:  # a request's headers are in
            self._arm(self.request_seconds - (time.monotonic() - self.waiting_since))
        if self.cycle is not None and self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED):
            self._disarm()  # the request is whole: the rest is the server's time

    def handle_websocket_upgrade(self, event) -> None:
        self._disarm()  # the socket is the WebSocket's from here: its own pings and limits apply
        super().handle_websocket_upgrade(event)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():  # kept alive: the next request has the same deadlines
            self.waiting_since = time.monotonic()
            self._arm(self.header_seconds)

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self.deadline = self.loop.call_later(max(seconds, 0.0), self._expired)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _expired(self) -> None:
        self.deadline = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and self.cycle.response_started:
            self.transport.close()  # an answer is under way: it can only be cut
        else:
            self._answer(408, "the request did not arrive in time", "timeout")

    def _answer(self, status: int, message: str, code: str) -> None:
        """A whole response written straight to the socket, then the close: no ASGI cycle is started."""
        self._disarm()
        if self.cycle is not None:
            self.cycle.disconnected = True  # the app, if it was reading the body, sees the client gone
        body = error_bytes(message, "invalid_request_error", code)
        reason = {408: b"Request Timeout", 503: b"Service Unavailable"}[status]
        head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n"
        extra = b"retry-after: 1\r\n" if status == 503 else b""
        self.transport.write(head % (status, reason, len(body)) + extra + b"\r\n" + body)
        self.transport.close()


class RateLimitedLog(logging.Filter):
    """At most `burst` records of one message template per `window` seconds; the next one let
    through says how many were dropped. A flood of refused connections once wrote 660 MB in 80 s."""

    def __init__(self, burst: int = 20, window: float = 10.0) -> None:
        super().__init__()
        self.burst, self.window = burst, window
        self._seen: dict[str, tuple[float, int, int]] = {}  # template -> (window start, let through, dropped)

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        key = str(record.msg)
        start, passed, dropped = self._seen.get(key, (now, 0, 0))
        if now - start >= self.window:
            start, passed = now, 0
        if passed >= self.burst:
            self._seen[key] = (start, passed, dropped + 1)
            return False
        if dropped:
            record.msg = f"{record.msg} ({dropped} more like it in the last {self.window:.0f} s were not logged)"
        self._seen[key] = (start, passed + 1, 0)
        return True


class OneLineLog(logging.Filter):
    """A record of asyncio's or uvicorn's as one line, its exception folded into it: the loop's
    "socket.accept() out of system resource" came with a traceback when files ran out under load.
    With DEBUG logging the traceback stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and not logging.getLogger().isEnabledFor(logging.DEBUG):
            exc = record.exc_info[1]
            first = record.getMessage().splitlines()[0] if record.getMessage() else ""
            record.msg, record.args = f"{first}: {type(exc).__name__}: {exc}" if exc else first, None
            record.exc_info, record.exc_text = None, None
        return True
