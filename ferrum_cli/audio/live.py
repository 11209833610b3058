"""Windows of speech from a live stream, each as soon as its stretch of speech ends.

The planner of files (windows.plan_windows) reads four minutes ahead to pack windows well; a
live stream cannot wait for that. Here the VAD runs on the audio as it arrives, and a stretch of
speech becomes a window once a pause of LIVE_SILENCE_MS follows MIN_STRETCH_SECONDS of it (or
one of LONG_PAUSE_MS any of it), or once it has run for MAX_STRETCH_SECONDS (cut at its quietest
point); the window opens on up to LEAD_SECONDS of the pause before. What has been handed on is
let go, so memory stays flat on an endless stream.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

import numpy as np

from ..options import VadOptions
from .constants import SAMPLE_RATE, VAD_FRAME, WINDOW_SAMPLES
from .level import raised_spans
from .vad import regions_from_probabilities, speech_probabilities_many
from .windows import quietest_cut

LIVE_SILENCE_MS = 600  # a pause this long ends a stretch of live speech of MIN_STRETCH_SECONDS or more
LONG_PAUSE_MS = 1000  # a pause this long ends any stretch: speakers seldom pause so long inside a sentence
MIN_STRETCH_SECONDS = 1.5  # shorter stretches wait for more: a word or two alone gives Whisper too little context
MAX_STRETCH_SECONDS = 28.0  # a stretch this long is cut, so that each window fits Whisper's 30 s
VAD_BLOCK_FRAMES = 6  # the VAD reads the stream in blocks of this many frames (0.19 s), each on its own
BLOCK_WARMUP_FRAMES = 32  # after the second before it: half a second left the VAD unsettled on short blocks
UPDATE_INTERVAL = 0.1  # the planner looks at new blocks at most this often (wall seconds)
LEAD_SECONDS = 2.0  # audio before a stretch's speech that its window opens with, where no earlier window has it
READY_WINDOWS = 24  # stretches planned and not yet taken, at most
CLOSED_POLL_SECONDS = 0.2
_END = object()


class _Closed(Exception):
    """The taker closed the windows while the planner waited to hand one on."""


class LiveWindows:
    """(offset seconds, samples) windows of a live stream, planned on a thread of their own.

    ready() says whether next() would return without waiting. Each window's unpadded speech
    regions go into `speech` (absolute samples) when it is taken, on the taker's thread.
    on_ready, if given, is called (on the planner's thread) when a window is queued or the
    stream ends.
    """

    def __init__(
        self, chunks: Iterable[np.ndarray], vad_options: VadOptions, speech: list[tuple[int, int]],
        on_ready: Callable[[], None] | None = None,
    ) -> None:  # fmt: skip
        self.options = replace(vad_options, min_silence_duration_ms=LIVE_SILENCE_MS)
        self.speech, self.on_ready = speech, on_ready
        self.pad = vad_options.speech_pad_ms * SAMPLE_RATE // 1000
        self.lead = max(int(LEAD_SECONDS * SAMPLE_RATE), self.pad)
        # bounded: audio fed faster than it is decoded waits in the pipe, not in memory
        self._queue: queue.Queue = queue.Queue(READY_WINDOWS)
        self._chunks = chunks
        self._closed = False
        self._thread = threading.Thread(target=self._plan, name="ferrum-live", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop planning (the input was cancelled): the planner stops at its next chunk or window."""
        self._closed = True
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return

    def ready(self) -> bool:
        return not self._queue.empty()

    def __iter__(self) -> LiveWindows:
        return self

    def __next__(self) -> tuple[float, np.ndarray]:
        item = self._queue.get()
        if item is _END:
            self._queue.put(_END)  # it stays ended
            raise StopIteration
        if isinstance(item, BaseException):
            self._queue.put(_END)
            raise item
        offset, samples, core = item
        self.speech.extend(core)
        return offset, samples

    # -- the planner's thread ----------------------------------------------------------

    def _plan(self) -> None:
        buffer = np.zeros(0, np.float32)
        probs = np.zeros(0, np.float32)  # one per whole VAD frame of buffer
        base = 0  # absolute sample of buffer[0]
        emitted_to = 0  # buffer index where the last window ended
        last_update = 0.0
        try:
            for chunk in self._chunks:
                if self._closed:
                    return
                buffer = np.concatenate([buffer, chunk])
                new = len(buffer) - len(probs) * VAD_FRAME
                if new < VAD_BLOCK_FRAMES * VAD_FRAME or time.monotonic() - last_update < UPDATE_INTERVAL:
                    continue
                last_update = time.monotonic()
                probs = self._extend(buffer, probs)
                cut, emitted_to = self._emit(buffer, probs, base, emitted_to, final=False)
                buffer, probs, base, emitted_to = buffer[cut:], probs[cut // VAD_FRAME :], base + cut, emitted_to - cut
            probs = self._extend(buffer, probs, final=True)
            self._emit(buffer, probs, base, emitted_to, final=True)
            tail = [_END]
        except _Closed:
            return
        except BaseException as exc:  # the stream broke off (ffmpeg's error): the taker raises it
            tail = [exc, _END]
        try:
            for item in tail:
                self._offer(item)
        except _Closed:
            return
        if self.on_ready:
            self.on_ready()

    def _offer(self, item) -> None:
        """Into the queue, waiting while it is full, unless the taker has closed it."""
        while not self._closed:
            try:
                self._queue.put(item, timeout=CLOSED_POLL_SECONDS)
                return
            except queue.Full:
                continue
        raise _Closed

    def _extend(self, buffer: np.ndarray, probs: np.ndarray, final: bool = False) -> np.ndarray:
        """The probabilities of the whole blocks after the frames already read (at the end, of
        what is left too).

        Each block of VAD_BLOCK_FRAMES is read warmed up on the second before it, all of them
        in one batch: a block's probabilities are the same whether the stream arrives at
        its pace or as fast as a pipe gives it, so its stretches and text are too. The buffer
        is only ever cut at a block's edge, so blocks keep one grid from the stream's start.
        """
        done = len(probs)
        frames = (len(buffer) + (VAD_FRAME - 1 if final else 0)) // VAD_FRAME
        if not final:
            frames = done + (frames - done) // VAD_BLOCK_FRAMES * VAD_BLOCK_FRAMES
        if frames <= done:
            return probs
        blocks = [(a, min(a + VAD_BLOCK_FRAMES, frames)) for a in range(done, frames, VAD_BLOCK_FRAMES)]
        starts = [max(0, a - BLOCK_WARMUP_FRAMES) for a, _ in blocks]
        pieces = [buffer[start * VAD_FRAME : b * VAD_FRAME] for start, (_, b) in zip(starts, blocks)]
        read = speech_probabilities_many(pieces, readers=1)
        fresh = [p[a - start : b - start] for p, start, (a, b) in zip(read, starts, blocks)]
        return np.concatenate([probs, *fresh])

    def _emit(self, buffer, probs, base: int, emitted_to: int, final: bool) -> tuple[int, int]:
        """Queue the stretches that have ended; returns (where the buffer may be cut, emitted_to)."""
        n = min(len(buffer), len(probs) * VAD_FRAME)
        core = [(max(a, emitted_to), b) for a, b in regions_from_probabilities(probs.tolist(), n, self.options)]
        core = [(a, b) for a, b in core if b > a]
        max_stretch = int(MAX_STRETCH_SECONDS * SAMPLE_RATE)
        for regions, closed in self._stretches(core, n, final):
            start, end = regions[0][0], regions[-1][1]
            if not closed and n - start < max_stretch:
                break  # still being spoken
            while end - start > max_stretch or (not closed and n - start >= max_stretch):
                cut = quietest_cut(buffer, start + max_stretch * 2 // 3, min(start + max_stretch, n))
                emitted_to = self._put(buffer, base, start, cut, emitted_to, clipped(regions, start, cut), False)
                start = cut
            if not closed:
                break
            emitted_to = self._put(buffer, base, start, end, emitted_to, clipped(regions, start, end))
        keep = self.lead
        open_starts = [s for s, e in core if e > emitted_to]
        cut = min([max(s - int(keep), emitted_to) for s in open_starts] + [max(n - int(keep), emitted_to)])
        cut -= cut % (VAD_FRAME * VAD_BLOCK_FRAMES)  # at a block's edge: see _extend
        return max(cut, 0), emitted_to

    @staticmethod
    def _stretches(core: list[tuple[int, int]], n: int, final: bool):
        """The speech regions grouped into stretches, each with whether it has ended: a pause of
        LIVE_SILENCE_MS ends a stretch of MIN_STRETCH_SECONDS or more, one of LONG_PAUSE_MS any."""
        short_pause, long_pause = LIVE_SILENCE_MS * SAMPLE_RATE // 1000, LONG_PAUSE_MS * SAMPLE_RATE // 1000
        min_stretch = int(MIN_STRETCH_SECONDS * SAMPLE_RATE)
        group: list[tuple[int, int]] = []
        for region in core:
            if group and (region[0] - group[-1][1] >= long_pause or group[-1][1] - group[0][0] >= min_stretch):
                yield group, True
                group = []
            group.append(region)
        if group:
            after = n - group[-1][1]
            long_enough = group[-1][1] - group[0][0] >= min_stretch
            yield group, final or after >= long_pause or (long_enough and after >= short_pause)

    def _put(
        self, buffer, base: int, start: int, end: int, emitted_to: int, core: list[tuple[int, int]], pad_end=True
    ) -> int:
        """Queue the window of speech [start, end), opening with up to LEAD_SECONDS of the audio
        before it and padded after (not after a cut inside speech: the next window starts there);
        returns where it ends. Whisper reads a window that opens where the speech does worse
        (as audio.windows.plan_whole notes), and a stretch of live speech is one window alone."""
        hi = min(end + (self.pad if pad_end else 0), len(buffer))
        lo = max(start - self.lead, emitted_to, hi - WINDOW_SAMPLES, 0)
        heard = np.array(raised_spans(buffer[lo:hi], [(0, hi - lo)]))  # a copy: the buffer is let go
        self._offer(((base + lo) / SAMPLE_RATE, heard, [(base + a, base + b) for a, b in core]))
        if self.on_ready:
            self.on_ready()
        return hi


def clipped(regions: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    return [(max(a, start), min(b, end)) for a, b in regions if b > start and a < end]
