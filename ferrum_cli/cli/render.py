"""What the commands show: results on stdout, progress, warnings and the summary on stderr."""

from __future__ import annotations

import time

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..writers import JSON_FORMATS, WRITERS, SubtitleLayout, named_json, render, segment_line, strict_json
from .console import err, write_stdout, writing_stdout

TRANSCRIBING = "transcribing"


class FileProgress:
    """Files done of total, audio seconds, x real time, ETA; moves within a long file too."""

    def __init__(self, total: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[audio]:.0f} s audio, {task.fields[speed]:.1f}x"),
            TimeRemainingColumn(),
            console=err,
            redirect_stdout=False,  # stdout carries results only, even with a bar on stderr
            redirect_stderr=False,
        )
        self.task = self.progress.add_task(TRANSCRIBING, total=total, audio=0.0, speed=0.0)
        self.done_audio, self.in_file, self.files = 0.0, 0.0, 0
        self.t0 = time.perf_counter()

    def start(self) -> None:
        self.progress.start()

    def stop(self) -> None:
        self.progress.stop()

    def _update(self) -> None:
        audio = self.done_audio + self.in_file
        speed = audio / max(time.perf_counter() - self.t0, 1e-9)
        self.progress.update(self.task, completed=self.files, audio=audio, speed=speed)

    def within_file(self, seconds: float) -> None:
        self.in_file = seconds
        self._update()

    def advance_file(self, seconds: float) -> None:
        self.files += 1
        self.done_audio += seconds
        self.in_file = 0.0
        self.progress.update(self.task, description=TRANSCRIBING)
        self._update()

    def step(self, name: str) -> None:
        """A slow step after the engine has begun ("telling speakers apart"): the bar says so
        until the file is done, rather than stand still at its last second."""
        self.progress.update(self.task, description=name)
        self.progress.refresh()


class TranscribeView:
    """The batch's events as the user sees them: results on stdout (or the files written), the
    rest on stderr. The no-speech warning shows even with -q: it is the one line that warns of lost data."""

    def __init__(
        self, formats: list[str], layout: SubtitleLayout, to_stdout: bool, several: bool, quiet: bool,
        verbose: bool, live: bool = False,
    ):  # fmt: skip
        self.formats, self.layout, self.to_stdout, self.several = formats, layout, to_stdout, several
        self.quiet, self.verbose = quiet, verbose
        # each segment as it is decoded, flushed: live, every format that streams; else jsonl alone
        streams = [f for f in formats if WRITERS[f].streams] if live else ["jsonl"] if formats == ["jsonl"] else []
        self.streamed = streams if to_stdout and not several else []
        # several inputs in json alone: each record names its input, where a "==>" line would break the JSON
        self.named = to_stdout and several and all(f in JSON_FORMATS for f in formats)
        self.report_language = True
        self.progress: FileProgress | None = None

    def show_progress(self, total: int) -> None:
        if not self.quiet and err.is_terminal:
            self.progress = FileProgress(total)

    def events(self):
        from ..batch.runner import BatchEvents

        progress = self.progress
        return BatchEvents(
            on_result=self.on_result,
            on_failure=self.on_failure,
            on_warning=self.on_warning,
            on_segment=self.on_segment,
            on_skip=(lambda job: progress.advance_file(0.0)) if progress else None,
            on_progress=(lambda job, sec: progress.within_file(sec)) if progress else None,
            on_step=(lambda job, name: progress.step(name)) if progress else None,
        )

    def on_result(self, job, result) -> None:
        if self.named:
            write_stdout(*(named_json(result, f, job.display) for f in self.formats))
        elif self.to_stdout:
            heading = [f"==> {job.display} <==\n"] if self.several else []
            write_stdout(*heading, *(render(result, f, self.layout) for f in self.formats if f not in self.streamed))
        if no_speech := result.no_speech_warning():
            err.print(f"[yellow]warning:[/] {escape(job.display)}: {escape(no_speech)}")
        if result.speech and not self.quiet and self.report_language:
            err.print(f"[dim]{escape(job.display)}: language {result.language} ({result.language_probability:.2f})[/]")
        if self.progress:
            self.progress.advance_file(result.duration)

    def on_segment(self, job, segment) -> None:
        if self.streamed:
            write_stdout(*(segment_line(segment, fmt) for fmt in self.streamed))
        if self.verbose and not self.quiet:
            err.print(f"[dim][{segment.start:8.2f} → {segment.end:8.2f}][/] {escape(segment.text.strip())}")

    def on_failure(self, job, reason: str) -> None:
        err.print(f"[red]error:[/] {escape(job.display)}: {escape(reason)}")
        if self.progress:
            self.progress.advance_file(0.0)

    def on_warning(self, job, message: str) -> None:
        """Shown with -q too: most say audio went unread (a truncated input, other audio streams)."""
        err.print(f"[yellow]warning:[/] {escape(job.display)}: {escape(message)}")

    def stop_progress(self) -> None:
        if self.progress:
            self.progress.stop()
            self.progress = None

    def finish(self, summary) -> None:
        self.stop_progress()
        if not self.quiet:
            print_summary(summary)


def print_summary(summary) -> None:
    table = Table(title="ferrum transcribe" + (" (interrupted)" if summary.interrupted else ""), show_header=True)
    for column in ("done", "skipped", "failed", "audio", "wall", "speed"):
        table.add_column(column, justify="right")
    table.add_row(
        str(summary.done),
        str(summary.skipped),
        str(summary.failed),
        f"{summary.audio_seconds / 3600:.3f} h",
        f"{summary.wall_seconds:.1f} s",
        f"{summary.speed:.1f}x real time",
    )
    err.print(table)


def print_mapping(title: str, data: dict, as_json: bool) -> None:
    if as_json:
        write_stdout(strict_json(data, indent=2, default=str) + "\n")
        return
    table = Table(title=title, show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value", overflow="fold")
    for key, value in data.items():
        if isinstance(value, dict) and not any(isinstance(v, (dict, list)) for v in value.values()):
            value = "\n".join(f"{k}: {v}" for k, v in value.items())  # a line each, never cut
        elif isinstance(value, (dict, list)):
            value = strict_json(value, default=str)
            value = value if len(value) < 200 else value[:197] + "…"
        table.add_row(escape(str(key)), escape(str(value)))
    with writing_stdout():
        Console(emoji=False).print(table)
