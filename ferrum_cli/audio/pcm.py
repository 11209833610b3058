"""Raw audio to Whisper's 16 kHz float32: as realtime clients send it, piece by piece (16-bit PCM
at any rate, and G.711 μ-law and A-law, 8 kHz telephony), and as a library caller hands it over
(a numpy array). soxr resamples with a stream's state kept between pieces, so that a piece's
edges are not heard as clicks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError, UsageError
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


def samples_of(array: np.ndarray) -> np.ndarray:
    """A caller's samples at 16 kHz as the engine reads them: float32, one channel, full scale 1.

    Integer samples are PCM (int16 from scipy.io.wavfile, say) and are scaled as a WAV's are;
    read as floats they were thousands of times full scale, and Whisper gave other words. Float
    samples above full scale (int16 values cast to float, say) are scaled down to it, for the
    same reason. Several channels, NaN, and arrays that are not audio are an InputError, never
    a guess."""
    if not isinstance(array, np.ndarray):
        raise InputError(f"audio samples must be a numpy array, not {type(array).__name__}")
    if array.ndim == 2 and 1 in array.shape:
        array = array.reshape(-1)
    if array.ndim != 1:
        raise InputError(
            f"audio samples must be one channel, an array of one dimension, not of shape {array.shape}: "
            "average the channels first"
        )
    if np.issubdtype(array.dtype, np.signedinteger) or array.dtype == np.uint8:
        bits = array.dtype.itemsize * 8
        centre = 128 if array.dtype == np.uint8 else 0  # 8-bit WAV samples are unsigned
        return ((array.astype(np.float64) - centre) / 2 ** (bits - 1)).astype(np.float32)
    if not np.issubdtype(array.dtype, np.floating):
        raise InputError(f"audio samples must be floats or PCM integers, not {array.dtype}")
    samples = np.asarray(array, dtype=np.float32)
    if not np.isfinite(samples).all():
        raise InputError("audio samples must be finite numbers; these hold NaN or infinity")
    peak = float(np.abs(samples).max(initial=0.0))
    return samples / peak if peak > 1.0 else samples
