"""The `ferrum` command: parses options, calls the library, renders with rich. No model logic."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from . import __version__
from .errors import FerrumError, UsageError

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    rich_markup_mode="rich",
    help="Fast, careful Whisper speech-to-text. Files, folders, globs or a pipe in; txt, srt, vtt, json out.",
)
err = Console(stderr=True, highlight=False, soft_wrap=True)
_state = {"debug": False}


class Interrupted(BaseException):
    """SIGTERM, raised like KeyboardInterrupt so that no `except Exception` swallows it."""

    def __init__(self, code: int) -> None:
        self.code = code


def _on_signal(signum, frame) -> None:
    raise Interrupted(128 + signum)


def _fail(exc: FerrumError) -> None:
    err.print(f"[red]error:[/] {exc.message}", markup=True, highlight=False)
    raise typer.Exit(exc.exit_code)


def _run(func, *args, **kwargs):
    """Call into the library; a FerrumError becomes one line and its exit code."""
    try:
        return func(*args, **kwargs)
    except FerrumError as exc:
        if _state["debug"]:
            raise
        _fail(exc)
    except (KeyboardInterrupt, Interrupted, typer.Exit):
        raise
    except Exception as exc:  # a bug still ends in one line; --debug shows the traceback
        if _state["debug"]:
            raise
        _fail(FerrumError(f"internal error: {type(exc).__name__}: {exc}".splitlines()[0]))


class _WarningHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        err.print(f"[yellow]warning:[/] {record.getMessage()}")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ferrum {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
) -> None:
    _state["debug"] = debug
    log = logging.getLogger("ferrum")
    if not log.handlers:
        log.addHandler(_WarningHandler())
        log.setLevel(logging.INFO)


def _load_executor(model: str, device: str, dtype: str, threads: int | None):
    if threads:
        import torch

        torch.set_num_threads(threads)
    from .executor import WhisperModelExecutor

    return _run(WhisperModelExecutor.from_path, model, device, dtype)


def _temperatures(start: float, increment: float | None) -> tuple[float, ...]:
    if increment is None or increment <= 0:
        return (start,)
    steps = int(round((1.0 - start) / increment)) + 1
    return tuple(round(start + i * increment, 4) for i in range(max(steps, 1)))


TRANSCRIBE_EXAMPLES = """
[b]Examples[/b]

  ferrum transcribe talk.mp3
  ferrum transcribe talks/ -o out/ -f srt -f txt
  ferrum transcribe 'talks/**/*.m4a' -o out/ --skip-existing
  cat talk.mp3 | ferrum transcribe - -f srt -o out/
