"""An input's audio kept on disk as it streams past the engine, for a stage that needs all of it
at the end (diarization): memory stays flat however long the input is."""

from __future__ import annotations

import mmap
import tempfile
from collections.abc import Callable, Iterable, Iterator

import numpy as np


class AudioSpool:
    """float32 samples appended to an unlinked temporary file; samples() maps them back."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile(prefix="ferrum-audio-")
        self.count = 0  # samples written

    def tap(self, open_audio: Callable[[], Iterable[np.ndarray]]) -> Callable[[], Iterable[np.ndarray]]:
        """The same opener, whose chunks are also written here as the engine reads them."""

        def opened() -> Iterable[np.ndarray]:
            chunks = open_audio()
            return _Tapped(chunks, self)

        return opened

    def write(self, chunk: np.ndarray) -> None:
        self._file.write(np.ascontiguousarray(chunk, dtype=np.float32).tobytes())
        self.count += len(chunk)

    def samples(self) -> np.ndarray:
        """Every sample written, mapped from the file (read-only); empty when there were none."""
        if not self.count:
            return np.zeros(0, np.float32)
        self._file.flush()
        return np.memmap(self._file, dtype=np.float32, mode="r", shape=(self.count,))

    def close(self) -> None:
        self._file.close()


def release_pages(samples: np.ndarray) -> None:
    """Drop the pages of spooled samples that a pass has read from this process's memory: they
    are the file's, and come back from the page cache if read again. Without this a pass over an
    hour counts all of its audio (230 MB) in the process's resident memory. Other arrays: nothing."""
    base = samples
    while base is not None and not isinstance(base, mmap.mmap):
        base = getattr(base, "base", None)
    if base is not None and hasattr(mmap, "MADV_DONTNEED"):
        base.madvise(mmap.MADV_DONTNEED)


class _Tapped:
    """Chunks passed through to the engine and copied to the spool; the stream's own attributes
    (a decoder's warning, close) are the stream's."""

    def __init__(self, chunks: Iterable[np.ndarray], spool: AudioSpool) -> None:
        self._chunks, self._spool = chunks, spool

    def __iter__(self) -> Iterator[np.ndarray]:
        for chunk in self._chunks:
            self._spool.write(chunk)
            yield chunk

    def __getattr__(self, name: str):
        return getattr(self._chunks, name)
