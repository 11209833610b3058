"""Where a model name is looked up, in this order: ferrum's cache, openai-whisper's cache,
installed model packs, and last openai-whisper's own download. resolve() loads from the first
place that holds the model; `ferrum status` reports it. openai-whisper's model tables are
private names of its package (tests/test_openai_whisper_api.py checks that they are there)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from . import cache
from .packs import ModelPack, packs_for

DEFAULT_MODEL = "base"


@dataclass(frozen=True)
class Place:
    """A place that holds a model without the network."""

    kind: str  # "cache", "openai-cache" or "pack"
    detail: str  # for people: where, or which pack
    path: Path | None = None  # openai-cache: the checkpoint
    pack: ModelPack | None = None  # pack: the installed pack


def known_model_names() -> list[str]:
    from whisper import _MODELS

    return list(_MODELS)


def download_url(name: str) -> str:
    from whisper import _MODELS

    return _MODELS[name]


def openai_pinned_sha(name: str) -> str:
    """openai-whisper's checksum of its checkpoint, which is part of its download URL."""
    return download_url(name).split("/")[-2]


def openai_cache_dir() -> Path:
    default = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(os.getenv("XDG_CACHE_HOME", default)) / "whisper"


def openai_checkpoint(name: str) -> Path:
    """Where openai-whisper keeps (or would keep) its checkpoint of `name`."""
    return openai_cache_dir() / Path(download_url(name)).name


def offline_places(name: str) -> list[Place]:
    """Each place that holds `name` without the network, in lookup order."""
    places = []
    if cache.cached_entry(name) is not None:
        places.append(Place("cache", "in the ferrum cache"))
    if openai_checkpoint(name).exists():
        places.append(Place("openai-cache", "in openai-whisper's cache", path=openai_checkpoint(name)))
    for pack in packs_for(name):
        if pack.is_installed():  # one without a pinned checksum is refused when read, with its reason
            detail = f"pack {'+'.join(pack.distributions)} installed (converted on first use)"
            places.append(Place("pack", detail, pack=pack))
    return places


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
