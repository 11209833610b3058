"""`ferrum transcribe`: its options in help panels, checked, and handed to the batch runner."""

from __future__ import annotations

import signal
import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..errors import UsageError
from ..options import MAX_BATCH_SIZE, temperatures
from ..writers import FORMATS
from .console import Interrupted, call, err, fail, on_signal, quiet_broken_pipe, state

if TYPE_CHECKING:
    from ..options import KnownSpeaker, TranscribeOptions

IO_PANEL = "Input and output"
MODEL_PANEL = "Model and device"
DECODING_PANEL = "Decoding"
FALLBACK_PANEL = "Fallback (as openai-whisper)"
SEQUENTIAL_PANEL = "Sequential engine (openai-whisper's loop)"
VAD_PANEL = "Voice activity detection"
SUBTITLE_PANEL = "Word times and subtitles"
SPEAKER_PANEL = "Speakers (who spoke when)"
SPEED_PANEL = "Performance"
CLUSTER_PANEL = "Cluster (Ray)"
FORMAT_CHOICES = (*FORMATS, "all")


class Task(str, Enum):
    transcribe = "transcribe"
    translate = "translate"


class Dtype(str, Enum):
    auto = "auto"
    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"


class Compute(str, Enum):
    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
    int8 = "int8"


def _complete_formats(incomplete: str) -> list[str]:
    return [f for f in FORMAT_CHOICES if f.startswith(incomplete)]


def _complete_devices(incomplete: str) -> list[str]:
    return [d for d in ("auto", "cpu", "cuda", "cuda:0", "mps") if d.startswith(incomplete)]


# options that `ferrum serve` takes too, defined once
ModelOption = Annotated[
    str,
    typer.Option(
        "--model", "-m", help="A name (base, tiny.en, ...), a .pt file or a folder.", rich_help_panel=MODEL_PANEL
    ),
]
DeviceOption = Annotated[
    str,
    typer.Option(help="auto, cpu, cuda, cuda:N or mps.", autocompletion=_complete_devices, rich_help_panel=MODEL_PANEL),
]
DtypeOption = Annotated[Dtype, typer.Option(help="Weights' dtype; auto: float32 on CPU.", rich_help_panel=MODEL_PANEL)]
BatchSizeOption = Annotated[
    int, typer.Option(help="Windows decoded together.", min=1, max=MAX_BATCH_SIZE, rich_help_panel=SPEED_PANEL)
]
ComputeOption = Annotated[
    Compute, typer.Option(help="CPU encoder; auto: the fastest here that keeps the words.", rich_help_panel=SPEED_PANEL)
]
ThreadsOption = Annotated[
    int | None,
    typer.Option(
        help="CPU threads for torch (default: every core). Processes run side by side: give each its share.",
        min=1, rich_help_panel=SPEED_PANEL,
    ),
]  # fmt: skip


def warn_past_cpus(threads: int | None) -> None:
    from ..status import threads_past_cpus

    if said := threads_past_cpus(threads):
        err.print(f"[yellow]warning:[/] {said}")


PackShortOption = Annotated[
    bool,
    typer.Option(
        help="Short inputs of one given language share 30 s windows: faster, though a text may differ "
        "from the same input alone in a word or its punctuation.",
        rich_help_panel=SPEED_PANEL,
    ),
]

EXAMPLES = """
[b]Examples[/b]

  ferrum transcribe talk.mp3
  ferrum transcribe talks/ -o out/ -f srt -f txt
  ferrum transcribe 'talks/**/*.m4a' -o out/ --skip-existing
  cat talk.mp3 | ferrum transcribe - -f srt -o out/
  arecord -f S16_LE -r 16000 | ferrum transcribe - --live
  ferrum transcribe https://example.org/talk.mp3 -o out/
  ferrum transcribe --mic default -f jsonl
  ferrum transcribe archive/ -o out/ --cluster auto --skip-existing
"""


