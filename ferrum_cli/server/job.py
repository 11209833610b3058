"""A request's or a stream's link to the engine: its callbacks, from the engine's thread to the event loop."""

from __future__ import annotations

import asyncio

from ..errors import FerrumError
from ..results import Segment, Transcription


class Job:
    """The engine thread's callbacks, handed over to the request's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.result: asyncio.Future = loop.create_future()

    def segment(self, segment: Segment, language: str) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, ("segment", (segment, language)))

    def done(self, result: Transcription | FerrumError) -> None:
        def settle():
            self.events.put_nowait(("done", result))
            if not self.result.done():
                self.result.set_result(result)

        self.loop.call_soon_threadsafe(settle)
