"""Model resolution: a path, or a name loaded from the first place locations.offline_places
finds it in, else openai-whisper's own download."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ..errors import ModelError, ModelIntegrityError, ModelNotFoundError
from . import cache
from .checkpoints import Weights, load_openai_pt, load_path, no_model_at
from .locations import (
    Place,
    download_url,
    known_model_names,
    offline_places,
    openai_cache_dir,
    openai_checkpoint,
    openai_pinned_sha,
)
from .packs import ModelPack, packs_for, read_pack

log = logging.getLogger("ferrum")


def check_model_name(model: str, path_here: bool = True) -> None:
    """What resolve() would say of the name without reading anything: an unknown name, or a path
    with nothing there (the server checks this before it starts, then loads in the background).
    path_here False: a path is read elsewhere (a cluster's workers), so only names are checked."""
    if _is_path(model):
        path = Path(model).expanduser()
        if path_here and not path.exists():
            raise no_model_at(path)
        return
    names = known_model_names()
    if model not in names:
        raise ModelNotFoundError(f"unknown model {model!r}; known names: {', '.join(names)}, or pass a path")


def _is_path(model: str) -> bool:
    return Path(model).expanduser().exists() or os.sep in model or model.endswith((".pt", ".bin", ".safetensors"))


def resolve(model: str) -> Weights:
    """Weights for a model name, a checkpoint file, or a model directory."""
    if _is_path(model):
        return load_path(Path(model).expanduser())  # says itself where nothing is there
    check_model_name(model)
    pack_problems = []
    for place in offline_places(model):
        try:
            return _load(model, place)
        except ModelError as exc:
            if place.kind == "openai-cache":
                raise  # openai-whisper's own file, not ours to pass over
            if place.kind == "cache":
                log.warning("%s; rebuilding it from its pack", exc.message)
            else:
                pack_problems.append(exc.message)
    if pack_problems:  # an installed pack that cannot be read says why, rather than a download failing
        raise ModelIntegrityError(pack_problems[0])
    try:
        return _download(model)
    except OSError as exc:
        hints = [p.install_hint for p in packs_for(model) if p.sha256]
        hint = f"install its pack ({hints[0]})" if hints else "pass the path of a checkpoint"
        raise ModelNotFoundError(
            f"model {model!r} is not cached and cannot be downloaded ({exc}); {hint}, "
            f"or put {openai_checkpoint(model).name} in {openai_cache_dir()}"
        ) from None


def _load(name: str, place: Place) -> Weights:
    if place.kind == "cache":
        return cache.load(name)
    if place.kind == "openai-cache":
        return _from_openai_file(name, place.path)
    return _from_pack(name, place.pack)


def _from_openai_file(name: str, path: Path) -> Weights:
    weights = load_openai_pt(path)
    if weights.sha256 != openai_pinned_sha(name):
        raise ModelIntegrityError(f"{path} does not match openai-whisper's checksum for {name}")
    weights.name = name
    return weights


def _from_pack(name: str, pack: ModelPack) -> Weights:
    """Convert a verified pack of this model and cache it."""
    from .ct2 import read_model_bin, to_openai_state_dict

    data, config = read_pack(pack)
    _, variables = read_model_bin(data)
    dims, state = to_openai_state_dict(variables)
    weights = Weights(
        dims, state, config.get("alignment_heads"), "pack", "+".join(pack.distributions), pack.sha256, name
    )
    try:
        cache.store(weights)
    except OSError as exc:
        log.warning("cannot cache %s in %s: %s", name, cache.cache_dir(), exc)
    return weights


def _download(name: str) -> Weights:
    import socket
    import urllib.error

    from whisper import _download

    if os.environ.get("FERRUM_OFFLINE"):
        raise OSError("FERRUM_OFFLINE is set")
    old_timeout = socket.getdefaulttimeout()
    socket.setdefaulttimeout(15)
    try:
        path = _download(download_url(name), str(openai_cache_dir()), in_memory=False)
    except (urllib.error.URLError, OSError, RuntimeError) as exc:
        raise OSError(str(exc)) from None
    finally:
        socket.setdefaulttimeout(old_timeout)
    return _from_openai_file(name, Path(path))