"""


@app.command(epilog=TRANSCRIBE_EXAMPLES)
def transcribe(
    inputs: Annotated[
        list[str] | None, typer.Argument(help="Files, folders, glob patterns, or - for stdin.", show_default=False)
    ] = None,
    model: Annotated[
        str, typer.Option("--model", "-m", help="Model name (tiny, base, small…), .pt file, or model folder.")
    ] = "base",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N or mps.")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto, float32, float16 or bfloat16.")] = "auto",
    language: Annotated[str, typer.Option("--language", "-l", help="Language code, or auto to detect it.")] = "auto",
    task: Annotated[str, typer.Option(help="transcribe, or translate to English.")] = "transcribe",
    output_format: Annotated[
        list[str], typer.Option("--output-format", "-f", help="txt, srt, vtt, json, tsv, jsonl or all; repeatable.")
    ] = ["txt"],  # noqa: B006
    output_dir: Annotated[
        Path | None, typer.Option("--output-dir", "-o", help="Write <stem>.<ext> files here instead of stdout.")
    ] = None,
    skip_existing: Annotated[bool, typer.Option(help="Skip inputs whose outputs all exist; resumes a batch.")] = False,
    stdin_name: Annotated[str, typer.Option(help="Output stem for audio read from stdin.")] = "stdin",
    beam_size: Annotated[int | None, typer.Option(help="Beam size; greedy when unset.", min=1)] = None,
    best_of: Annotated[int | None, typer.Option(help="Candidates when sampling with temperature > 0.", min=1)] = None,
    patience: Annotated[float | None, typer.Option(help="Beam search patience.")] = None,
    temperature: Annotated[float, typer.Option(help="Sampling temperature of the first try.", min=0.0, max=1.0)] = 0.0,
    temperature_increment_on_fallback: Annotated[
        float | None, typer.Option(help="Raise the temperature by this on each fallback.")
    ] = 0.2,
    compression_ratio_threshold: Annotated[
        float | None, typer.Option(help="Retry when the text's gzip ratio is above this.")
    ] = 2.4,
    logprob_threshold: Annotated[
        float | None, typer.Option(help="Retry when the mean log probability is below this.")
    ] = -1.0,
    no_speech_threshold: Annotated[
        float | None, typer.Option(help="Treat as silence above this no-speech probability.")
    ] = 0.6,
    initial_prompt: Annotated[str | None, typer.Option(help="Text to prime the first window with.")] = None,
    condition_on_previous_text: Annotated[
        bool, typer.Option(help="Feed each window's text to the next (sequential engine).")
    ] = True,
    word_timestamps: Annotated[bool, typer.Option(help="Time each word (sequential engine).")] = False,
    max_line_width: Annotated[
        int | None, typer.Option(help="srt/vtt: characters per line (needs --word-timestamps).", min=1)
    ] = None,
    max_line_count: Annotated[
        int | None, typer.Option(help="srt/vtt: lines per cue (needs --word-timestamps).", min=1)
    ] = None,
    max_words_per_line: Annotated[
        int | None, typer.Option(help="srt/vtt: words per line (needs --word-timestamps).", min=1)
    ] = None,
    highlight_words: Annotated[bool, typer.Option(help="srt/vtt: underline each word as it is spoken.")] = False,
    hotwords: Annotated[str | None, typer.Option(help="Words to bias the decoder towards (names, jargon).")] = None,
    multilingual: Annotated[
        bool, typer.Option(help="Detect the language of each stretch of speech, for files that switch.")
    ] = False,
    vad: Annotated[
        bool, typer.Option(help="Find speech with Silero VAD: skip silence, cut long audio at pauses.")
    ] = True,
    vad_threshold: Annotated[float, typer.Option(help="VAD: speech probability threshold.", min=0.0, max=1.0)] = 0.5,
    vad_min_speech_ms: Annotated[int, typer.Option(help="VAD: drop speech shorter than this.", min=0)] = 0,
    vad_max_speech_s: Annotated[float, typer.Option(help="VAD: split speech longer than this.", min=1.0)] = float(
        "inf"
    ),
    vad_min_silence_ms: Annotated[int, typer.Option(help="VAD: silence needed to end speech.", min=0)] = 2000,
    vad_speech_pad_ms: Annotated[int, typer.Option(help="VAD: padding kept on each side of speech.", min=0)] = 400,
    compute: Annotated[
        str,
        typer.Option(
            help="Encoder on CPU: auto (bfloat16 where measured faster, else float32), float32, bfloat16 or int8."
        ),
    ] = "auto",
    sequential: Annotated[
        bool, typer.Option(help="openai-whisper's exact sequential algorithm instead of the batched engine.")
    ] = False,
    batch_size: Annotated[int, typer.Option(help="30 s windows decoded together.", min=1, max=64)] = 12,
    threads: Annotated[int | None, typer.Option(help="CPU threads for torch.", min=1)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only results and errors.")] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Print segments on stderr as they are decoded.")
    ] = False,
) -> None:
    """Transcribe audio or video files, folders, glob patterns, or stdin."""
    from .cache import start_verifying
    from .devices import check_compute

    start_verifying(model)  # on another thread, while the model loads
    from .batch import BatchEvents, BatchSummary, is_complete, outputs_for, run_batch, start_decoding
    from .inputs import expand
    from .transcribe import TranscribeOptions, language_code
    from .vad import VadOptions
    from .writers import ensure_writable_dir, parse_formats, render, segment_json

    if task not in ("transcribe", "translate"):
        _fail(UsageError(f"unknown task {task!r}; choose transcribe or translate"))
    _run(check_compute, compute)
    formats = _run(parse_formats, output_format)
    if not inputs:
        if sys.stdin.isatty():
            _fail(UsageError("no input given; pass files, folders, patterns, or pipe audio on stdin"))
        inputs = ["-"]
    jobs = _run(expand, inputs, stdin_name)
    if output_dir is not None:
        _run(ensure_writable_dir, output_dir)
    options = TranscribeOptions(
        language=None,  # checked below, once ffmpeg runs: openai-whisper's language table imports torch
        task=task,
        beam_size=beam_size,
        best_of=best_of,
        patience=patience,
        temperature=_temperatures(temperature, temperature_increment_on_fallback),
        compression_ratio_threshold=compression_ratio_threshold,
        logprob_threshold=logprob_threshold,
        no_speech_threshold=no_speech_threshold,
        condition_on_previous_text=condition_on_previous_text,
        initial_prompt=initial_prompt,
        word_timestamps=word_timestamps,
        sequential=sequential,
        batch_size=batch_size,
        vad=vad,
        vad_options=VadOptions(
            threshold=vad_threshold,
            min_speech_duration_ms=vad_min_speech_ms,
            max_speech_duration_s=vad_max_speech_s,
            min_silence_duration_ms=vad_min_silence_ms,
            speech_pad_ms=vad_speech_pad_ms,
        ),
        multilingual=multilingual,
        hotwords=hotwords,
        compute=compute,
    )
    layout = {
        "max_line_width": max_line_width,
        "max_line_count": max_line_count,
        "max_words_per_line": max_words_per_line,
        "highlight_words": highlight_words,
    }
    signal.signal(signal.SIGTERM, _on_signal)
    summary = BatchSummary()
    if skip_existing and output_dir is not None and all(is_complete(outputs_for(j, output_dir, formats)) for j in jobs):
        _run(language_code, language)  # a bad option is an error even with nothing left to do
        summary.skipped = len(jobs)
        if not quiet:
            _print_summary(summary)
        return

    several = len(jobs) > 1
    stream_jsonl = output_dir is None and formats == ["jsonl"] and not several
    progress = None if quiet or not err.is_terminal else _make_progress(len(jobs))

    def on_result(job, result) -> None:
        if output_dir is None:
            if several:
                sys.stdout.write(f"==> {job.display} <==\n")
            for fmt in formats:
                if not stream_jsonl:
                    sys.stdout.write(render(result, fmt, layout))
            sys.stdout.flush()
        if no_speech := result.no_speech_warning():  # even with -q: the one line that warns of lost data
            err.print(f"[yellow]warning:[/] {job.display}: {no_speech}")
        if result.speech and not quiet and options.language is None:
            err.print(f"[dim]{job.display}: language {result.language} ({result.language_probability:.2f})[/]")
        if progress:
            progress.advance_file(result.duration)

    def on_segment(job, segment, _) -> None:
        if stream_jsonl:
            sys.stdout.write(segment_json(segment) + "\n")
            sys.stdout.flush()
        if verbose and not quiet:
            err.print(f"[dim][{segment.start:8.2f} → {segment.end:8.2f}][/] {segment.text.strip()}")

    def on_failure(job, reason: str) -> None:
        err.print(f"[red]error:[/] {job.display}: {reason}")
        if progress:
            progress.advance_file(0.0)

    def on_warning(job, message: str) -> None:
        if not quiet:
            err.print(f"[yellow]warning:[/] {job.display}: {message}")

    events = BatchEvents(
        on_result=on_result,
        on_failure=on_failure,
        on_warning=on_warning,
        on_segment=on_segment,
        on_skip=(lambda job: progress.advance_file(0.0)) if progress else None,
        on_progress=(lambda job, sec: progress.within_file(sec)) if progress else None,
    )
    try:
        with start_decoding(jobs, options, output_dir, formats, skip_existing) as started:
            options = replace(options, language=_run(language_code, language))
            executor = _load_executor(model, device, dtype, threads)
            _run(executor.check_options, options)
            if progress:
                progress.start()
            _run(
                run_batch,
                executor,
                jobs,
                options,
                formats,
                output_dir,
                layout,
                skip_existing,
                events,
                summary,
                _state["debug"],
                started,
            )
    except (KeyboardInterrupt, Interrupted) as exc:
        summary.interrupted = True
        code = exc.code if isinstance(exc, Interrupted) else 130
        if progress:
            progress.stop()
        err.print("[yellow]interrupted[/]: finished files keep their outputs; rerun with --skip-existing to resume")
        if not quiet:
            _print_summary(summary)
        raise typer.Exit(code) from None
    if progress:
        progress.stop()
    if not quiet:
        _print_summary(summary)
    if summary.failed:
        raise typer.Exit(1)


class _make_progress:
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
        self.task = self.progress.add_task("transcribing", total=total, audio=0.0, speed=0.0)
        self.done_audio, self.in_file, self.files = 0.0, 0.0, 0
        import time

        self.clock, self.t0 = time.perf_counter, time.perf_counter()

    def start(self) -> None:
        self.progress.start()

    def stop(self) -> None:
        self.progress.stop()

    def _update(self) -> None:
        audio = self.done_audio + self.in_file
        speed = audio / max(self.clock() - self.t0, 1e-9)
        self.progress.update(self.task, completed=self.files, audio=audio, speed=speed)

    def within_file(self, seconds: float) -> None:
        self.in_file = seconds
        self._update()

    def advance_file(self, seconds: float) -> None:
        self.files += 1
        self.done_audio += seconds
        self.in_file = 0.0
        self._update()


def _print_summary(summary) -> None:
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


def _print_mapping(title: str, data: dict, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
        return
    table = Table(title=title, show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    for key, value in data.items():
        if isinstance(value, (dict, list)):
            value = json.dumps(value, default=str)
            value = value if len(value) < 200 else value[:197] + "…"
        table.add_row(str(key), str(value))
    Console().print(table)


@app.command(epilog="[b]Examples[/b]\n\n  ferrum info\n  ferrum info --model tiny.en --json")
def info(
    model: Annotated[str, typer.Option("--model", "-m", help="Model name, file or folder.")] = "base",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Describe a model: format, source, checksum, size and dimensions. Loads no model onto a device."""
    from .executor import describe_model

    _print_mapping(f"model {model}", _run(describe_model, model), as_json)


