"""Level relative to the recording: quiet audio is raised before anything decides on it.

Silero's probabilities fall with level and Whisper reads quiet speech worse, while a quiet
recording holds the same words as a loud one; so what the VAD reads, and each stretch of
speech that Whisper reads, is raised to a normal level when it lies under it. Audio at or
above that level is read as recorded.
"""

from __future__ import annotations

import numpy as np

from .constants import SAMPLE_RATE, VAD_FRAME

NORMAL_LEVEL = 10 ** (-30 / 20)  # the loudest frame of speech at an ordinary recording level, or above it
REACH = SAMPLE_RATE // VAD_FRAME  # frames on each side (1 s) whose loudest sets a frame's level for the VAD


def frame_levels(samples: np.ndarray) -> np.ndarray:
    """RMS of each VAD_FRAME of samples (the last one zero-padded)."""
    n = -(-len(samples) // VAD_FRAME)
    frames = np.zeros(n * VAD_FRAME, np.float32)
    frames[: len(samples)] = samples
    return np.sqrt(np.square(frames.reshape(n, VAD_FRAME), dtype=np.float64).mean(axis=1))


def gain_to_normal(loudest: np.ndarray) -> np.ndarray:
    """Gain that brings `loudest` up to NORMAL_LEVEL, never down; digital silence stays as it is."""
    return np.maximum(NORMAL_LEVEL / np.maximum(loudest, np.finfo(np.float32).tiny), 1.0)


def raised_for_vad(samples: np.ndarray) -> np.ndarray:
    """The samples as the VAD reads them: each stretch whose loudest frame within a second is
    under NORMAL_LEVEL is raised to it, the gain moving smoothly from frame to frame.

    The level is local, not the file's, so quiet speech beside loud speech is raised too.
    Noise raised this way is still noise to Silero.
    """
    levels = frame_levels(samples)
    if len(levels) == 0:
        return samples
    padded = np.concatenate([np.zeros(REACH), levels, np.zeros(REACH)])
    local = np.lib.stride_tricks.sliding_window_view(padded, 2 * REACH + 1).max(axis=1)
    gain = gain_to_normal(local)
    if gain.max() <= 1.0:
        return samples
    centres = np.arange(len(gain)) * VAD_FRAME + VAD_FRAME / 2
    per_sample = np.interp(np.arange(len(samples)), centres, gain).astype(np.float32)
    return np.clip(samples * per_sample, -1.0, 1.0)


SPEECH_RANGE = 10 ** (-20 / 20)  # quiet speech is raised to at least this far under the loudest speech around it


def raised_spans(samples: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    """The samples with each (start, end) span of quiet speech (its loudest frame under NORMAL_LEVEL)
    raised by one gain, to NORMAL_LEVEL or to 20 dB under the loudest span, whichever is higher:
    Whisper reads the speech at its own dynamics, only louder, and quiet speech beside loud speech
    is not taken for background. The samples are returned as they are when no span is quiet."""
    loudest = [float(frame_levels(samples[a:b]).max(initial=0.0)) for a, b in spans]
    target = max(NORMAL_LEVEL, max(loudest, default=0.0) * SPEECH_RANGE)
    raised = [(a, b, target / level) for (a, b), level in zip(spans, loudest) if 0 < level < NORMAL_LEVEL]
    if not raised:
        return samples
    out = samples.copy()
    for a, b, gain in raised:
        out[a:b] = np.clip(samples[a:b] * gain, -1.0, 1.0)
    return out
