"""A batch: many inputs, one model load, outputs written atomically, failures reported and passed."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..audio.ffmpeg import AudioStream, SpooledInput, stream_file
from ..errors import AudioDecodeError, FerrumError, OutputError, out_of_memory
from ..options import TranscribeOptions
from ..platform.files import name_max
from ..results import Segment, Transcription
from ..writers import SubtitleLayout, check_inside, output_paths, render, write_atomic
from .inputs import Job


@dataclass
class BatchSummary:
    done: int = 0
    skipped: int = 0
    failed: int = 0
    audio_seconds: float = 0.0
    started: float = field(default_factory=time.perf_counter)
    interrupted: bool = False

    @property
    def wall_seconds(self) -> float:
        return time.perf_counter() - self.started

    @property
    def speed(self) -> float:
        return self.audio_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0


@dataclass
class BatchEvents:
    """What the CLI renders; every callback is optional."""

    on_result: Callable[[Job, Transcription], None] | None = None
    on_failure: Callable[[Job, str], None] | None = None
    on_skip: Callable[[Job], None] | None = None
    on_warning: Callable[[Job, str], None] | None = None
    on_segment: Callable[[Job, Segment], None] | None = None
    on_progress: Callable[[Job, float], None] | None = None
    on_partial: Callable[[Job, Transcription], None] | None = None  # live: the text so far, after each segment
    on_step: Callable[[Job, str], None] | None = None  # a slow step after the engine begins (diarization)


@dataclass(frozen=True)
class BatchPlan:
    """What a batch is asked to do."""

    jobs: list[Job]
    options: TranscribeOptions
    formats: list[str]  # of the writers, in the order given
    output_dir: Path | None = None  # None: results go to the caller's on_result
    layout: SubtitleLayout = SubtitleLayout()  # how srt and vtt cues are cut into lines
    skip_existing: bool = False  # inputs whose outputs all exist are skipped
    live: bool = False  # stdin, URLs and devices are read as they come, each stretch decoded when it ends


def outputs_for(job: Job, output_dir: Path, formats: list[str]) -> dict[str, Path]:
    paths = output_paths(output_dir, job.relative, formats)
    longest = name_max(output_dir)
    for path in paths.values():
        check_inside(output_dir, path)
        if len(os.fsencode(path.name)) > longest:  # said before the work, not after
            raise OutputError(f"cannot write {path}: a file name here has at most {longest} bytes")
    return paths


def is_complete(paths: dict[str, Path]) -> bool:
    """Outputs are renamed into place whole, so existing means complete."""
    return all(p.is_file() for p in paths.values())


@contextmanager
def start_decoding(plan: BatchPlan) -> Iterator[dict[Job, AudioStream]]:
    """ffmpeg for the first batch of inputs, started before the model loads: short inputs are
    decoded on the core that loading leaves idle. An input that cannot be
    opened is left to run_batch, which reports it in its turn; one left unread is stopped."""
    started: dict[Job, AudioStream] = {}
    try:
        for job in plan.jobs[: plan.options.batch_size]:
            try:
                if (
                    job.is_stdin
                    or (plan.live and job.is_stream)
                    or (
                        plan.skip_existing
                        and plan.output_dir
                        and is_complete(outputs_for(job, plan.output_dir, plan.formats))
                    )
                ):
                    continue
                started[job] = stream_file(job.source, audio_stream=plan.options.audio_stream).start()
            except (FerrumError, OSError):
                continue
        yield started
    finally:
        for stream in started.values():
            stream.close()


def run_batch(
    executor,
    plan: BatchPlan,
    events: BatchEvents,
    summary: BatchSummary,
    debug: bool = False,
    started: dict[Job, AudioStream] | None = None,
) -> BatchSummary:
    """Transcribe every job that needs it through one executor; windows of several files share batches.

    started: from start_decoding, each read in its job's turn."""
    started = started or {}
    outputs = dict(jobs_to_run(plan, events, summary))
    todo = list(outputs)

    def partial(job: Job, result: Transcription) -> None:
        """A live input's outputs, rewritten whole after each segment: an interruption loses at
        most the segment being decoded."""
        try:
            _write_outputs(result, outputs[job], plan)
        except FerrumError:
            pass  # reported once, when the input ends
        if events.on_partial:
            events.on_partial(job, result)

    while todo:
        finished = 0
        items = [(job, _audio_of(job, plan, started)) for job in todo]
        try:
            for job, result in executor.transcribe_many(
                items, plan.options, on_segment=events.on_segment, on_progress=events.on_progress,
                on_partial=partial, on_step=events.on_step,
            ):  # fmt: skip
                finish_job(job, result, outputs[job], plan, events, summary)
                finished += 1
            todo = []
        except BrokenPipeError:
            raise  # stdout's reader went away (| head): the CLI ends at once, quietly
        except Exception as exc:  # a bug must not sink the rest of a long batch
            if debug:
                raise
            # a FerrumError here comes from a caller's event: a segment stdout could not take
            exc = out_of_memory(exc) or exc
            reason = exc.message if isinstance(exc, FerrumError) else f"internal error: {type(exc).__name__}: {exc}"
            fail_job(todo[finished], reason.splitlines()[0], events, summary)
            todo = todo[finished + 1 :]
    return summary


