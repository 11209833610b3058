"""Voice activity detection with Silero VAD: where speech is, so silence is skipped and long
audio is cut at pauses.

Silero is a small recurrent model that reads 32 ms frames one after another. Run that way it
reads about 60x real time on one core here; we cut the audio into up to 128 streams of at
least 2 s that overlap by 0.5 s and run them as one batch, which reads about 1,000x real time.
On the corpus and the 603 s longform the regions match those of 32 streams but for one edge
that moved by one frame.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache

import numpy as np

from .audio import SAMPLE_RATE

FRAME = 512  # samples per Silero frame at 16 kHz
WARMUP_FRAMES = 16  # each stream first reads 0.5 s of the audio before it, to settle its state
MIN_STREAM_FRAMES = 64  # each stream reads at least 2 s of its own


@dataclass
class VadOptions:
    """The same knobs as faster-whisper's VadOptions."""

    threshold: float = 0.5
    neg_threshold: float | None = None
    min_speech_duration_ms: int = 0
    max_speech_duration_s: float = float("inf")
    min_silence_duration_ms: int = 2000
    speech_pad_ms: int = 400


@lru_cache(maxsize=1)
def _silero():
    """The silero_vad package. Its import calls torch.set_num_threads(1), which would halve the
    speed of everything else on two cores: the thread count is put back."""
    import torch

    threads = torch.get_num_threads()
    import silero_vad

    torch.set_num_threads(threads)
    return silero_vad


@lru_cache(maxsize=1)
def _model():
    return _silero().load_silero_vad()


def speech_probabilities(samples: np.ndarray, streams: int = 128) -> np.ndarray:
    """One speech probability per 32 ms frame."""
    import torch

    n_frames = -(-len(samples) // FRAME)
    if n_frames == 0:
        return np.zeros(0, np.float32)
    streams = max(1, min(streams, n_frames // MIN_STREAM_FRAMES or 1))
    per = -(-n_frames // streams)
    padded = np.zeros((per * streams + WARMUP_FRAMES) * FRAME, np.float32)
    padded[WARMUP_FRAMES * FRAME : WARMUP_FRAMES * FRAME + len(samples)] = samples
    frames = torch.from_numpy(padded).view(-1, FRAME)
    # stream s reads frames [s*per, s*per + per + WARMUP) of the padded audio; the warm-up is dropped
    index = torch.arange(streams)[:, None] * per + torch.arange(per + WARMUP_FRAMES)[None, :]
    model = _model()
    model.reset_states()
    out = torch.empty(streams, per + WARMUP_FRAMES)
    # TorchScript's profiling executor spends the first calls profiling the graph; a file of a
    # few seconds is over before that pays off, and a long one runs no faster with it
    with torch.no_grad(), torch.jit.optimized_execution(False):
        for step in range(per + WARMUP_FRAMES):
            out[:, step] = model(frames[index[:, step]], SAMPLE_RATE).view(-1)
    return out[:, WARMUP_FRAMES:].reshape(-1)[:n_frames].numpy()


def speech_regions(samples: np.ndarray, options: VadOptions | None = None) -> list[tuple[int, int]]:
    """(start, end) sample ranges of speech, padded by speech_pad_ms on each side."""
    return speech_regions_and_core(samples, options)[0]


def speech_regions_and_core(
    samples: np.ndarray, options: VadOptions | None = None
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The padded regions, and the speech itself (no padding), from one pass of the model."""
    options = options or VadOptions()
    probs = speech_probabilities(samples)
    if probs.size == 0:
        return [], []
    out = []
    for pad in (options.speech_pad_ms, 0):
        stamps = _silero().get_speech_timestamps_from_probs(
            probs.tolist(),
            sampling_rate=SAMPLE_RATE,
            audio_length_samples=len(samples),
            **{**asdict(options), "speech_pad_ms": pad},
        )
        out.append([(int(s["start"]), int(s["end"])) for s in stamps])
    return out[0], out[1]


def speech_within(core: list[tuple[int, int]], start: int, end: int) -> int:
    """Samples of speech in [start, end) by regions that may overlap (blocks are planned with overlap)."""
    pieces = sorted((max(a, start), min(b, end)) for a, b in core if a < end and b > start)
    total, reached = 0, start
    for a, b in pieces:
        a = max(a, reached)
        if b > a:
            total += b - a
            reached = b
    return total
