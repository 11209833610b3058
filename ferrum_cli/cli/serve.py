"""`ferrum serve`: its options in help panels, checked, and handed to uvicorn with the app."""

from __future__ import annotations

import ipaddress
import logging
import signal
import socket
from typing import Annotated

import typer

from ..errors import UsageError
from .console import call, fail
from .transcribe import (
    SPEED_PANEL,
    BatchSizeOption,
    Compute,
    ComputeOption,
    DeviceOption,
    Dtype,
    DtypeOption,
    ModelOption,
    PackShortOption,
    ThreadsOption,
    warn_past_cpus,
)

SERVER_PANEL = "Server"
# a WebSocket message past this closes the connection (1009); one past OpenAI's 15 MiB under it gets an error event
WS_MAX_MESSAGE_BYTES = 32 << 20
HEADER_SECONDS = 15.0  # for a request's headers to arrive
LIMITS_PANEL = "Limits"

EXAMPLES = """
[b]Examples[/b]

  ferrum serve
  ferrum serve --port 9000 --model tiny.en
  FERRUM_API_KEY=secret ferrum serve --host 0.0.0.0
  curl -s localhost:8000/v1/audio/transcriptions -F file=@talk.mp3 -F model=whisper-1
"""


def is_loopback(host: str) -> bool:
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_can_listen(host: str, port: int) -> None:
    """The address is bound and let go at once, as asyncio's server binds it: a port in use or a
    host that does not resolve is one line before the model loads (uvicorn logs it after)."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UsageError(f"--host {host}: {exc.strerror}") from None
    for family, kind, proto, _, address in found:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.", rich_help_panel=SERVER_PANEL)] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", min=0, max=65535, rich_help_panel=SERVER_PANEL)] = (
        8000
    ),
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="FERRUM_API_KEY", help="Clients must send 'Authorization: Bearer KEY'.", rich_help_panel=SERVER_PANEL
        ),
    ] = None,
    no_auth: Annotated[
        bool,
        typer.Option(
            "--no-auth", help="Listen beyond loopback without a key, on purpose.", rich_help_panel=SERVER_PANEL
        ),
    ] = False,
    grace: Annotated[
        float, typer.Option(help="Seconds to finish requests on SIGTERM/Ctrl-C.", min=0, rich_help_panel=SERVER_PANEL)
    ] = 30.0,
    max_queue_seconds: Annotated[
        float, typer.Option(help="Audio seconds queued before 429.", min=1, rich_help_panel=LIMITS_PANEL)
    ] = 3600.0,
    max_upload_mb: Annotated[
        float, typer.Option(help="Largest upload, in MB, before 413.", min=0.001, rich_help_panel=LIMITS_PANEL)
    ] = 25.0,
    max_connections: Annotated[
        int,
        typer.Option(
            help="Open connections; past it the slowest waiting one is dropped.", min=1, rich_help_panel=LIMITS_PANEL
        ),
    ] = 500,  # fmt: skip
    max_streams: Annotated[
        int,
        typer.Option(
            help="Live streams at once (/v1/realtime and /v1/audio/stream); past it a new one gets 429.",
            min=1,
            rich_help_panel=LIMITS_PANEL,
        ),
    ] = 32,  # fmt: skip
    request_timeout: Annotated[
        float,
        typer.Option(
            help=f"Seconds for a request to arrive whole (its headers: {HEADER_SECONDS:.0f} at most), else 408.",
            min=0.1,
            rich_help_panel=LIMITS_PANEL,
        ),
    ] = 300.0,  # fmt: skip
    model: ModelOption = "base",
    device: DeviceOption = "auto",
    dtype: DtypeOption = Dtype.auto,
    batch_size: BatchSizeOption = 12,
    compute: ComputeOption = Compute.auto,
    threads: ThreadsOption = None,
    pack_short: PackShortOption = True,
    share_batches: Annotated[
        bool, typer.Option(help="Windows of concurrent requests share batches.", rich_help_panel=SPEED_PANEL)
    ] = True,
) -> None:
    """Serve OpenAI's audio API (/v1/audio/transcriptions, /v1/audio/translations) over HTTP."""
    from ..executor import check_compute, check_model
    from ..options import TranscribeOptions
    from ..server.app import ServerSettings, create_app

    if not is_loopback(host) and not api_key and not no_auth:
        fail(UsageError(f"--host {host} reaches beyond this machine: set --api-key (or FERRUM_API_KEY), or --no-auth"))
    call(check_compute, compute.value)
    call(check_model, model)
    call(check_can_listen, host, port)
    warn_past_cpus(threads)
    try:
        import uvicorn
    except ImportError:
        fail(UsageError("ferrum serve needs its extra: pip install 'ferrum-cli[serve]'"))
    options = TranscribeOptions(batch_size=batch_size, compute=compute.value, pack_short=pack_short)
    settings = ServerSettings(
        model=model, device=device, dtype=dtype.value, threads=threads, api_key=api_key or None,
        max_queue_seconds=max_queue_seconds, max_upload_mb=max_upload_mb, share_batches=share_batches, options=options,
        max_streams=max_streams,
    )  # fmt: skip
    fatal = []

    def on_fatal(exc) -> None:
        fatal.append(exc)
        server.should_exit = True

    from ..server.guard import BACKLOG, connection_limit, guarded_protocol

    _log_like_uvicorn()
    connections = connection_limit(max_connections)
    if connections < max_connections:
        logging.getLogger("ferrum.server").warning(
            "at most %d connections: the process may open few files", connections
        )
    protocol = guarded_protocol(connections, min(HEADER_SECONDS, request_timeout), request_timeout)
    config = uvicorn.Config(
        create_app(settings, on_fatal), host=host, port=port, log_level="info", timeout_graceful_shutdown=grace,
        lifespan="on", server_header=False, http=protocol, backlog=BACKLOG,
        ws_max_size=WS_MAX_MESSAGE_BYTES,
    )  # fmt: skip
    server = uvicorn.Server(config)
    for sig in (signal.SIGINT, signal.SIGTERM):  # uvicorn re-raises the signal it shut down on, to these
        signal.signal(sig, lambda *_: None)  # a shutdown asked for is a success: exit 0
    server.run()
    if fatal:
        raise typer.Exit(fatal[0].exit_code)
    if not server.started:  # uvicorn said why (a port in use)
        raise typer.Exit(1)


def _log_like_uvicorn() -> None:
    """The server's own lines in uvicorn's format, on stderr; tracebacks only at DEBUG. No logger
    repeats one message more than a few times in 10 s."""
    from uvicorn.logging import DefaultFormatter

    from ..server.guard import OneLineLog, RateLimitedLog

    for name in ("asyncio", "uvicorn.error", "ferrum.server", "ferrum.engine"):  # not the access log: a line a request
        logging.getLogger(name).addFilter(OneLineLog())
        logging.getLogger(name).addFilter(RateLimitedLog())
    logging.getLogger("python_multipart").setLevel(logging.ERROR)  # a line per malformed body, each answered 400

    handler = logging.StreamHandler()
    handler.setFormatter(DefaultFormatter("%(levelprefix)s %(message)s"))
    for name in ("ferrum.server", "ferrum.engine"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(logging.INFO)
        logger.propagate = False
