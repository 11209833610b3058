"""Audio in: find ffmpeg, decode any input to 16 kHz mono float32, stream long files."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from .errors import AudioDecodeError, FFmpegNotFoundError, InputError

SAMPLE_RATE = 16000


@dataclass(frozen=True)
class FFmpegInfo:
    path: str
    source: str  # "FERRUM_FFMPEG", "PATH" or "imageio-ffmpeg"


@lru_cache(maxsize=1)
def find_ffmpeg() -> FFmpegInfo:
    """FERRUM_FFMPEG, then PATH, then the static binary that imageio-ffmpeg ships."""
    override = os.environ.get("FERRUM_FFMPEG")
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise FFmpegNotFoundError(f"FERRUM_FFMPEG={override!r} is not an executable file")
        return FFmpegInfo(override, "FERRUM_FFMPEG")
    on_path = shutil.which("ffmpeg")
    if on_path:
        return FFmpegInfo(on_path, "PATH")
    try:
        import imageio_ffmpeg

        return FFmpegInfo(imageio_ffmpeg.get_ffmpeg_exe(), "imageio-ffmpeg")
    except Exception as exc:  # imageio-ffmpeg raises RuntimeError when its binary is missing
        raise FFmpegNotFoundError(
            f"ffmpeg not found on PATH and imageio-ffmpeg has none ({exc}); "
            "install ffmpeg or set FERRUM_FFMPEG"
        ) from None


def ffmpeg_version() -> str:
    out = subprocess.run(
        [find_ffmpeg().path, "-version"], capture_output=True, text=True, check=False
    ).stdout
    first = out.splitlines()[0] if out else ""
    return first.split(" version ")[1].split()[0] if " version " in first else "unknown"


def _decode_args(source: str, start: float | None = None) -> list[str]:
    """ffmpeg's argument list, built with ffmpeg-python and never passed to a shell."""
    import ffmpeg

    in_kwargs = {"ss": f"{start:.3f}"} if start else {}
    stream = ffmpeg.input(source, **in_kwargs).output(
        "pipe:", format="f32le", acodec="pcm_f32le", ac=1, ar=SAMPLE_RATE
    )
    return stream.global_args("-nostdin", "-hide_banner", "-v", "error").compile(
        cmd=find_ffmpeg().path
    )


def _reason(stderr: str, source: str) -> str:
    """ffmpeg's own last complaint, without the input name it repeats."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    if not lines:
        return "ffmpeg produced no audio"
    line = lines[-1]
    for prefix in (source + ": ", "pipe:0: ", "pipe:: "):
        if line.startswith(prefix):
            line = line[len(prefix) :]
    if "does not contain any stream" in line or "matches no streams" in line:
        return "no audio stream"
    return line


def _check_readable(path: Path) -> None:
    if not path.exists():
        raise InputError("no such file")
    if path.is_dir():
        raise InputError("is a directory")
    if not os.access(path, os.R_OK):
        raise InputError("permission denied")
    if path.stat().st_size == 0:
        raise AudioDecodeError("empty file")


@dataclass
class DecodedAudio:
    samples: np.ndarray  # float32, mono, 16 kHz
    warning: str | None = None  # set when ffmpeg complained but audio came out (truncated input)

    @property
    def duration(self) -> float:
        return len(self.samples) / SAMPLE_RATE


def _run_decoder(args: list[str], source: str, data: bytes | None) -> DecodedAudio:
    proc = subprocess.run(
        args,
        input=data,
        stdin=None if data is not None else subprocess.DEVNULL,
        capture_output=True,
        check=False,
    )
    stderr = proc.stderr.decode("utf-8", "replace")
    out = proc.stdout[: len(proc.stdout) - len(proc.stdout) % 4]
    samples = np.frombuffer(out, np.float32)
    if samples.size == 0:
        raise AudioDecodeError(_reason(stderr, source) if stderr.strip() else "no audio decoded")
    warning = _reason(stderr, source) if (proc.returncode != 0 or stderr.strip()) else None
    return DecodedAudio(samples.copy(), warning)


def decode_file(path: str | os.PathLike[str]) -> DecodedAudio:
    p = Path(path)
    _check_readable(p)
    source = os.path.abspath(p)  # an absolute name can never read as an ffmpeg option
    return _run_decoder(_decode_args(source), source, None)


def decode_bytes(data: bytes) -> DecodedAudio:
    """Bytes go to ffmpeg on stdin: no temp file."""
    if not data:
        raise AudioDecodeError("empty input")
    return _run_decoder(_decode_args("pipe:0"), "pipe:0", data)


def stream_file(path: str | os.PathLike[str], chunk_seconds: float = 30.0) -> Iterator[np.ndarray]:
    """Yields float32 chunks as ffmpeg produces them, so memory does not grow with length."""
    p = Path(path)
    _check_readable(p)
    source = os.path.abspath(p)
    proc = subprocess.Popen(
        _decode_args(source),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    chunk_bytes = int(chunk_seconds * SAMPLE_RATE) * 4
    got_any = False
    try:
        assert proc.stdout is not None
        while True:
            buf = proc.stdout.read(chunk_bytes)
            if not buf:
                break
            usable = len(buf) - len(buf) % 4
            got_any = True
            yield np.frombuffer(buf[:usable], np.float32).copy()
    finally:
        if proc.poll() is None:
            proc.kill()
        stderr = proc.stderr.read().decode("utf-8", "replace") if proc.stderr else ""
        proc.wait()
    if not got_any:
        raise AudioDecodeError(_reason(stderr, source))


def log_mel(samples: np.ndarray, n_mels: int = 80, padding: int = 0):
    """openai-whisper's log-mel, so features match its model exactly."""
    import torch
    from whisper.audio import log_mel_spectrogram

    return log_mel_spectrogram(torch.from_numpy(samples), n_mels=n_mels, padding=padding)
