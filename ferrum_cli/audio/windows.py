"""Windows of speech of at most 30 s, planned from a stream: what the batched engine decodes.

Voice activity detection finds the speech; regions less than 5 s apart are packed together,
and a span longer than 30 s is cut in its deepest pause, so that no window starts inside a
sentence. Quiet speech in a window is raised to a normal level (level.raised_spans).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from ..options import VadOptions
from .constants import PAUSE_FRAME, SAMPLE_RATE, VAD_FRAME, WINDOW_SAMPLES
from .level import raised_spans
from .vad import SpeechFrames, speech_found_many

BLOCK = 240 * SAMPLE_RATE  # audio read ahead to plan windows; bounds memory on any length
LEADING_SILENCE = 2 * SAMPLE_RATE  # more than this before the first padded speech is not read: Whisper misdates past it


def quietest_cut(samples: np.ndarray, lo: int, hi: int, pause_frames: int = 25) -> int:
    """Sample index in [lo, hi) in the middle of the last half second that is as quiet as the
    deepest pause there (within 6 dB).

    A window that starts inside a sentence can make Whisper skip that sentence's start, so a
    cut must fall in a real pause, not in the short dip between two words. Of equally deep
    pauses the last one is taken: fuller windows mean fewer of them to encode and decode.
    """
    region = samples[lo:hi]
    n = len(region) // PAUSE_FRAME
    if n == 0:
        return hi
    energy = np.square(region[: n * PAUSE_FRAME].reshape(n, PAUSE_FRAME)).mean(axis=1)
    width = min(pause_frames, n)
    smoothed = np.convolve(energy, np.ones(width) / width, mode="valid")
    deepest = float(smoothed.min())
    # within 6 dB of the deepest, or 80 dB under the loudest: never an absolute level, which quiet audio lies under
    last = int(np.flatnonzero(smoothed <= max(deepest * 4, float(smoothed.max()) * 1e-8))[-1])
    return lo + (last + width // 2) * PAUSE_FRAME + PAUSE_FRAME // 2


def pack(samples: np.ndarray, regions: list[tuple[int, int]], merge: bool) -> list[tuple[int, int]]:
    """Speech regions packed into windows of at most 30 s; a longer region is cut at its quietest point."""
    spans: list[tuple[int, int]] = []  # with merge, regions less than 5 s apart are one span
    for start, end in regions:
        if merge and spans and start - spans[-1][1] < 5 * SAMPLE_RATE:
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((start, end))
    windows: list[tuple[int, int]] = []
    for start, end in spans:
        while end - start > WINDOW_SAMPLES:
            cut = quietest_cut(samples, start + WINDOW_SAMPLES // 3, start + WINDOW_SAMPLES)
            windows.append((start, cut))
            start = cut
        windows.append((start, end))
    return windows


def first_read(regions: list[tuple[int, int]]) -> int:
    """The sample an input's reading begins at: its first, or its padded speech (regions[0]) where
    that begins past LEADING_SILENCE, since Whisper dates the first words to the window's start."""
    return regions[0][0] if regions and regions[0][0] > LEADING_SILENCE else 0


def _speech(
    buffers: list[np.ndarray], vad: bool, vad_options: VadOptions
) -> list[tuple[list[tuple[int, int]], list[tuple[int, int]], np.ndarray | None]]:
    """VAD's padded regions, unpadded speech and frame probabilities in each buffer; without VAD
    all sound is speech, and no probabilities."""
    if vad:
        return speech_found_many(buffers, vad_options)
    return [([(0, len(b))] if len(b) else [], [], None) for b in buffers]


