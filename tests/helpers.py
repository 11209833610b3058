"""What the tests share: the corpus in ../shared, the real `ferrum` executable, audio built in
code, word error counts, and the diarization error rate (pyannote.metrics)."""

from __future__ import annotations

import csv
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "corpus"
SAMPLE = ROOT / "samples" / "librivox_sense_and_sensibility.wav"
FERRUM = shutil.which("ferrum", path=str(Path(sys.executable).parent)) or "ferrum"


def corpus_rows() -> list[dict]:
    if not (CORPUS / "manifest.tsv").exists():
        return []
    with open(CORPUS / "manifest.tsv", encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    for row in rows:
        row["path"] = str(CORPUS / row["file"])
    return rows


def english_rows() -> list[dict]:
    """The corpus's English clips that have a reference transcript."""
    return [r for r in corpus_rows() if r["language"] == "en" and r["reference_transcript"] != "none"]


needs_corpus = pytest.mark.skipif(
    not (CORPUS / "manifest.tsv").exists(), reason=f"the shared corpus is absent ({CORPUS}); CI has it"
)


def corpus(name: str) -> Path:
    path = CORPUS / name
    if not path.exists():
        pytest.skip(f"the shared corpus is absent ({CORPUS}); CI has it")
    return path


JFK = "en_jfk_inaugural_1961.flac"

# writes a 16-bit 16 kHz mono WAV file (argv[1]) to stdout at argv[2] times real time, 0.1 s a write
PACER = r"""
import sys, time
data = open(sys.argv[1], "rb").read()
rate = 32000 * float(sys.argv[2])  # bytes per second of 16-bit 16 kHz mono, sped up
step, start, out = int(rate / 10), time.monotonic(), sys.stdout.buffer
for i in range(0, len(data), step):
    out.write(data[i : i + step])
    out.flush()
    time.sleep(max(0.0, start + (i + step) / rate - time.monotonic()))
"""


def run_ferrum(
    *args: str, stdin: bytes | None = None, cwd: Path | None = None, timeout: float = 600, env: dict | None = None
):
    """The real executable in a subprocess; returns CompletedProcess with text stdout/stderr."""
    proc = subprocess.run(
        [FERRUM, *args],
        input=stdin if stdin is not None else b"",
        capture_output=True,
        cwd=cwd,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    proc.stdout = proc.stdout.decode("utf-8", "replace")
    proc.stderr = proc.stderr.decode("utf-8", "replace")
    return proc


def summary_counts(stderr: str) -> tuple[int, int, int]:
    """(done, skipped, failed) from `ferrum transcribe`'s summary table."""
    row = next(line for line in stderr.splitlines() if re.match(r"^│\s+\d+\s+│", line))
    done, skipped, failed = (int(x) for x in re.findall(r"│\s+(\d+)\s+(?=│)", row)[:3])
    return done, skipped, failed


def as_from_a_terminal() -> None:
    """preexec_fn for a ferrum that a test interrupts: Ctrl-C and SIGHUP as a terminal leaves
    them. A run started in the background of a script, or under nohup, inherits them ignored."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def run_ferrum_on_a_terminal(*args: str):
    """The real executable with stderr on a pseudo-terminal, where rich draws its progress, and
    stdout a pipe; returns CompletedProcess with text stdout and stderr (the terminal's bytes)."""
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen([FERRUM, *args], stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the process closed its side
            break
        if not chunk:
            break
        seen += chunk
    stdout = proc.communicate()[0]
    os.close(master)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout.decode(), seen.decode("utf-8", "replace"))


def free_port() -> int:
    """A loopback port that nothing listens on (closed again before it is returned)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wav_bytes(samples, sample_rate: int = 16000, channels: int = 1) -> bytes:
    """16-bit WAV of float samples, for audio a test builds; each channel the same."""
    import io
    import wave

    import numpy as np

    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as w:
        w.setnchannels(channels), w.setsampwidth(2), w.setframerate(sample_rate)
        frames = np.repeat(np.clip(samples, -1, 1)[:, None], channels, axis=1)
        w.writeframes((frames * 32767).astype(np.int16).tobytes())
    return buffer.getvalue()


def float_wav_bytes(samples, sample_rate: int = 16000) -> bytes:
    """32-bit float mono WAV: audio scaled in code keeps its detail at any level, as a 24-bit
    recording would, instead of losing it to 16-bit steps."""
    import struct

    import numpy as np

    data = np.asarray(samples, "<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, sample_rate, 4 * sample_rate, 4, 32)  # 3: IEEE float
    header = b"WAVEfmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data))
    return b"RIFF" + struct.pack("<I", len(header) + len(data)) + header + data


def errors_against(reference: str, hypothesis: str, language: str) -> int:
    """Word errors (substitutions, insertions, deletions) after openai-whisper's normalizer for the language."""
    from whisper.normalizers import BasicTextNormalizer, EnglishTextNormalizer

    normalize = EnglishTextNormalizer() if language == "en" else BasicTextNormalizer()
    ref, hyp = normalize(reference).split(), normalize(hypothesis).split()
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1]


def joined_clips(names: list[str], gap_seconds: float = 2.0):
    """Corpus clips one after another with silence between: (float32 16 kHz samples, each clip's
    (start, end) in seconds), a stand-in for someone speaking with pauses."""
    import numpy as np

    from ferrum_cli.audio.ffmpeg import decode_file

    parts, spans, at = [], [], 0.0
    gap = np.zeros(int(gap_seconds * 16000), np.float32)
    for name in names:
        clip = decode_file(corpus(name)).samples
        spans.append((at, at + len(clip) / 16000))
        parts += [clip, gap]
        at += (len(clip) + len(gap)) / 16000
    return np.concatenate(parts), spans


def clip_text(segments, span: tuple[float, float]) -> str:
    """The text of the segments (dicts with start, end, text) centred within span."""
    return " ".join(s["text"] for s in segments if span[0] <= (s["start"] + s["end"]) / 2 < span[1])


def words(text: str) -> str:
    """openai-whisper's English normalizer, so tests compare words and not punctuation."""
    from whisper.normalizers import EnglishTextNormalizer

    return EnglishTextNormalizer()(text)


def rttm_annotation(rttm: str, uri: str):
    """One file's turns in an RTTM, as pyannote.core's Annotation."""
    from pyannote.core import Annotation
    from pyannote.core import Segment as Span

    turns = Annotation(uri=uri)
    for line in rttm.splitlines():
        parts = line.split()
        if parts and parts[0] == "SPEAKER" and parts[1] == uri:
            start, duration = float(parts[3]), float(parts[4])
            turns[Span(start, start + duration)] = parts[7]
    return turns


def diarization_error_rate(rttm: str, uri: str, collar: float = 0.5) -> float:
    """pyannote.metrics' DER; its collar is the whole width (0.5: ±0.25 s), overlaps scored."""
    from pyannote.core import Timeline
    from pyannote.metrics.diarization import DiarizationErrorRate

    reference = rttm_annotation((CORPUS / "diarization" / f"{uri}.rttm").read_text(), uri)
    hypothesis = rttm_annotation(rttm, uri)
    scored = Timeline([(reference.get_timeline() | hypothesis.get_timeline()).extent()])
    return DiarizationErrorRate(collar=collar, skip_overlap=False)(reference, hypothesis, uem=scored)


class RunningServer:
    """`ferrum serve` as a user starts it; stderr is kept for the checks on its log."""

    def __init__(self, *args: str, ready_timeout: float = 180, program: list[str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(f"/tmp/ferrum-serve-{self.port}.log")
        self.log_file = open(self.log, "w+b")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [*(program or [FERRUM]), "serve", "--port", str(self.port), *args],
            stdout=self.log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"ferrum serve exited: {self.output()}"
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise AssertionError(f"ferrum serve not ready in {ready_timeout} s: {self.output()}")

    def output(self) -> str:
        if not self.log_file.closed:
            self.log_file.flush()
        return self.log.read_text(errors="replace")

    def stop_cleanly(self) -> None:
        """Stop it as a user would; it must exit 0 with no traceback in its log."""
        code = self.stop()
        log = self.output()
        assert code == 0, log
        assert "Traceback" not in log, log

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(60)
        self.log_file.close()
        return code
