"""Voice activity detection with Silero VAD: where speech is, so silence is skipped and long
audio is cut at pauses.

Silero is a small recurrent model that reads 32 ms frames one after another, slowly; so the
audio is cut into up to 128 streams of at least 2 s that overlap by 0.5 s, run as one batch
(docs/performance.md). What it reads is raised to a normal level first (level.raised_for_vad).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict
from functools import lru_cache

import numpy as np

from ..options import VadOptions
from ..platform.cpu import single_threaded
from .constants import SAMPLE_RATE, VAD_FRAME
from .level import raised_for_vad
from .spool import release_pages

WARMUP_FRAMES = 16  # each stream first reads 0.5 s of the audio before it, to settle its state
MIN_STREAM_FRAMES = 64  # each stream reads at least 2 s of its own


@lru_cache(maxsize=1)
def _silero():
    """The silero_vad package. Its import calls torch.set_num_threads(1), which would halve the
    speed of everything else on two cores: the thread count is put back."""
    import torch

    threads = torch.get_num_threads()
    import silero_vad

    torch.set_num_threads(threads)
    return silero_vad


_MODEL_LOCK = threading.Lock()  # live streams plan on threads of their own, the engine on its
MAX_READERS = 4  # threads that read a file's streams, each with a Silero of its own


@lru_cache(maxsize=MAX_READERS)
def _model(reader: int):
    """The Silero a reading thread steps: one each, as the model keeps its streams' state."""
    return _silero().load_silero_vad()


@lru_cache(maxsize=1)
def _readers() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(MAX_READERS - 1, thread_name_prefix="ferrum-vad")


def _after_fork_in_child() -> None:
    """A forked process (multiprocessing's default on Linux) has none of its parent's threads:
    the pool it would inherit waits on workers that are not there, and the lock may be held by one."""
    global _MODEL_LOCK
    _readers.cache_clear()
    _MODEL_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def speech_probabilities(samples: np.ndarray, streams: int = 128) -> np.ndarray:
    """One speech probability per 32 ms frame."""
    return speech_probabilities_many([samples], streams)[0]


