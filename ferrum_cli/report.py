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
    """Ready with no network: in our cache, in openai-whisper's cache, or a verified pack is installed."""
    from . import cache
    from .packs import packs_for
    from .resolve import _download_url, _openai_cache_dir

    if cache.cached_entry(name):
        return True, "in the ferrum cache"
    from pathlib import Path

    if (_openai_cache_dir() / Path(_download_url(name)).name).exists():
        return True, "in openai-whisper's cache"
    usable = [p for p in packs_for(name) if p.sha256 and p.is_installed()]
    if usable:
        return True, f"pack {'+'.join(usable[0].distributions)} installed (converted on first use)"
    hints = [p.install_hint for p in packs_for(name) if p.sha256]
    return False, f"model {name!r} needs the network; {hints[0] if hints else 'pass a checkpoint path'}"


def machine_status() -> dict:
    import torch

    from . import cache
    from .audio import ffmpeg_version, find_ffmpeg
    from .devices import choose, cpu_auto_compute, cpu_has_native_bf16, describe_devices
    from .packs import installed_packs
    from .resolve import DEFAULT_MODEL

    problems: list[str] = []
    try:
        ff = find_ffmpeg()
        ffmpeg = {"path": ff.path, "source": ff.source, "version": ffmpeg_version()}
    except FerrumError as exc:
        ffmpeg = {"path": None, "source": None, "version": None}
        problems.append(exc.message)
    placement = choose("auto", "auto")
    ready, how = default_model_readiness(DEFAULT_MODEL)
    if not ready:
        problems.append(how)
    return {
        "versions": {
            "ferrum": __version__,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "openai-whisper": _version("openai-whisper"),
            "ffmpeg": ffmpeg["version"],
        },
        "ffmpeg": ffmpeg,
        "devices": describe_devices(),
        "default_device": placement.device,
        "default_dtype": placement.dtype,
        "torch_threads": torch.get_num_threads(),
        "cpu_bfloat16_instructions": cpu_has_native_bf16(),
        "cpu_compute": cpu_auto_compute(),  # what `--compute auto` runs the encoder in on this CPU
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