def transcribe(
    inputs: Annotated[
        list[str] | None,
        typer.Argument(help="Files, folders, glob patterns, or - for stdin.", show_default=False),
    ] = None,
    output_format: Annotated[
        list[str],
        typer.Option(
            "--output-format",
            "-f",
            help="txt, srt, vtt, json, tsv, jsonl or all; repeatable.",
            autocompletion=_complete_formats,
            rich_help_panel=IO_PANEL,
        ),
    ] = ["txt"],  # noqa: B006
    output_dir: Annotated[
        str | None,
        typer.Option(
            "--output-dir",
            "-o",
            help="Write <stem>.<ext> files here, not to stdout ('-': stdout).",
            rich_help_panel=IO_PANEL,
        ),
    ] = None,
    skip_existing: Annotated[
        bool,
        typer.Option(
            "--skip-existing",
            show_default=False,
            help="Skip inputs whose outputs all exist: resumes a batch.",
            rich_help_panel=IO_PANEL,
        ),
    ] = False,
    stdin_name: Annotated[
        str,
        typer.Option(
            help="The name of what stdin holds, for its output files (talk or talk.mp3: talk.srt).",
            rich_help_panel=IO_PANEL,
        ),
    ] = "stdin",
    audio_stream: Annotated[
        int | None,
        typer.Option(
            metavar="N",
            help="Read each input's Nth audio stream, from 0; default: ffmpeg's pick.",
            min=0,
            rich_help_panel=IO_PANEL,
            show_default=False,
        ),
    ] = None,
    live: Annotated[
        bool,
        typer.Option(
            "--live",
            show_default=False,
            help="stdin, a pipe or a URL as it arrives: each line when its speech ends.",
            rich_help_panel=IO_PANEL,
        ),
    ] = False,
    mic: Annotated[
        str | None,
        typer.Option(
            metavar="DEVICE",
            help="Live from a microphone: default, or FORMAT:NAME (alsa:hw:1).",
            rich_help_panel=IO_PANEL,
            show_default=False,
        ),
    ] = None,
    quiet: Annotated[
        bool,
        typer.Option("--quiet", "-q", help="Only results, errors and warnings.", rich_help_panel=IO_PANEL),
    ] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Segments on stderr as they are decoded.", rich_help_panel=IO_PANEL)
    ] = False,
    model: ModelOption = "base",
    device: DeviceOption = "auto",
    dtype: DtypeOption = Dtype.auto,
    language: Annotated[
        str,
        typer.Option(
            "--language",
            "-l",
            help="Language code, name or tag (de, German, pt-BR); auto detects it.",
            rich_help_panel=DECODING_PANEL,
        ),
    ] = "auto",
    languages: Annotated[
        str | None,
        typer.Option(
            "--languages",
            help="Languages detection may choose from, comma-separated (en,de); for speech known to be one of them.",
            rich_help_panel=DECODING_PANEL,
        ),
    ] = None,
    task: Annotated[
        Task, typer.Option(help="translate: English text.", rich_help_panel=DECODING_PANEL)
    ] = Task.transcribe,
    multilingual: Annotated[
        bool,
        typer.Option(
            "--multilingual",
            show_default=False,
            help="A language per stretch of speech.",
            rich_help_panel=DECODING_PANEL,
        ),
    ] = False,
    beam_size: Annotated[
        int | None, typer.Option(help="Beam size; greedy when unset.", min=1, rich_help_panel=DECODING_PANEL)
    ] = None,
    best_of: Annotated[
        int | None, typer.Option(help="Candidates when sampling.", min=1, rich_help_panel=DECODING_PANEL)
    ] = None,
    patience: Annotated[
        float | None, typer.Option(help="Beam search patience.", rich_help_panel=DECODING_PANEL)
    ] = None,
    temperature: Annotated[
        float, typer.Option(help="Temperature of the first try.", min=0.0, max=1.0, rich_help_panel=FALLBACK_PANEL)
    ] = 0.0,
    temperature_increment_on_fallback: Annotated[
        float | None, typer.Option(help="Added on each fallback.", rich_help_panel=FALLBACK_PANEL)
    ] = 0.2,
    compression_ratio_threshold: Annotated[
        float | None, typer.Option(help="Retry above this gzip ratio.", rich_help_panel=FALLBACK_PANEL)
    ] = 2.4,
    logprob_threshold: Annotated[
        float | None, typer.Option(help="Retry below this mean logprob.", rich_help_panel=FALLBACK_PANEL)
    ] = -1.0,
    no_speech_threshold: Annotated[
        float | None, typer.Option(help="Silence above this no-speech prob.", rich_help_panel=FALLBACK_PANEL)
    ] = 0.6,
    initial_prompt: Annotated[
        str | None, typer.Option(help="Text the first window is primed with.", rich_help_panel=DECODING_PANEL)
    ] = None,
    hotwords: Annotated[
        str | None, typer.Option(help="Names and jargon to bias towards.", rich_help_panel=DECODING_PANEL)
    ] = None,
    no_condition_on_previous_text: Annotated[
        bool,
        typer.Option(
            "--no-condition-on-previous-text",
            show_default=False,
            rich_help_panel=SEQUENTIAL_PANEL,
            help="Decode each window without the text before it (sequential).",
        ),
    ] = False,
    condition_on_previous_text: Annotated[  # the default, still accepted; one name keeps the help's columns narrow
        bool, typer.Option("--condition-on-previous-text", hidden=True)
    ] = True,
    word_timestamps: Annotated[
        bool,
        typer.Option(
            "--word-timestamps",
            show_default=False,
            help="Time each word; the line options need it.",
            rich_help_panel=SUBTITLE_PANEL,
        ),
    ] = False,
    diarize: Annotated[
        bool,
        typer.Option(
            "--diarize",
            show_default=False,
            help="Label who spoke when (offline, no token); with --live, stretch by stretch as heard.",
            rich_help_panel=SPEAKER_PANEL,
        ),
    ] = False,
    speakers: Annotated[
        int | None,
        typer.Option(help="Exactly this many speakers.", min=1, max=100, rich_help_panel=SPEAKER_PANEL),
    ] = None,
    min_speakers: Annotated[
        int | None,
        typer.Option(
            help="At least this many speakers (not with --live).", min=1, max=100, rich_help_panel=SPEAKER_PANEL
        ),
    ] = None,
    max_speakers: Annotated[
        int | None, typer.Option(help="At most this many speakers.", min=1, max=100, rich_help_panel=SPEAKER_PANEL)
    ] = None,
    speaker_names: Annotated[
        str | None,
        typer.Option(
            metavar="NAMES",
            help='"Ann,Bob": names in order of first appearance.',
            rich_help_panel=SPEAKER_PANEL,
            show_default=False,
        ),
    ] = None,
    speaker_sample: Annotated[
        list[str] | None,
        typer.Option(
            "--speaker-sample",
            metavar="NAME=FILE",
            help="2-10 s of a known speaker alone: named where heard. Repeatable.",
            rich_help_panel=SPEAKER_PANEL,
            show_default=False,
        ),
    ] = None,
    vad: Annotated[
        bool, typer.Option(help="Skip silence, cut long audio at pauses.", rich_help_panel=VAD_PANEL)
    ] = True,
    vad_threshold: Annotated[
        float, typer.Option(help="Speech probability threshold.", min=0.0, max=1.0, rich_help_panel=VAD_PANEL)
    ] = 0.5,
    vad_min_speech_ms: Annotated[
        int, typer.Option(help="Drop speech shorter than this.", min=0, rich_help_panel=VAD_PANEL)
    ] = 0,
    vad_max_speech_s: Annotated[
        float, typer.Option(help="Split speech longer than this.", min=1.0, rich_help_panel=VAD_PANEL)
    ] = float("inf"),
    vad_min_silence_ms: Annotated[
        int, typer.Option(help="Silence that ends speech.", min=0, rich_help_panel=VAD_PANEL)
    ] = 2000,
    vad_speech_pad_ms: Annotated[
        int, typer.Option(help="Audio kept around speech.", min=0, rich_help_panel=VAD_PANEL)
    ] = 400,
    max_line_width: Annotated[
        int | None, typer.Option(help="Characters per line.", min=1, rich_help_panel=SUBTITLE_PANEL)
    ] = None,
    max_line_count: Annotated[
        int | None, typer.Option(help="Lines per cue.", min=1, rich_help_panel=SUBTITLE_PANEL)
    ] = None,
    max_words_per_line: Annotated[
        int | None, typer.Option(help="Words per line.", min=1, rich_help_panel=SUBTITLE_PANEL)
    ] = None,
    highlight_words: Annotated[
        bool,
        typer.Option(
            "--highlight-words",
            show_default=False,
            help="Underline each word as it is spoken.",
            rich_help_panel=SUBTITLE_PANEL,
        ),
    ] = False,
    sequential: Annotated[
        bool,
        typer.Option(
            "--sequential",
            show_default=False,
            help="openai-whisper's own sequential loop.",
            rich_help_panel=SEQUENTIAL_PANEL,
        ),
    ] = False,
    batch_size: BatchSizeOption = 12,
    compute: ComputeOption = Compute.auto,
    threads: ThreadsOption = None,
    pack_short: PackShortOption = True,
    cluster: Annotated[
        str | None,
        typer.Option(
            metavar="ADDRESS",
            help="Run on Ray: auto, local, ray://host:10001 or host:port.",
            rich_help_panel=CLUSTER_PANEL,
            show_default=False,
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(help="Workers on the cluster; default: as its CPUs allow.", min=1, rich_help_panel=CLUSTER_PANEL),
    ] = None,
) -> None:
    """Transcribe audio or video files, folders, glob patterns, or stdin."""
    arguments = dict(locals())  # the parameters alone, for options_from
    from ..batch.inputs import expand
    from ..batch.runner import BatchPlan, BatchSummary, is_complete, outputs_for
    from ..executor import check_compute, verify_ahead
    from ..writers import LINE_FORMATS, SubtitleLayout, ensure_writable_dir, parse_formats
    from .render import TranscribeView

    verify_ahead(model)  # on another thread, while the rest starts
    output_dir = call(_output_folder, output_dir)
    call(check_compute, compute.value)
    formats = call(parse_formats, output_format, diarize)
    if output_dir is None and len(formats) > 1 and not set(formats) <= set(LINE_FORMATS):  # no reader parses that
        fail(UsageError(
            f"stdout takes one format, or json, jsonl and rttm (a record a line), not {', '.join(formats)}:"
            " -o DIR writes each to a file of its own"
        ))  # fmt: skip
    layout = SubtitleLayout(max_line_width, max_line_count, max_words_per_line, highlight_words)
    _check_subtitle_options(layout, word_timestamps)
    jobs = call(expand, inputs, stdin_name) if mic is not None and inputs else []
    if mic is None:
        jobs = call(expand, _inputs_or_stdin(inputs), stdin_name)
    else:
        from ..batch.inputs import microphone

        jobs.append(call(microphone, mic, "mic"))
        live = True
    if live:
        _check_live(jobs, vad, sequential, min_speakers)
    if workers is not None and cluster is None:
        fail(UsageError("--workers needs --cluster"))
    if skip_existing and output_dir is None:
        fail(UsageError("--skip-existing needs -o: it skips inputs whose files there are whole"))
    if output_dir is not None:
        call(ensure_writable_dir, output_dir)
    options = call(options_from, arguments)
    plan = BatchPlan(jobs, options, formats, output_dir, layout, skip_existing, live)
    view = TranscribeView(formats, layout, output_dir is None, len(jobs) > 1, quiet, verbose, live)
    view.report_language = options.language is None  # detected: say which it was
    signal.signal(signal.SIGTERM, on_signal)
    if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:  # nohup's stays ignored
        signal.signal(signal.SIGHUP, on_signal)  # the terminal closed: end as SIGTERM does, outputs whole
    if skip_existing and output_dir is not None and all(is_complete(outputs_for(j, output_dir, formats)) for j in jobs):
        view.finish(BatchSummary(skipped=len(jobs)))
        return
    settings = None
    if cluster is None:
        warn_past_cpus(threads)  # a cluster's workers run on their own nodes' CPUs
    else:
        from ..batch.cluster import ClusterSettings

        settings = ClusterSettings(cluster.strip(), workers, model, device, dtype.value, threads)
    _run(plan, view, model, device, dtype.value, threads, settings)


