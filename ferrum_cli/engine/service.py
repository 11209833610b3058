"""One long-lived engine on its own thread, which callers on other threads feed: the server's
requests, the cluster's workers' files, and the CLI's batch (through the executor). Each batch
takes windows from every input that has some ready.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import numpy as np

from ..audio.ffmpeg import stop_decoders
from ..errors import FerrumError, ServiceError, out_of_memory
from ..options import TranscribeOptions
from ..post import PostProcess
from ..results import Segment, Transcription
from .batched import BatchedEngine
from .decoding import PROCESS_ENDING, resume_decoding_on, stop_decoding_on
from .interface import Engine, EngineEvents, SourceRequest
from .sequential import SequentialEngine

log = logging.getLogger("ferrum.engine")
EXIT_GRACE_SECONDS = 10.0  # how long a process that ends waits for an engine to finish its step
LISTING_PAUSE = 1.0  # seconds a caller may take to list its next input before short inputs go on without it
_services: weakref.WeakSet[EngineService] = weakref.WeakSet()  # stopped at exit, see _stop_at_exit


@dataclass(eq=False)
class Ticket:
    """One submitted input: its callbacks, called on the engine's thread."""

    open_audio: Callable[[], Iterable[np.ndarray]]
    options: TranscribeOptions
    on_segment: Callable[[Segment, str], None] | None  # each segment and its language, in time order, once final
    on_done: Callable[[Transcription | FerrumError], None]  # once, last
    live: bool = False  # audio arriving in real time: each stretch decoded as soon as it ends
    on_progress: Callable[[float], None] | None = None  # seconds of the input decoded so far
    on_partial: Callable[[Transcription], None] | None = None  # live: the transcription so far, after new segments
    on_step: Callable[[str], None] | None = None  # a step of the stage after the engine begins: its name
    finished: bool = field(default=False, init=False)
    post: PostProcess | None = field(default=None, init=False)  # the stage after the engine, set when taken

    def finish(self, result: Transcription | FerrumError, stage_on_this_thread: bool = False) -> None:
        """Hand the result on once. A stage with steps to run (diarization) runs on a thread of
        its own, so that the engine goes on with the other inputs meanwhile, unless asked to run
        here."""
        if self.finished:
            return
        self.finished = True
        post = self.post
        if post is None or post.idle or isinstance(result, FerrumError):
            if post is not None:
                post.close()
            self._hand_on(result)
            return
        if stage_on_this_thread:
            self._post_process(post, result)
            return
        threading.Thread(target=self._post_process, args=(post, result), name="ferrum-post", daemon=True).start()

    def _post_process(self, post: PostProcess, result: Transcription) -> None:
        told = post.told  # a live stream's segments handed on as they were labelled
        try:
            result = post.apply(result, on_step=lambda name: self.tell(self.on_step, name))
        except FerrumError as exc:
            self._hand_on(exc)
            return
        except Exception as exc:  # a fault of a step fails this input alone
            log.error("post-processing failed: %s: %s", type(exc).__name__, exc)
            self._hand_on(out_of_memory(exc) or ServiceError(f"post-processing failed: {type(exc).__name__}"))
            return
        for segment in result.segments[told:]:
            self.tell(self.on_segment, segment, result.language)
        self._hand_on(result)

    def _hand_on(self, result: Transcription | FerrumError) -> None:
        self.tell(self.on_done, result)

    @staticmethod
    def tell(callback, *args) -> None:
        """Call one of the ticket's callbacks, if given; a fault in it is logged and goes no further."""
        if callback is None:
            return
        try:
            callback(*args)
        except Exception as exc:  # the caller's fault: it must not stop the engine for the others
            log.error("a callback of an input failed: %s: %s", type(exc).__name__, exc)


def engine_key(options: TranscribeOptions) -> TranscribeOptions:
    """What must be equal for two inputs to share a batch: language and word times are per input;
    the task, prompt and temperatures shape every row of a batch."""
    return replace(options, language=None, word_timestamps=False, word_probabilities=True)


