"""What the engine computes from a model's weights once and keeps on the model."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def derived(model, name: str, make: Callable[[], T]) -> T:
    """Something computed from the model's weights once and kept on the model, which outlives
    the decoding tasks and batches that use it."""
    kept = model.__dict__.setdefault("_ferrum_derived", {})
    if name not in kept:
        kept[name] = make()
    return kept[name]