def options_from(arguments: dict) -> TranscribeOptions:
    """The one place the command's arguments (transcribe's parameters, by name) become
    TranscribeOptions, checked as every caller's are."""
    from types import SimpleNamespace

    from ..languages import language_code, language_codes
    from ..options import TranscribeOptions, VadOptions

    a = SimpleNamespace(**arguments)
    vad_options = VadOptions(
        threshold=a.vad_threshold, min_speech_duration_ms=a.vad_min_speech_ms, max_speech_duration_s=a.vad_max_speech_s,
        min_silence_duration_ms=a.vad_min_silence_ms, speech_pad_ms=a.vad_speech_pad_ms,
    )  # fmt: skip
    options = TranscribeOptions(
        audio_stream=a.audio_stream, language=language_code(a.language),
        languages=language_codes((a.languages or "").split(",")), task=a.task.value, multilingual=a.multilingual,
        beam_size=a.beam_size, best_of=a.best_of, patience=a.patience,
        temperature=temperatures(a.temperature, a.temperature_increment_on_fallback),
        compression_ratio_threshold=a.compression_ratio_threshold, logprob_threshold=a.logprob_threshold,
        no_speech_threshold=a.no_speech_threshold, condition_on_previous_text=not a.no_condition_on_previous_text,
        initial_prompt=a.initial_prompt, hotwords=a.hotwords, word_timestamps=a.word_timestamps, vad=a.vad,
        vad_options=vad_options, sequential=a.sequential, batch_size=a.batch_size, compute=a.compute.value,
        pack_short=a.pack_short, diarize=a.diarize, speakers=a.speakers, min_speakers=a.min_speakers,
        max_speakers=a.max_speakers, speaker_names=_names(a.speaker_names),
        known_speakers=_known_speakers(a.speaker_sample or []),
    )  # fmt: skip
    options.check(named=_flag)
    return options


