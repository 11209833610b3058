"""Raw audio as realtime clients send it, to Whisper's 16 kHz float32, piece by piece: 16-bit PCM
at any rate, and G.711 μ-law and A-law (8 kHz telephony). soxr resamples with a stream's state
kept between pieces, so that a piece's edges are not heard as clicks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UsageError
from .constants import SAMPLE_RATE


def _ulaw_table() -> np.ndarray:
    """ITU-T G.711 μ-law: each byte's 16-bit value."""
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent, mantissa = (u >> 4) & 0x07, u & 0x0F
    magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
    return np.where(u & 0x80, -magnitude, magnitude).astype(np.float32) / 32768.0


def _alaw_table() -> np.ndarray:
    """ITU-T G.711 A-law: each byte's 16-bit value."""
    a = np.arange(256, dtype=np.int32) ^ 0x55
    exponent, mantissa = (a >> 4) & 0x07, a & 0x0F
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    return np.where(a & 0x80, magnitude, -magnitude).astype(np.float32) / 32768.0


G711 = {"pcmu": _ulaw_table(), "pcma": _alaw_table()}


@dataclass(frozen=True)
class PcmFormat:
    """What the bytes are."""

    encoding: str = "pcm16"  # pcm16 (little-endian), pcmu (μ-law) or pcma (A-law)
    rate: int = 24000  # samples per second; G.711 is always 8000

    @property
    def bytes_per_sample(self) -> int:
        return 2 if self.encoding == "pcm16" else 1


class PcmDecoder:
    """Bytes of one format in, 16 kHz mono float32 out, as they come; a piece may end mid-sample."""

    def __init__(self, fmt: PcmFormat) -> None:
        if fmt.encoding not in ("pcm16", *G711):
            raise UsageError(f"unknown PCM encoding {fmt.encoding!r}")
        self.format, self._pending = fmt, b""
        self._resampler = None
        if fmt.rate != SAMPLE_RATE:
            import soxr

            self._resampler = soxr.ResampleStream(fmt.rate, SAMPLE_RATE, 1, dtype="float32", quality="HQ")

    def decode(self, data: bytes) -> np.ndarray:
        data = self._pending + data
        usable = len(data) - len(data) % self.format.bytes_per_sample
        self._pending = data[usable:]
        if self.format.encoding == "pcm16":
            samples = np.frombuffer(data[:usable], "<i2").astype(np.float32) / 32768.0
        else:
            samples = G711[self.format.encoding][np.frombuffer(data[:usable], np.uint8)]
        if self._resampler is None:
            return samples
        return self._resampler.resample_chunk(samples)

    def flush(self) -> np.ndarray:
        """What the resampler still holds back; the decoder is ready for a new stream after it."""
        self._pending = b""
        if self._resampler is None:
            return np.zeros(0, np.float32)
        rest = self._resampler.resample_chunk(np.zeros(0, np.float32), last=True)
        self._resampler.clear()
        return rest
