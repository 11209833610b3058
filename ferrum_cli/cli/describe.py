"""`ferrum info`, `status` and `warmup`: the model and the machine, described."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from .console import call, err
from .render import print_mapping
from .transcribe import Dtype, _complete_devices

JSON = typer.Option("--json", help="Print JSON.")


def info(
    model: Annotated[str, typer.Option("--model", "-m", help="Model name, file or folder.")] = "base",
    as_json: Annotated[bool, JSON] = False,
) -> None:
    """Describe a model: format, source, checksum, size and dimensions. Loads no model onto a device."""
    from ..executor import describe_model

    print_mapping(f"model {model}", call(describe_model, model), as_json)


def status(as_json: Annotated[bool, JSON] = False) -> None:
    """Report versions, ffmpeg, devices, the model cache, packs, and whether the default model is ready offline."""
    from ..status import machine_status

    report = call(machine_status)
    print_mapping("ferrum status", report, as_json)
    if report["problems"]:
        for problem in report["problems"]:
            err.print(f"[red]error:[/] {escape(problem)}")
        raise typer.Exit(1)


def warmup(
    model: Annotated[str, typer.Option("--model", "-m", help="Model name, file or folder.")] = "base",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N or mps.", autocompletion=_complete_devices)] = (
        "auto"
    ),
    dtype: Annotated[Dtype, typer.Option(help="Weights' dtype; auto: float32 on CPU.")] = Dtype.auto,
    diarize: Annotated[
        bool,
        typer.Option(
            "--diarize",
            help="Also load the diarizer and compile its clustering's code into the cache, which the first "
            "recording past 20 minutes diarized would otherwise wait for (about 20 s, once).",
        ),
    ] = False,
    as_json: Annotated[bool, JSON] = False,
) -> None:
    """Resolve, convert and cache the model, load it, run one real forward pass; print each step's time."""
    from ..executor import warmup_steps

    print_mapping("ferrum warmup", call(warmup_steps, model, device, dtype.value, diarize), as_json)