def start_engine(model, options: TranscribeOptions, events: EngineEvents, in_order: bool) -> Engine:
    """The one place an engine is chosen: openai-whisper's sequential loop where it is asked for,
    else the batched engine (greedy, best-of-n sampling and beam search alike)."""
    if options.runs_sequentially:
        return SequentialEngine(model, options, events)
    return BatchedEngine(model, options, events, in_order)


class EngineService:
    """A thread that owns the model and runs batches while any input is waiting.

    Inputs with the same engine_key share one engine (start_engine), and so its batches; the
    thread takes one batch from each busy engine in turn. share_batches=False decodes one input
    at a time, in the order they came: the server without cross-request batching, for
    comparison. in_order: each engine reads its inputs one after another (a batch of files,
    finished in turn) rather than all in turn (requests, none held back by a long one), and the
    stage after the engine runs on this thread: torch keeps one OpenMP pool a thread, and two
    alive on few cores slow both (docs/performance.md).

    An engine whose only inputs are live streams with no stretch ready is left `idle` until one
    of them has (LiveWindows calls back), so that waiting for a speaker costs no CPU; so is one
    whose short inputs wait, in order, for the caller's next ones (submit, end_of_inputs).

    A fault fails only what it touched: an input whose options cannot start an engine fails
    alone, a batch that raises fails that engine's inputs. A fault outside both (a bug in this
    loop) fails every input, refuses new ones, and calls on_fatal: the thread never dies silently.
    """

    def __init__(
        self, model, share_batches: bool = True, on_batch: Callable[[int, int], None] | None = None,
        on_result: Callable[[Transcription | FerrumError], None] | None = None, in_order: bool = False,
    ) -> None:  # fmt: skip
        self.model, self.share_batches, self.on_batch, self.on_result = model, share_batches, on_batch, on_result
        self.in_order = in_order
        self._events = EngineEvents(self._segment, self._progress, self._partial, self._live_ready)
        self._engines: dict[TranscribeOptions, Engine] = {}
        self._tickets: dict[TranscribeOptions, set[Ticket]] = {}
        self._submitted: list[Ticket] = []
        self._cancelled: list[Ticket] = []
        self._idle: set[TranscribeOptions] = set()  # engines that wait for a live stream's next stretch
        self._wakeups = 0  # live streams' callbacks and the end of inputs so far: a step that saw none may idle
        self._inputs_ended = False  # the caller submits no more (end_of_inputs)
        self._listing_since: float | None = None  # the caller is getting its next input (listing)
        self._listing_waited = False  # an engine waited for that listing until LISTING_PAUSE
        self._wake = threading.Condition()
        self._stopping = False
        self.failed: ServiceError | None = None  # set when the thread could not go on
        self.on_fatal: Callable[[ServiceError], None] | None = None  # then, once, on the engine's thread
        self.on_closed: Callable[[], None] | None = None  # after close() has stopped the thread
        self._abandoned = False  # the process ends, or the caller left: stop at the decoding's next token
        self._thread = threading.Thread(target=self._loop, name="ferrum-engine", daemon=True)
        self._thread.start()
        _services.add(self)

    def submit(self, ticket: Ticket) -> Ticket:
        with self._wake:
            if self.failed is not None:
                raise self.failed
            if self._stopping:
                raise ServiceError("the engine is shutting down")
            self._submitted.append(ticket)
            self._wake.notify()
        return ticket

    def end_of_inputs(self) -> None:
        """The caller submits no more inputs: in order, the short ones waiting for more to share
        their windows with go on as they are."""
        with self._wake:
            self._inputs_ended = True
            self._wakeups += 1
            self._idle.clear()
            self._wake.notify()

    def listing(self, busy: bool) -> None:
        """The caller is (True), or no longer (False), getting its next input from its own list. A
        list that takes LISTING_PAUSE for one (a folder being watched) lets short inputs waiting
        for their neighbours go on without them."""
        with self._wake:
            self._listing_since = time.monotonic() if busy else None
            self._listing_waited = False

    def _more_inputs_soon(self) -> bool:
        if self._inputs_ended:
            return False
        return self._listing_since is None or time.monotonic() - self._listing_since < LISTING_PAUSE

    def _listing_wait(self) -> float | None:
        """Seconds until the caller's listing has taken LISTING_PAUSE; None when no idle engine
        waits for that."""
        if self._listing_since is None or self._inputs_ended or self._listing_waited or not self._idle:
            return None
        return max(0.0, self._listing_since + LISTING_PAUSE - time.monotonic())

    def _live_ready(self) -> None:
        """A live stream has a stretch to decode, or has ended (on its planner's thread)."""
        with self._wake:
            self._wakeups += 1
            self._idle.clear()
            self._wake.notify()

    def cancel(self, ticket: Ticket) -> None:
        """Drop an input's windows (its client went away); on_done is not called."""
        with self._wake:
            ticket.finished = True
            self._cancelled.append(ticket)
            self._idle.clear()
            self._wake.notify()

    def close(self, timeout: float | None = None) -> bool:
        """Finish what was submitted, then stop the thread; whether it stopped within timeout."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout)
        if self._thread.is_alive():
            return False
        if self.on_closed:
            self.on_closed()
        return True

    def abandon(self, timeout: float) -> bool:
        """Drop whatever is still submitted: the decoding in hand stops at its next token, and the
        decoders the engine started stop, so that a read waiting on one ends too. For a process
        that ends, or a caller that leaves its own service early (Ctrl-C). Whether the thread
        stopped within timeout."""
        with self._wake:
            self._abandoned = True
            if self._thread.ident is not None:
                stop_decoding_on(self._thread.ident)
            self._wake.notify()
        stop_decoders({self._thread.ident})
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def thread_id(self) -> int | None:
        """The engine's thread (threading.get_ident's number)."""
        return self._thread.ident

    # -- the engine's thread -----------------------------------------------------------

    def _loop(self) -> None:
        try:
            self._run()
        except Exception as exc:
            log.error("the engine stopped: %s: %s", type(exc).__name__, exc)
            log.debug("engine stopped", exc_info=True)
            self._fail_all(out_of_memory(exc) or ServiceError(f"the engine stopped: {type(exc).__name__}"))
        finally:
            resume_decoding_on(threading.get_ident())  # a later thread may be given the same number

    def _fail_all(self, error: ServiceError) -> None:
        with self._wake:
            self.failed, self._stopping = error, True
            tickets = [*self._submitted, *(t for group in self._tickets.values() for t in group)]
            self._submitted.clear()
            self._tickets.clear()
            self._engines.clear()
        for ticket in tickets:
            ticket.finish(error)
        if self.on_fatal:
            self.on_fatal(error)

    def _run(self) -> None:
        turn = 0
        while True:
            with self._wake:
                while not (self._submitted or self._cancelled or self._runnable()):
                    if self._abandoned or (self._stopping and not self._busy()):
                        return
                    wait = self._listing_wait()
                    if wait == 0.0:  # the caller's list pauses: what waits on its next inputs goes on
                        self._listing_waited = True
                        self._idle.clear()
                        continue
                    self._wake.wait(wait)
                if self._abandoned:
                    return
                self._take_cancelled()
                self._take_submitted()
                more = self._more_inputs_soon()
                for engine in self._engines.values():
                    engine.expect_inputs(more)
                busy = self._runnable()
                events = self._wakeups
            if not busy:
                continue
            key = busy[turn % len(busy)]
            turn += 1
            if not self._step(key):
                with self._wake:
                    if self._wakeups == events and key in self._engines:
                        self._idle.add(key)

    # the engines' events: the key of each input is its ticket

    @staticmethod
    def _segment(ticket: Ticket, segment: Segment, language: str) -> None:
        """Straight to the ticket where no stage comes after the engine; else once the stage is done."""
        if ticket.post.idle:
            ticket.tell(ticket.on_segment, segment, language)

    @staticmethod
    def _progress(ticket: Ticket, seconds: float) -> None:
        ticket.tell(ticket.on_progress, seconds)

    @staticmethod
    def _partial(ticket: Ticket, transcription: Transcription) -> None:
        """A live stream so far; with speakers to label, its new segments are labelled first and
        handed on as segments here (the diarizer's work is the engine thread's while it runs)."""
        if ticket.post.live_speakers is not None:
            try:
                transcription, labelled = ticket.post.partial(transcription)
            except Exception as exc:  # e.g. the diarizer is not installed: the input fails when it ends
                log.error("labelling speakers failed: %s: %s", type(exc).__name__, exc)
                return
            for segment in labelled:
                ticket.tell(ticket.on_segment, segment, transcription.language)
        ticket.tell(ticket.on_partial, transcription)

    def _busy(self) -> bool:
        return any(engine.busy for engine in self._engines.values())

    def _runnable(self) -> list[TranscribeOptions]:
        return [key for key, engine in self._engines.items() if engine.busy and key not in self._idle]

    def _take_cancelled(self) -> None:
        for ticket in self._cancelled:
            if ticket.post is not None:  # on this thread: the engine may be reading into its spool
                ticket.post.close()
            if ticket in self._submitted:
                self._submitted.remove(ticket)
            for key, tickets in self._tickets.items():
                if ticket in tickets:
                    tickets.discard(ticket)
                    self._engines[key].cancel(ticket)
        self._cancelled.clear()

    def _take_submitted(self) -> None:
        while self._submitted:
            if not self.share_batches and self._busy():
                return  # one input at a time
            ticket = self._submitted.pop(0)
            try:
                ticket.post = PostProcess(ticket.options, str(self.model.device), ticket.live)
            except FerrumError as exc:  # e.g. a known speaker's sample that is not audio
                ticket.finish(exc)
                continue
            key = engine_key(ticket.post.engine_options)
            if key not in self._engines:
                try:
                    engine = start_engine(self.model, key, self._events, self.in_order)
                except Exception as exc:  # options no engine can run: this input fails alone
                    log.error("cannot start an engine: %s: %s", type(exc).__name__, exc)
                    error = exc if isinstance(exc, FerrumError) else ServiceError(f"cannot transcribe: {exc}")
                    ticket.finish(error)
                    continue
                self._engines[key] = engine
                self._tickets[key] = set()
            self._tickets[key].add(ticket)
            self._idle.discard(key)
            options = ticket.post.engine_options
            opener = ticket.post.tap(ticket.open_audio)
            request = SourceRequest(
                ticket,
                opener,
                options.language,
                options.word_timestamps,
                ticket.live,
                options.word_probabilities,
                speech_frames=ticket.post.reads_speech,
            )
            self._engines[key].submit(request)

    def _step(self, key: TranscribeOptions) -> bool:
        """One batch of an engine; False when it had nothing to do (its live streams wait for sound)."""
        engine = self._engines[key]
        try:
            finished = engine.step()
        except Exception as exc:  # a fault of the engine, not of one input: its inputs fail, the others go on
            if self._abandoned:  # abandoned (DecodingStopped, a decoder stopped): nothing to say
                return True
            log.error("engine failed: %s: %s", type(exc).__name__, exc)
            log.debug("engine failure", exc_info=True)
            with self._wake:
                tickets = self._tickets.pop(key)
                del self._engines[key]
            error = out_of_memory(exc) or ServiceError(f"transcription failed: {type(exc).__name__}")
            for ticket in tickets:
                ticket.finish(error)
            return True
        if self.on_batch and engine.last_batch:
            self.on_batch(engine.last_batch, key.batch_size)
        with self._wake:
            for ticket, _ in finished:
                self._tickets[key].discard(ticket)
        for ticket, result in finished:
            if self.on_result:
                self.on_result(result)
            ticket.finish(result, stage_on_this_thread=self.in_order)
        return bool(engine.last_batch or finished)


def _stop_at_exit() -> None:
    """A process that ends while an engine works (a caller's daemon thread inside transcribe)
    stops it first, at its decoding's next token: torch, torn down under a thread in one of its
    ops, aborted the process ("terminate called without an active exception", exit 134)."""
    PROCESS_ENDING.set()
    for service in list(_services):
        service.abandon(EXIT_GRACE_SECONDS)


# before the VAD's thread pool is shut down (concurrent.futures' own hook, registered earlier,
# runs after ours), which an engine in its batch may still wait on; atexit's hooks run too late
threading._register_atexit(_stop_at_exit)  # type: ignore[attr-defined]
