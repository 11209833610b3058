"""A batch: many inputs, one model load, outputs written atomically, failures reported and passed."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from .errors import FerrumError, InputError, OutputError
from .inputs import Job
from .transcribe import Segment, TranscribeOptions, Transcription
from .writers import check_inside, output_paths, render, write_atomic


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

    on_start: Callable[[Job], None] | None = None
    on_result: Callable[[Job, Transcription], None] | None = None
    on_failure: Callable[[Job, str], None] | None = None
    on_skip: Callable[[Job], None] | None = None
    on_warning: Callable[[Job, str], None] | None = None
    on_segment: Callable[[Job, Segment, str], None] | None = None
    on_progress: Callable[[Job, float], None] | None = None


def outputs_for(job: Job, output_dir: Path, formats: list[str]) -> dict[str, Path]:
    paths = output_paths(output_dir, job.relative, formats)
    for path in paths.values():
        check_inside(output_dir, path)
    return paths


def is_complete(paths: dict[str, Path]) -> bool:
    """Outputs are renamed into place whole, so existing means complete."""
    return all(p.is_file() for p in paths.values())


def _read_stdin() -> bytes:
    return sys.stdin.buffer.read()


class _Prefetcher:
    """Reads the next stdin/bytes input while the model works; files stream on their own."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1)

    def stdin(self) -> Future:
        return self.pool.submit(_read_stdin)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def run_batch(
    executor,
    jobs: list[Job],
    options: TranscribeOptions,
    formats: list[str],
    output_dir: Path | None,
    layout: dict,
    skip_existing: bool,
    events: BatchEvents,
    summary: BatchSummary,
    debug: bool = False,
) -> BatchSummary:
    input_paths = {os.path.realpath(j.source) for j in jobs if not j.is_stdin}
    prefetch = _Prefetcher()
    stdin_data = prefetch.stdin() if any(j.is_stdin for j in jobs) else None
    lock = threading.Lock()
    try:
        for job in jobs:
            try:
                paths = outputs_for(job, output_dir, formats) if output_dir else {}
            except OutputError as exc:
                summary.failed += 1
                if events.on_failure:
                    events.on_failure(job, exc.message)
                continue
            if skip_existing and paths and is_complete(paths):
                summary.skipped += 1
                if events.on_skip:
                    events.on_skip(job)
                continue
            clash = [p for p in paths.values() if os.path.realpath(p) in input_paths]
            if clash:
                summary.failed += 1
                if events.on_failure:
                    events.on_failure(job, f"output {clash[0]} would overwrite an input")
                continue
            if events.on_start:
                events.on_start(job)
            try:
                source = stdin_data.result() if job.is_stdin and stdin_data else job.source
                if job.is_stdin and not source:
                    raise InputError("empty input on stdin")
                result = executor.transcribe(
                    source,
                    options,
                    on_segment=(lambda seg, j=job: events.on_segment(j, seg, "")) if events.on_segment else None,
                    on_progress=(lambda sec, j=job: events.on_progress(j, sec)) if events.on_progress else None,
                    on_warning=(lambda msg, j=job: events.on_warning(j, msg)) if events.on_warning else None,
                )
                for fmt, path in paths.items():
                    write_atomic(path, render(result, fmt, layout))
            except FerrumError as exc:
                summary.failed += 1
                if events.on_failure:
                    events.on_failure(job, exc.message)
                continue
            except Exception as exc:  # a bug must not sink the rest of a long batch
                if debug:
                    raise
                summary.failed += 1
                if events.on_failure:
                    events.on_failure(job, f"internal error: {type(exc).__name__}: {exc}".splitlines()[0])
                continue
            with lock:
                summary.done += 1
                summary.audio_seconds += result.duration
            if events.on_result:
                events.on_result(job, result)
    finally:
        prefetch.close()
    return summary
