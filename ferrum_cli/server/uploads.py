"""An upload in: copied to disk as it is, decoded by ffmpeg to 16 kHz float32 on disk, and read
back in the chunks the CLI reads, so that the engine sees the same samples as `ferrum transcribe`.

On disk, not in memory: an upload is held whole nowhere, and the decoded audio's exact length
is known before the request is queued (the queue limit counts audio seconds).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from .. import SAMPLE_RATE, AudioStream
from ..errors import InputError, TooLargeError

CHUNK_SECONDS = 30.0  # as audio.ffmpeg.AudioStream's chunks
COPY_BYTES = 1 << 20


@dataclass
class DecodedUpload:
    """Decoded audio in an unlinked temp file: gone from disk when the last reader closes it."""

    file: BinaryIO
    seconds: float
    warnings: list[str]  # ffmpeg's (FFmpegLog.warnings): they reach the result as a file's do

    def __iter__(self) -> Iterator[np.ndarray]:
        """float32 chunks of CHUNK_SECONDS, from the start; a read error ends the input, not the engine."""
        size = int(CHUNK_SECONDS * SAMPLE_RATE) * 4
        offset = 0
        try:
            while data := os.pread(self.file.fileno(), size, offset):
                offset += len(data)
                yield np.frombuffer(data, np.float32).copy()
        except (OSError, ValueError) as exc:
            raise InputError(f"cannot read the decoded upload: {exc}") from None

    def close(self) -> None:
        self.file.close()


def decode_upload(upload: BinaryIO, folder: Path, max_seconds: float) -> DecodedUpload:
    """ffmpeg reads a copy of the upload from disk (it can seek, as containers like m4a need);
    decoding stops as soon as the audio passes max_seconds."""
    with tempfile.NamedTemporaryFile(dir=folder, prefix="upload-", delete=False) as copy:
        shutil.copyfileobj(upload, copy, COPY_BYTES)
    pcm = tempfile.TemporaryFile(dir=folder, prefix="audio-")
    samples, limit, chunks = 0, int(max_seconds * SAMPLE_RATE), None
    try:
        stream = AudioStream(copy.name, CHUNK_SECONDS)
        chunks = iter(stream)
        for chunk in chunks:
            samples += len(chunk)
            if samples > limit:
                raise TooLargeError(f"the audio is longer than this server takes ({max_seconds:.0f} s)")
            pcm.write(chunk.tobytes())
        pcm.flush()
        return DecodedUpload(pcm, samples / SAMPLE_RATE, stream.warnings)
    except BaseException:
        pcm.close()
        raise
    finally:
        if chunks is not None:
            chunks.close()  # stops ffmpeg at once when decoding was cut short
        os.unlink(copy.name)
