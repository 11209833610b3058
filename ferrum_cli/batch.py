"""A batch: many inputs, one model load, outputs written atomically, failures reported and passed."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
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
    data = sys.stdin.buffer.read()
    if not data:
        raise InputError("empty input on stdin")
    return data


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
    """Transcribe every job that needs it through one executor; windows of several files share batches."""
    input_paths = {os.path.realpath(j.source) for j in jobs if not j.is_stdin}
    todo: list[tuple[Job, dict[str, Path]]] = []
    for job in jobs:
        try:
            paths = outputs_for(job, output_dir, formats) if output_dir else {}
        except OutputError as exc:
            _fail(job, exc.message, events, summary)
            continue
        if skip_existing and paths and is_complete(paths):
            summary.skipped += 1
            if events.on_skip:
                events.on_skip(job)
            continue
        clash = [p for p in paths.values() if os.path.realpath(p) in input_paths]
        if clash:
            _fail(job, f"output {clash[0]} would overwrite an input", events, summary)
            continue
        todo.append((job, paths))

    outputs = dict(todo)
    while todo:
        finished = 0
        items = [(job, _read_stdin if job.is_stdin else job.source) for job, _ in todo]
        try:
            for job, result in executor.transcribe_many(
                items,
                options,
                on_segment=(lambda job, seg: events.on_segment(job, seg, "")) if events.on_segment else None,
                on_progress=events.on_progress,
            ):
                finished += 1
                if isinstance(result, FerrumError):
                    _fail(job, result.message, events, summary)
                    continue
                for warning in result.warnings:
                    if events.on_warning:
                        events.on_warning(job, warning)
                try:
                    for fmt, path in outputs[job].items():
                        write_atomic(path, render(result, fmt, layout))
                except FerrumError as exc:
                    _fail(job, exc.message, events, summary)
                    continue
                summary.done += 1
                summary.audio_seconds += result.duration
                if events.on_result:
                    events.on_result(job, result)
            todo = []
        except Exception as exc:  # a bug must not sink the rest of a long batch
            if debug:
                raise
            _fail(todo[finished][0], f"internal error: {type(exc).__name__}: {exc}".splitlines()[0], events, summary)
            todo = todo[finished + 1 :]
    return summary


def _fail(job: Job, reason: str, events: BatchEvents, summary: BatchSummary) -> None:
    summary.failed += 1
    if events.on_failure:
        events.on_failure(job, reason)