def plan_whole(
    clips: list[np.ndarray], vad: bool, vad_options: VadOptions, merge: bool = True
) -> list[tuple[list[tuple[float, np.ndarray]], list[tuple[int, int]], np.ndarray | None]]:
    """For inputs read whole: the (offset seconds, samples) windows, the unpadded speech regions
    and VAD's frame probabilities (None without VAD) of each, with one VAD pass over all of them
    (see vad.speech_probabilities_many).

    An input of at most 30 s with speech in it is one window to its last sample, as openai-whisper
    reads it, from its first sample unless more than LEADING_SILENCE passes before the speech:
    then Whisper dates the first words to the window's start and may read them twice, so the
    window opens where the padded speech does, as a long input's would (docs/performance.md).
    """
    planned = []
    for clip, (regions, core, probs) in zip(clips, _speech(clips, vad, vad_options)):
        if merge and regions and len(clip) <= WINDOW_SAMPLES:
            spans = [(first_read(regions), len(clip))]
        else:
            spans = pack(clip, regions, merge)
        heard = raised_spans(clip, regions if vad else spans)
        planned.append(([(a / SAMPLE_RATE, heard[a:b]) for a, b in spans], core, probs))
    return planned


PACK_GAP = SAMPLE_RATE  # silence between short inputs side by side in one window


def side_by_side(lengths: list[int], gap: int = PACK_GAP) -> list[list[int]]:
    """Indices of windows (of `lengths` samples) put side by side, in order, `gap` apart, into
    windows of at most 30 s: a short input alone costs a whole 30 s of encoding."""
    packs: list[list[int]] = []
    filled = WINDOW_SAMPLES + 1
    for i, length in enumerate(lengths):
        if filled + gap + length > WINDOW_SAMPLES:
            packs.append([])
            filled = -gap
        packs[-1].append(i)
        filled += gap + length
    return packs


def plan_windows(
    chunks: Iterable[np.ndarray],
    vad: bool,
    vad_options: VadOptions,
    merge: bool = True,
    speech: list[tuple[int, int]] | None = None,
    frames: SpeechFrames | None = None,
) -> Iterator[tuple[float, np.ndarray]]:
    """(offset seconds, samples) windows of speech of at most 30 s, planned block by block from a stream.

    The last window of a block may go on in the next one, so it is carried over unless the
    speech in it ended more than a second before the block did. With VAD, `speech` receives
    the unpadded speech regions found (absolute sample ranges, overlapping across blocks), and
    `frames` the frame probabilities.
    """
    buffer = np.zeros(0, np.float32)
    offset = 0  # absolute sample index of buffer[0]
    chunks = iter(chunks)
    unread: np.ndarray | None = None  # the part of a chunk past the last block
    exhausted = False
    while not exhausted:
        # BLOCK new samples exactly, however the input comes in chunks (a file's, or bytes decoded
        # whole): where blocks end moves the windows, and so the text
        parts, wanted = [buffer], BLOCK
        while wanted:
            chunk = unread if unread is not None else next(chunks, None)
            unread = None
            if chunk is None:
                exhausted = True
                break
            if len(chunk) > wanted:
                chunk, unread = chunk[:wanted], chunk[wanted:]
            parts.append(chunk)
            wanted -= len(chunk)
        buffer = np.concatenate(parts)
        if len(buffer) == 0:
            return
        ((regions, core, probs),) = _speech([buffer], vad, vad_options)
        if speech is not None:
            speech.extend((offset + a, offset + b) for a, b in core)
        if frames is not None and probs is not None:
            frames.add(offset, probs)
        windows = pack(buffer, regions, merge)
        keep_from = len(buffer)
        if not exhausted:
            keep_from = max(len(buffer) - SAMPLE_RATE, 0)
            if windows and len(buffer) - windows[-1][1] <= SAMPLE_RATE:
                keep_from = windows.pop()[0]
            elif windows:
                keep_from = max(keep_from, windows[-1][1])
        heard = raised_spans(buffer, regions if vad else windows)  # a copy: the carried-over buffer stays as read
        for start, end in windows:
            yield (offset + start) / SAMPLE_RATE, heard[start:end]
        keep_from -= keep_from % VAD_FRAME  # the next block starts on a frame of the input (vad.SpeechFrames)
        buffer, offset = buffer[keep_from:], offset + keep_from