def _flag(option: str) -> str:
    """The flag that sets a TranscribeOptions field, for the messages of options.check."""
    return "--speaker-sample" if option == "known_speakers" else "--" + option.replace("_", "-")


SAMPLE_BYTES = 50 << 20  # a known speaker's sample: seconds of audio, in any format, is far less


def _known_speakers(given: list[str]) -> tuple[KnownSpeaker, ...]:
    """--speaker-sample NAME=FILE: each file read here, so that a wrong one fails before the model loads."""
    from ..batch.inputs import home_expanded
    from ..options import KnownSpeaker

    known = []
    for item in given:
        name, sep, path = item.partition("=")
        name = name.strip()
        if not sep or not name or not path:
            raise UsageError(f"--speaker-sample takes NAME=FILE, not {item!r}")
        try:
            with open(home_expanded(path), "rb") as fh:
                data = fh.read(SAMPLE_BYTES + 1)
        except OSError as exc:
            raise UsageError(f"cannot read the sample of {name!r}: {exc.strerror or exc}") from None
        if len(data) > SAMPLE_BYTES:
            raise UsageError(f"the sample of {name!r} is over {SAMPLE_BYTES >> 20} MB: give 2 to 10 s of them")
        known.append(KnownSpeaker(name, data))
    return tuple(known)


