"""Shared fixtures: the corpus in ../shared, a session model cache, the real `ferrum` executable."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "corpus"
SAMPLE = ROOT / "samples" / "sample.ogg"
FERRUM = shutil.which("ferrum", path=str(Path(sys.executable).parent)) or "ferrum"


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """One model cache for the whole run, away from the user's own."""
    if "FERRUM_TEST_KEEP_CACHE" not in os.environ:
        os.environ["FERRUM_CACHE_DIR"] = str(tmp_path_factory.mktemp("ferrum-cache"))


def corpus_rows() -> list[dict]:
    if not (CORPUS / "manifest.tsv").exists():
        return []
    with open(CORPUS / "manifest.tsv", encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    for row in rows:
        row["path"] = str(CORPUS / row["file"])
    return rows


needs_corpus = pytest.mark.skipif(
    not (CORPUS / "manifest.tsv").exists(), reason=f"the shared corpus is absent ({CORPUS}); CI has it"
)


def corpus(name: str) -> Path:
    path = CORPUS / name
    if not path.exists():
        pytest.skip(f"the shared corpus is absent ({CORPUS}); CI has it")
    return path


JFK = "en_jfk_inaugural_1961.flac"


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


def wav_bytes(samples, sample_rate: int = 16000) -> bytes:
    """16-bit mono WAV of float samples, for audio a test builds."""
    import io
    import wave

    import numpy as np

    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(sample_rate)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype(np.int16).tobytes())
    return buffer.getvalue()


def words(text: str) -> str:
    """openai-whisper's English normalizer, so tests compare words and not punctuation."""
    from whisper.normalizers import EnglishTextNormalizer

    return EnglishTextNormalizer()(text)


@pytest.fixture(scope="session")
def executor():
    from ferrum_cli import WhisperModelExecutor

    ex = WhisperModelExecutor.from_path("base", device="cpu")
    yield ex
    ex.shutdown()