def speech_probabilities_many(inputs: list[np.ndarray], streams: int = 128, readers: int = 0) -> list[np.ndarray]:
    """speech_probabilities of each input, all in one batch of streams.

    A clip of a few seconds is only a few streams, so alone it runs a hundred steps of the
    model for little work; clips side by side share those steps. Each input is laid out in
    streams exactly as it would be alone.

    readers: threads the streams are shared out among, each stepping a Silero of its own on one
    core; 0: as many as torch's threads here (up to MAX_READERS), for a caller whose other cores
    wait for the result (a file's engine). A live stream's planner, which runs beside the engine,
    passes 1.
    """
    import torch

    inputs = [raised_for_vad(samples) for samples in inputs]  # gain never decides what is speech
    results = [np.zeros(0, np.float32) for _ in inputs]
    audible = [i for i, samples in enumerate(inputs) if len(samples)]
    if not audible:
        return results
    layouts = []  # per audible input: (frames, streams, frames per stream, first padded frame)
    parts, base = [], 0
    for i in audible:
        n_frames = -(-len(inputs[i]) // VAD_FRAME)
        count = max(1, min(streams, n_frames // MIN_STREAM_FRAMES or 1))
        per = -(-n_frames // count)
        padded = np.zeros((per * count + WARMUP_FRAMES) * VAD_FRAME, np.float32)
        padded[WARMUP_FRAMES * VAD_FRAME : WARMUP_FRAMES * VAD_FRAME + len(inputs[i])] = inputs[i]
        parts.append(padded)
        layouts.append((n_frames, count, per, base))
        base += per * count + WARMUP_FRAMES
    parts.append(np.zeros(VAD_FRAME, np.float32))  # frame `base`: what a stream reads once its input is over
    frames = torch.from_numpy(np.concatenate(parts)).view(-1, VAD_FRAME)
    steps = max(per + WARMUP_FRAMES for _, _, per, _ in layouts)
    step = torch.arange(steps)[None, :]
    # stream s of an input reads frames [s*per, s*per + per + WARMUP) of its padded audio; the warm-up is dropped
    index = torch.cat(
        [
            torch.where(step < per + WARMUP_FRAMES, start + torch.arange(count)[:, None] * per + step, base)
            for _, count, per, start in layouts
        ]
    )
    out = torch.zeros(index.shape[0], steps)
    heard = _streams_with_sound(frames, index)
    if len(heard):
        out[heard] = _stepped(frames, index[heard], readers)
    row = 0
    for i, (n_frames, count, per, _) in zip(audible, layouts):
        results[i] = out[row : row + count, WARMUP_FRAMES : WARMUP_FRAMES + per].reshape(-1)[:n_frames].numpy()
        row += count
    return results


def _streams_with_sound(frames, index):
    """The streams that read anything but zeros. One of digital silence, warm-up and all, is no
    speech (Silero reads it as under 0.01): a muted microphone or a padded recording costs nothing."""
    import torch

    return torch.nonzero((frames != 0).any(dim=1)[index].any(dim=1)).view(-1)


def _stepped(frames, index, readers: int):
    """Silero's probability at each (stream, step) of index, the streams shared out among readers."""
    import torch

    out = torch.empty(index.shape)
    threads = torch.get_num_threads()
    readers = max(1, min(readers or threads, MAX_READERS, index.shape[0]))
    edges = [index.shape[0] * k // readers for k in range(readers + 1)]
    with _MODEL_LOCK:  # each model carries its streams' state from step to step: one caller at a time
        helpers = [
            _readers().submit(_step_streams, k, frames, index[a:b], out[a:b], threads)
            for k, (a, b) in enumerate(zip(edges[1:-1], edges[2:]), start=1)
        ]
        try:
            _step_streams(0, frames, index[: edges[1]], out[: edges[1]], threads)
        finally:
            wait(helpers)  # none still steps its model once the lock is let go, even after an error
        for helper in helpers:
            helper.result()
    return out


def _step_streams(reader: int, frames, index, out, threads: int) -> None:
    """Silero `reader` over its streams: out[:, s] from the frames index[:, s], step by step."""
    import torch

    # TorchScript's profiling executor spends the first calls profiling the graph; a file of a
    # few seconds is over before that pays off, and a long one runs no faster with it
    with single_threaded(after=threads), torch.no_grad(), torch.jit.optimized_execution(False):
        model = _model(reader)
        model.reset_states()
        for s in range(index.shape[1]):
            out[:, s] = model(frames[index[:, s]], SAMPLE_RATE).view(-1)


def _regions(probs: list[float], n_samples: int, options: VadOptions, pad_ms: int) -> list[tuple[int, int]]:
    if not probs:
        return []
    stamps = _silero().get_speech_timestamps_from_probs(
        probs, sampling_rate=SAMPLE_RATE, audio_length_samples=n_samples, **{**asdict(options), "speech_pad_ms": pad_ms}
    )
    return [(int(s["start"]), int(s["end"])) for s in stamps]


def regions_from_probabilities(
    probs: list[float], n_samples: int, options: VadOptions, padded: bool = False
) -> list[tuple[int, int]]:
    """The speech regions of frame probabilities computed already (a live stream's, SpeechFrames'):
    unpadded, or padded by speech_pad_ms as speech_regions pads them."""
    return _regions(probs, n_samples, options, options.speech_pad_ms if padded else 0)


def speech_regions(samples: np.ndarray, options: VadOptions | None = None) -> list[tuple[int, int]]:
    """(start, end) sample ranges of speech, padded by speech_pad_ms on each side."""
    options = options or VadOptions()
    return regions_from_probabilities(speech_probabilities(samples).tolist(), len(samples), options, padded=True)


def speech_regions_and_core(
    samples: np.ndarray, options: VadOptions
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """speech_regions, and the speech itself (no padding), from one pass of the model."""
    return _padded_and_core(speech_probabilities(samples), len(samples), options)


def speech_regions_blockwise(
    samples: np.ndarray, options: VadOptions, block_seconds: float = 240.0
) -> list[tuple[int, int]]:
    """speech_regions of a long input read a block at a time (with a few seconds either side for
    the level and Silero's state), so that what the VAD reads is never the whole input at once."""
    block = int(block_seconds * SAMPLE_RATE) // VAD_FRAME * VAD_FRAME
    context = 64 * VAD_FRAME  # 2 s
    probs = []
    for start in range(0, len(samples), block):
        lo, hi = max(0, start - context), min(len(samples), start + block + context)
        frames = speech_probabilities(np.asarray(samples[lo:hi], np.float32))
        release_pages(samples)
        first = (start - lo) // VAD_FRAME
        probs.append(frames[first : first + -(-min(block, len(samples) - start) // VAD_FRAME)])
    frames = np.concatenate(probs).tolist() if probs else []
    return regions_from_probabilities(frames, len(samples), options, padded=True)


def speech_regions_and_core_many(
    inputs: list[np.ndarray], options: VadOptions | None = None
) -> list[tuple[list[tuple[int, int]], list[tuple[int, int]]]]:
    """Per input, its padded regions and the speech itself (no padding), the model run once over all."""
    return [(regions, core) for regions, core, _ in speech_found_many(inputs, options)]


def speech_found_many(
    inputs: list[np.ndarray], options: VadOptions | None = None
) -> list[tuple[list[tuple[int, int]], list[tuple[int, int]], np.ndarray]]:
    """speech_regions_and_core_many, with each input's frame probabilities as well (SpeechFrames
    keeps them for a later reader of the same audio with thresholds of its own)."""
    options = options or VadOptions()
    return [
        (*_padded_and_core(probs, len(samples), options), probs)
        for samples, probs in zip(inputs, speech_probabilities_many(inputs))
    ]


class SpeechFrames:
    """Silero's probabilities over a whole input, gathered from the blocks a planner read it in:
    one per 32 ms frame from its first sample. Only blocks that start on a frame of the input
    count: a block that starts between two frames reads other stretches of 512 samples, whose
    probabilities differ (speech edges move by a frame). Where blocks overlap the earlier one's
    are kept, read with more of the audio before them (Silero reads forwards only)."""

    def __init__(self) -> None:
        self._parts: list[np.ndarray] = []
        self.frames = 0  # frames gathered so far, from the input's first
        self.on_grid = True  # every block started on a frame of the input

    def add(self, first_sample: int, probs: np.ndarray) -> None:
        """The probabilities of a block whose first frame starts at first_sample."""
        first, between = divmod(first_sample, VAD_FRAME)
        if between or first > self.frames:
            self.on_grid = False
        if not self.on_grid:
            return
        new = np.asarray(probs[self.frames - first :], np.float32)
        self._parts.append(new)
        self.frames += len(new)

    def covering(self, n_samples: int) -> np.ndarray | None:
        """The probabilities of an input of n_samples; None where the blocks miss some of it or
        one fell between frames (the reader then runs VAD itself)."""
        wanted = -(-n_samples // VAD_FRAME)
        if not self.on_grid or self.frames < wanted:
            return None
        return np.concatenate(self._parts)[:wanted] if self._parts else np.zeros(0, np.float32)


def _padded_and_core(
    probs: np.ndarray, length: int, options: VadOptions
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    frames = probs.tolist()
    return _regions(frames, length, options, options.speech_pad_ms), _regions(frames, length, options, 0)


def _covered(core: list[tuple[int, int]], start: int, end: int) -> np.ndarray:
    """Which samples of [start, end) are speech, by regions that may overlap (blocks are planned with overlap)."""
    covered = np.zeros(max(end - start, 0), dtype=bool)
    for a, b in core:
        if a < end and b > start:
            covered[max(a, start) - start : min(b, end) - start] = True
    return covered


def speech_within(core: list[tuple[int, int]], start: int, end: int) -> int:
    """Samples of speech in [start, end)."""
    return int(np.count_nonzero(_covered(core, start, end)))


def speech_after(core: list[tuple[int, int]], start: int, end: int, step: int) -> np.ndarray:
    """Samples of speech in [start + k * step, end), for each k with start + k * step < end."""
    covered = _covered(core, start, end)
    padded = np.zeros(-(-len(covered) // step) * step, dtype=bool)
    padded[: len(covered)] = covered
    per_step = padded.reshape(-1, step).sum(axis=1)
    return np.cumsum(per_step[::-1])[::-1]
