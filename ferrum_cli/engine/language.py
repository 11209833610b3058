"""The language of an input: Whisper's language token, averaged over up to three windows of sound."""

from __future__ import annotations

from collections.abc import Sequence
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


def most_likely(probabilities: dict[str, float], among: Sequence[str] = ()) -> tuple[str, float]:
    """(code, probability) of the likeliest language, of those in `among` where it names any: its
    probability then among them (the user knows it is one of them)."""
    if not among:
        language = max(probabilities, key=probabilities.get)
        return language, probabilities[language]
    language = max(among, key=lambda code: probabilities.get(code, 0.0))
    total = sum(probabilities.get(code, 0.0) for code in among)
    return language, probabilities.get(language, 0.0) / total if total > 0 else 1.0 / len(among)


def _probabilities(model, features: torch.Tensor) -> list[dict[str, float]]:
    """Whisper's language probabilities of each encoded window ([windows, 1500, width])."""
    import torch

    tokenizer = get_tokenizer(model.is_multilingual, num_languages=model.num_languages)
    with torch.no_grad():
        return model.detect_language(features, tokenizer)[1]


def window_languages(model, features: torch.Tensor, among: Sequence[str]) -> list[str]:
    """Each encoded window's language ([windows, 1500, width]), one of `among`."""
    return [most_likely(p, among)[0] for p in _probabilities(model, features)]


def detect_language(
    model,
    windows: list[np.ndarray],
    compute: str | None = None,
    features: torch.Tensor | None = None,
    among: Sequence[str] = (),
) -> tuple[str, float]:
    """(code, probability) from up to three of the windows that hold sound; ('und', 0.0) without any.

    features: the windows already encoded ([windows, 1500, width]), so they are not encoded twice;
    among: the languages it may be (most_likely), () for any.
    """
    if not model.is_multilingual:
        return "en", 1.0
    chosen = probe_windows(windows)
    if not chosen:
        return "und", 0.0
    probes = features[chosen] if features is not None else encode_windows(model, [windows[i] for i in chosen], compute)
    probs = _probabilities(model, probes)
    total: dict[str, float] = {}
    for p in probs:
        for lang, value in p.items():
            total[lang] = total.get(lang, 0.0) + value / len(probs)
    return most_likely(total, among)