@app.command(epilog="[b]Examples[/b]\n\n  ferrum status\n  ferrum status --json")
def status(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Report versions, ffmpeg, devices, the model cache, packs, and whether the default model is ready offline."""
    from .report import machine_status

    report = machine_status()
    _print_mapping("ferrum status", report, as_json)
    if report["problems"]:
        for problem in report["problems"]:
            err.print(f"[red]error:[/] {problem}")
        raise typer.Exit(1)


@app.command(epilog="[b]Examples[/b]\n\n  ferrum warmup\n  ferrum warmup --model tiny.en --device cpu --json")
def warmup(
    model: Annotated[str, typer.Option("--model", "-m", help="Model name, file or folder.")] = "base",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N or mps.")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto, float32, float16 or bfloat16.")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Resolve, convert and cache the model, load it, run one real forward pass; print each step's time."""
    from .executor import warmup_steps

    _print_mapping("ferrum warmup", _run(warmup_steps, model, device, dtype), as_json)


def main() -> None:
    """The console script. Once the output is flushed it ends the process at once: the
    interpreter's own teardown (torch's, mostly) takes 0.45-0.6 s here, a fifth of the
    whole run on a short clip, and nothing is left for it to do."""
    try:
        app()
        code = 0
    except SystemExit as exc:
        code = exc.code
    except BrokenPipeError:
        code = _quiet_broken_pipe()
    if code is not None and not isinstance(code, int):  # sys.exit("message"): as Python ends it
        print(code, file=sys.stderr)
        code = 1
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        code = _quiet_broken_pipe() if not code else code
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code or 0)


def _quiet_broken_pipe() -> int:
    """The reader of stdout went away (e.g. `| head`): stop quietly, with success."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 0