def _output_folder(given: str | None) -> Path | None:
    """-o's folder; None for stdout: no -o, or '-' as other tools name it. An empty name (a
    script's unset variable, `-o "$OUT"`) is refused rather than read as the current folder."""
    if given is None or given == "-":
        return None
    if not given:
        raise UsageError("-o names no folder (an empty name); give a folder, or - for stdout")
    return Path(given)


def _inputs_or_stdin(inputs: list[str] | None) -> list[str]:
    """With no input and a pipe, stdin is read."""
    if inputs:
        return inputs
    if sys.stdin.isatty():
        fail(UsageError("no input given; pass files, folders, patterns, or pipe audio on stdin"))
    return ["-"]


def _names(given: str | None) -> tuple[str, ...]:
    return tuple(name.strip() for name in given.split(",")) if given is not None else ()


def _check_live(jobs, vad: bool, sequential: bool, min_speakers: int | None) -> None:
    """Live input is cut at pauses by the VAD, in the batched engine, and only streams are live;
    speakers are labelled as they are heard, so a count the recording must reach cannot hold."""
    if files := [job for job in jobs if not job.is_stream]:
        fail(UsageError(f"--live reads stdin, a pipe, a URL or --mic, not a file: {files[0].display}"))
    if not vad:
        fail(UsageError("--live needs the VAD: it cuts the stream at pauses"))
    if sequential:
        fail(UsageError("--live runs in the batched engine: drop --sequential"))
    if min_speakers is not None:
        fail(UsageError("--min-speakers does not run with --live: speakers are labelled as they are heard"))


