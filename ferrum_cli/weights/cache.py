"""The model cache: converted weights as safetensors, checked by SHA-256, written atomically."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from ..errors import ModelIntegrityError
from ..platform.files import atomic_write_bytes
from .checkpoints import Weights, sha256_file

CACHE_FORMAT = 1


def cache_dir() -> Path:
    """FERRUM_CACHE_DIR, else $XDG_CACHE_HOME/ferrum, else ~/.cache/ferrum."""
    if env := os.environ.get("FERRUM_CACHE_DIR"):
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(xdg) / "ferrum"


def _paths(name: str) -> tuple[Path, Path]:
    base = cache_dir() / "models"
    return base / f"{name}.safetensors", base / f"{name}.json"


def store(weights: Weights) -> None:
    """Write weights in their own float dtype (float16 for packs)."""
    from safetensors.torch import save

    tensors = {k: v.contiguous() for k, v in weights.state_dict.items()}
    blob = save(tensors)
    weights_path, meta_path = _paths(weights.name)
    atomic_write_bytes(weights_path, blob)
    meta = {
        "cache_format": CACHE_FORMAT,
        "name": weights.name,
        "dims": weights.dims,
        "alignment_heads": weights.alignment_heads,
        "source": weights.source,
        "source_format": weights.format,
        "source_sha256": weights.sha256,
        "sha256": sha256_file(weights_path),
    }
    atomic_write_bytes(meta_path, json.dumps(meta, indent=1).encode())


def cached_entry(name: str) -> dict | None:
    weights_path, meta_path = _paths(name)
    if not (weights_path.exists() and meta_path.exists()):
        return None
    try:
        meta = json.loads(meta_path.read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return meta if meta.get("cache_format") == CACHE_FORMAT else None


class _EarlyDigest(threading.Thread):
    """The SHA-256 of a cached weights file, computed on another thread."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.identity, self.digest = path, _identity(path), None

    def run(self) -> None:
        try:
            self.digest = sha256_file(self.path)
        except OSError:
            pass


_early: dict[Path, _EarlyDigest] = {}


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def start_verifying(name: str) -> None:
    """Begin checking the cached weights of model `name` while the caller imports torch.

    The check reads the whole file while torch's import keeps one core busy; hashlib lets go of
    the GIL, so the two overlap. load() uses the digest only if
    the file is still the one that was hashed.
    """
    if not name or os.sep in name or name.startswith("."):
        return  # a path, not a model name: nothing of ours to check
    weights_path, _ = _paths(name)
    if weights_path in _early or _identity(weights_path) is None:
        return
    _early[weights_path] = _EarlyDigest(weights_path)
    _early[weights_path].start()


def _digest(path: Path) -> str:
    early = _early.pop(path, None)
    if early is not None:
        early.join()
        if early.digest is not None and early.identity == _identity(path):
            return early.digest
    return sha256_file(path)


def load(name: str) -> Weights:
    """Raises ModelIntegrityError when the file does not match the checksum it was stored with."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    meta = cached_entry(name)
    if meta is None:
        raise ModelIntegrityError(f"no usable cache entry for {name}")
    weights_path, _ = _paths(name)
    if _digest(weights_path) != meta["sha256"]:
        raise ModelIntegrityError(f"cached model {weights_path} fails its SHA-256 check")
    try:
        state = load_file(str(weights_path))
    except (SafetensorError, OSError) as exc:
        raise ModelIntegrityError(f"cached model {weights_path} is unreadable: {exc}") from None
    return Weights(
        meta["dims"],
        state,
        meta.get("alignment_heads"),
        "cache",
        str(weights_path),
        meta["source_sha256"],
        name,
        {"converted_from": meta.get("source"), "source_format": meta.get("source_format")},
    )


def list_cached() -> list[dict]:
    """Cached models with their sizes in bytes, for `ferrum status`."""
    folder = cache_dir() / "models"
    out = []
    for meta_path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        weights_path = meta_path.with_suffix(".safetensors")
        if weights_path.exists():
            out.append({"name": meta_path.stem, "path": str(weights_path), "bytes": weights_path.stat().st_size})
    return out


def remembered(name: str, compute):
    """A small JSON value computed once per machine and kept in the cache (e.g. token lists)."""
    path = cache_dir() / "derived" / f"{name}.json"
    try:
        return json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        pass
    value = compute()
    try:
        atomic_write_bytes(path, json.dumps(value).encode())
    except OSError:
        pass
    return value
