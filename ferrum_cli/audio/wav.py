"""WAV files that already hold what Whisper reads (16 kHz, 16-bit PCM, mono or stereo) are read
here rather than by ffmpeg: starting ffmpeg costs each file tens of milliseconds of CPU, most of
what reading a short clip costs (docs/performance.md). The samples are ffmpeg's to the bit: it
converts 16-bit samples to float as x / 32768 and, at the same rate, does nothing else.
Anything else (another rate or sample format, a data size left unwritten) goes to ffmpeg. A
file shorter than its header says is read as far as it goes, and says so (ffmpeg does not)."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .constants import SAMPLE_RATE

PCM = 1
EXTENSIBLE = 0xFFFE  # WAVE_FORMAT_EXTENSIBLE: the format is the first two bytes of its sub-format GUID
UNWRITTEN = 0xFFFFFFFF  # the data size of a WAV written to a pipe: the samples run to the end
GUID_TAIL = bytes.fromhex("000000001000800000aa00389b71")  # the rest of KSDATAFORMAT_SUBTYPE_PCM's GUID
PLAIN_MASKS = {1: 0x4, 2: 0x3}  # front centre; front left and right
SCALE = np.float32(1 / 32768)


@dataclass(frozen=True)
class PlainWav:
    """Where the samples of a plain WAV file are."""

    offset: int  # the byte at which the first sample starts
    frames: int  # samples per channel in the file
    channels: int  # 1 or 2
    declared_frames: int  # as many as the header says: more than `frames` in a file cut short


def plain_wav(path: str | os.PathLike[str]) -> PlainWav | None:
    """The layout of a file that is a 16 kHz 16-bit PCM WAV of one or two channels with a data
    size written; None for anything else."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(12)
            if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
                return None
            channels = None
            while len(chunk := f.read(8)) == 8:
                kind, length = chunk[:4], struct.unpack("<I", chunk[4:])[0]
                if kind == b"fmt ":
                    channels = _plain_channels(f.read(length))
                    if channels is None:
                        return None
                    f.seek(length & 1, os.SEEK_CUR)
                elif kind == b"data":
                    if not channels or length in (0, UNWRITTEN):
                        return None  # no format before the data, or a size its writer never filled in
                    offset = f.tell()
                    frames = min(length, size - offset) // (2 * channels)
                    return PlainWav(offset, frames, channels, length // (2 * channels)) if frames else None
                else:
                    f.seek(length + (length & 1), os.SEEK_CUR)
    except OSError:
        return None
    return None


def _plain_channels(fmt: bytes) -> int | None:
    """The channel count of a fmt chunk that describes 16 kHz 16-bit PCM in 1 or 2 channels."""
    if len(fmt) < 16:
        return None
    tag, channels, rate, byte_rate, block_align, bits = struct.unpack("<HHIIHH", fmt[:16])
    if tag == EXTENSIBLE:  # taken with all 16 bits valid and the usual speakers, which ffmpeg reads as they are
        if len(fmt) < 40 or fmt[26:40] != GUID_TAIL:
            return None
        valid_bits, mask, tag = struct.unpack("<HIH", fmt[18:26])
        if valid_bits != 16 or mask != PLAIN_MASKS.get(channels):
            return None
    plain = tag == PCM and bits == 16 and rate == SAMPLE_RATE and channels in (1, 2)
    if not plain or block_align != 2 * channels or byte_rate != SAMPLE_RATE * block_align:
        return None
    return channels


def read_plain_wav(path: str | os.PathLike[str], layout: PlainWav, chunk_frames: int) -> Iterator[np.ndarray]:
    """The samples as float32 frames [frames, channels], chunk_frames at a time."""
    with open(path, "rb") as f:
        f.seek(layout.offset)
        left = layout.frames
        while left > 0:
            n = min(chunk_frames, left)
            data = f.read(n * 2 * layout.channels)
            got = len(data) // (2 * layout.channels)
            if got == 0:
                return  # the file shrank while it was read
            ints = np.frombuffer(data[: got * 2 * layout.channels], "<i2")
            yield (ints.astype(np.float32) * SCALE).reshape(-1, layout.channels)
            left -= got