def _check_subtitle_options(layout, word_timestamps: bool) -> None:
    """openai-whisper's writers lay subtitle lines out from word times: without them the options would do nothing."""
    if (given := layout.given()) and not word_timestamps:
        fail(UsageError(f"{given[0]} needs --word-timestamps: subtitle lines are laid out from word times"))


def _run(plan, view, model: str, device: str, dtype: str, threads: int | None, cluster=None) -> None:
    """Load the model (ffmpeg starts on the first inputs meanwhile), or hand the batch to the
    cluster's workers, run it, and end with the summary and the exit code: 1 if an input failed,
    130/143/129 when interrupted (Ctrl-C, SIGTERM, SIGHUP)."""
    from ..batch.runner import BatchSummary, run_batch, start_decoding

    summary = BatchSummary()

    def start_progress() -> None:
        view.show_progress(len(plan.jobs))
        if view.progress:
            view.progress.start()

    try:
        if cluster is not None:
            from ..batch.cluster import run_cluster

            start_progress()
            call(run_cluster, plan, view.events(), summary, cluster)
        else:
            with start_decoding(plan) as started:
                executor = _load_executor(model, device, dtype, threads)
                call(executor.check_options, plan.options)
                start_progress()
                call(run_batch, executor, plan, view.events(), summary, state["debug"], started)
    except BrokenPipeError:  # stdout's reader went away (| head): nothing more can reach it
        view.stop_progress()
        raise typer.Exit(quiet_broken_pipe()) from None
    except (KeyboardInterrupt, Interrupted) as exc:
        summary.interrupted = True
        view.stop_progress()
        err.print("[yellow]interrupted[/]: finished files keep their outputs; rerun with --skip-existing to resume")
        view.finish(summary)
        raise typer.Exit(exc.code if isinstance(exc, Interrupted) else 130) from None
    view.finish(summary)
    if summary.failed:
        raise typer.Exit(1)


def _load_executor(model: str, device: str, dtype: str, threads: int | None):
    from .. import WhisperModelExecutor

    return call(WhisperModelExecutor.from_path, model, device, dtype, threads)