def _audio_of(job: Job, plan: BatchPlan, started: dict[Job, AudioStream]):
    """What the executor reads for a job: a live stream, stdin, a started decoder, or the path."""
    if plan.live and job.is_stream:
        source = "pipe:0" if job.is_stdin else job.source
        return AudioStream(source, live=True, input_format=job.capture_format, audio_stream=plan.options.audio_stream)
    if job.is_stdin:  # copied to a temporary file here, on the thread Ctrl-C reaches, then read as a file
        return SpooledInput(sys.stdin.buffer, plan.options.audio_stream).copied()
    return started.get(job, job.source)


def jobs_to_run(plan: BatchPlan, events: BatchEvents, summary: BatchSummary) -> Iterator[tuple[Job, dict[str, Path]]]:
    """(job, output paths) of each job to transcribe; the others are reported skipped or failed."""
    input_paths = {os.path.realpath(j.source) for j in plan.jobs if not j.is_stdin}
    for job in plan.jobs:
        try:
            paths = outputs_for(job, plan.output_dir, plan.formats) if plan.output_dir else {}
        except OutputError as exc:
            fail_job(job, exc.message, events, summary)
            continue
        if plan.skip_existing and paths and is_complete(paths):
            summary.skipped += 1
            if events.on_skip:
                events.on_skip(job)
            continue
        clash = [p for p in paths.values() if os.path.realpath(p) in input_paths]
        if clash:
            fail_job(job, f"output {clash[0]} would overwrite an input", events, summary)
            continue
        yield job, paths


def finish_job(
    job: Job, result, paths: dict[str, Path], plan: BatchPlan, events: BatchEvents, summary: BatchSummary
) -> None:
    """One job's result: its outputs written whole, or its error reported."""
    if isinstance(result, FerrumError):
        message = result.message
        if job.capture_format not in (None, "lavfi") and isinstance(result, AudioDecodeError):
            message += "; `ferrum status` lists the microphones ffmpeg sees here (capture_devices)"
        fail_job(job, message, events, summary)
        return
    result.name = result.name or job.relative.name  # rttm's file id
    for warning in result.warnings:
        if events.on_warning:
            events.on_warning(job, warning)
    try:
        _write_outputs(result, paths, plan)
    except FerrumError as exc:
        fail_job(job, exc.message, events, summary)
        return
    if events.on_result:
        try:
            events.on_result(job, result)  # the CLI writes stdout's results there
        except FerrumError as exc:
            fail_job(job, exc.message, events, summary)
            return
    summary.done += 1
    summary.audio_seconds += result.duration


def _write_outputs(result: Transcription, paths: dict[str, Path], plan: BatchPlan) -> None:
    with _signals_held():  # Ctrl-C, SIGTERM or SIGHUP waits for all of this input's outputs
        for fmt, path in paths.items():
            write_atomic(path, render(result, fmt, plan.layout))


# Ctrl-C, kill, and a terminal closed (an ssh session gone) under a batch that was not nohup'd
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


@contextmanager
def _signals_held() -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP back while one input's outputs are written: each output is
    renamed into place whole, and this keeps the set of them whole too (a .txt never without
    its .json), so --skip-existing can trust what it finds after an interruption.

    Handlers, not a signal mask: a masked signal would go to another thread (torch's, ffmpeg's
    readers), and Python would still run its handler here, in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be changed from the main thread
        return
    caught: list[int] = []
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in previous:
        signal.signal(sig, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if caught:  # now act on it as it would have been acted on
            handler = previous[caught[0]]
            if callable(handler):
                handler(caught[0], None)
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), caught[0])


def fail_job(job: Job, reason: str, events: BatchEvents, summary: BatchSummary) -> None:
    summary.failed += 1
    if events.on_failure:
        events.on_failure(job, reason)
