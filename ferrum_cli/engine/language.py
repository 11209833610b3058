"""The language of an input: Whisper's language token, averaged over up to three windows of sound."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .encoder import encode_windows
from .tokenizer import get_tokenizer

if TYPE_CHECKING:
    import torch

AUDIBLE_RANGE = 10 ** (-40 / 20)  # a window this far under the loudest one is taken for silence
PROBES = 3  # windows whose language probabilities are averaged


def loudness(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(samples, dtype=np.float64)))) if samples.size else 0.0


def probe_windows(windows: list[np.ndarray], count: int = PROBES) -> list[int]:
    """Indices of up to `count` windows, spread over those given, that hold sound: level relative to
    the loudest window, never an absolute one, so a quiet recording is heard like a loud one."""
    levels = [loudness(w) for w in windows]
    loudest = max(levels, default=0.0)
    audible = [i for i, level in enumerate(levels) if level > 0 and level >= loudest * AUDIBLE_RANGE]
    if len(audible) <= count:
        return audible
    return [audible[round(k * (len(audible) - 1) / (count - 1))] for k in range(count)]


def detect_language(
    model, windows: list[np.ndarray], compute: str | None = None, features: torch.Tensor | None = None
) -> tuple[str, float]:
    """(code, probability) from up to three of the windows that hold sound; ('und', 0.0) without any.

    features: the windows already encoded ([windows, 1500, width]), so they are not encoded twice.
    """
    import torch

    if not model.is_multilingual:
        return "en", 1.0
    chosen = probe_windows(windows)
    if not chosen:
        return "und", 0.0
    probes = features[chosen] if features is not None else encode_windows(model, [windows[i] for i in chosen], compute)
    tokenizer = get_tokenizer(model.is_multilingual, num_languages=model.num_languages)
    with torch.no_grad():
        _, probs = model.detect_language(probes, tokenizer)
    total: dict[str, float] = {}
    for p in probs:
        for lang, value in p.items():
            total[lang] = total.get(lang, 0.0) + value / len(probs)
    language = max(total, key=total.get)
    return language, total[language]
