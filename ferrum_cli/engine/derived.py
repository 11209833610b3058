"""What the engine computes from a model's weights once and keeps on the model."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..platform.cpu import Background

T = TypeVar("T")


def derived(model, name: str, make: Callable[[], T]) -> T:
    """Something computed from the model's weights once and kept on the model, which outlives
    the decoding tasks and batches that use it."""
    kept = model.__dict__.setdefault("_ferrum_derived", {})
    if name not in kept:
        kept[name] = make()
    elif isinstance(kept[name], Background):  # started by derive_ahead: its result, once there
        kept[name] = kept[name].result()
    return kept[name]


def derive_ahead(model, name: str, make: Callable[[], T]) -> None:
    """Start computing what derived(model, name) returns on a thread of its own, so that its
    first caller finds it done: the decoder's packed weights while the first input is read and
    encoded, where a cold start waited for them after."""
    kept = model.__dict__.setdefault("_ferrum_derived", {})
    if name not in kept:
        # not a daemon: a process that ended while torch packed aborted in its teardown (exit 134)
        kept[name] = Background(make, f"ferrum-{name}", daemon=False)
