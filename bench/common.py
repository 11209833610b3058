"""What the benchmarks share: the corpus, the joined audio they are measured on, the WER as
make bench scores it, and the ferrum command. run_bench.py runs the scenarios; live_bench.py,
serve_bench.py and cluster_bench.py each measure one and import only this."""

from __future__ import annotations

import csv
import os
import re
import shutil
import sys
import wave
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path(os.environ.get("BENCH_CORPUS") or ROOT.parent / "shared" / "corpus")
RESULTS = ROOT / "bench" / "results"
BIN = Path(sys.executable).parent
DEVICE = os.environ.get("BENCH_DEVICE", "cpu")
SR = 16000


def english_rows() -> list[dict]:
    with open(CORPUS / "manifest.tsv", encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [r for r in rows if r["language"] == "en" and r["reference_transcript"] != "none"]


def english_longforms(copies: int) -> dict:
    """The English clips joined `copies` times, and reversed 4 times (run_bench's check), each
    as (samples, layout, reference), for the scenarios run alone."""
    from ferrum_cli.audio.ffmpeg import decode_file

    rows = english_rows()
    clips = [str(CORPUS / r["file"]) for r in rows]
    decoded = [decode_file(c).samples for c in clips]
    refs = {c: r["reference_transcript"] for c, r in zip(clips, rows)}
    out = {}
    for name, order, times in (("longform", slice(None), copies), ("reversed", slice(None, None, -1), 4)):
        samples, layout = joined(clips[order], decoded[order], times)
        out[name] = (samples, layout, " ".join(refs[clip] for clip, _, _ in layout))
    return out


def write_wav(path: Path, samples: np.ndarray) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(SR)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype(np.int16).tobytes())


def joined(clips: list[str], decoded: list[np.ndarray], times: int) -> tuple[np.ndarray, list]:
    """The clips one after another with 1 s of silence after each, `times` over, and the layout:
    (clip, start s, end s) of each copy."""
    gap = np.zeros(SR, np.float32)
    once = np.concatenate([x for samples in decoded for x in (samples, gap)])
    layout, start = [], 0.0
    for _ in range(times):
        for clip, samples in zip(clips, decoded):
            layout.append((clip, start, start + len(samples) / SR))
            start += (len(samples) + len(gap)) / SR
    return np.tile(once, times), layout


def build_audio(work: Path) -> dict:
    from ferrum_cli.audio.ffmpeg import decode_file

    rows = english_rows()
    clips = [str(CORPUS / r["file"]) for r in rows]
    decoded = [decode_file(c).samples for c in clips]
    six, layout = joined(clips, decoded, 6)
    backwards, reversed_layout = joined(clips[::-1], decoded[::-1], 4)
    write_wav(work / "longform_x6.wav", six)
    write_wav(work / "reversed_x4.wav", backwards)
    write_wav(work / "sixty_minutes.wav", np.tile(six, 6))
    refs = {c: r["reference_transcript"] for c, r in zip(clips, rows)}
    return {
        "clips": clips,
        "clip_refs": refs,
        "clip_seconds": sum(len(samples) for samples in decoded) / SR,
        "longform": str(work / "longform_x6.wav"),
        "longform_ref": " ".join(refs[clip] for clip, _, _ in layout),
        "longform_seconds": len(six) / SR,
        "reversed": str(work / "reversed_x4.wav"),
        "reversed_ref": " ".join(refs[clip] for clip, _, _ in reversed_layout),
        "reversed_seconds": len(backwards) / SR,
        "layouts": {"longform": layout, "longform words": layout, "reversed": reversed_layout},
        "sixty": str(work / "sixty_minutes.wav"),
        "sixty_seconds": len(six) * 6 / SR,
        "jfk": str(CORPUS / "en_jfk_inaugural_1961.flac"),
    }


def aligned(reference: list[str], hypothesis: list[str]) -> tuple[int, list[bool]]:
    """Word edits between the two, and for each reference word whether a least-edits alignment
    pairs it with the same word."""
    cols = len(hypothesis) + 1
    prev = list(range(cols))
    moves = []  # per reference word and column: 0 match or substitution, 1 deletion, 2 insertion
    for r in reference:
        cur, move = [prev[0] + 1], bytearray(cols)
        move[0] = 1
        for j, h in enumerate(hypothesis, 1):
            best, how = prev[j - 1] + (r != h), 0
            if prev[j] + 1 < best:
                best, how = prev[j] + 1, 1
            if cur[j - 1] + 1 < best:
                best, how = cur[j - 1] + 1, 2
            cur.append(best)
            move[j] = how
        moves.append(move)
        prev = cur
    found = [False] * len(reference)
    i, j = len(reference), len(hypothesis)
    while i > 0:
        how = moves[i - 1][j] if j > 0 else 1
        if how == 0:
            found[i - 1] = reference[i - 1] == hypothesis[j - 1]
            i, j = i - 1, j - 1
        elif how == 1:
            i -= 1
        else:
            j -= 1
    return prev[-1], found


DIGIT_GAP = re.compile(r"(?<=\d)[\s,\-]+(?=\d)")  # between digits: only spaces, commas or dashes


def scored_words(text: str) -> list[str]:
    """The words a text is scored by: digits grouped by spaces, commas or dashes joined first
    ("1-0-0-0-1" and "10001" are the same number read aloud), then openai-whisper's English
    normalizer, which also turns a spoken run ("one zero zero ...") into one number."""
    from whisper.normalizers import EnglishTextNormalizer

    return EnglishTextNormalizer()(DIGIT_GAP.sub("", text)).split()


def wer(reference: str, hypothesis: str) -> float:
    ref = scored_words(reference)
    return aligned(ref, scored_words(hypothesis))[0] / max(len(ref), 1)


def ferrum_command() -> list[str]:
    """The venv's `ferrum`, else the one on PATH (a --target install), else the package as a module."""
    found = shutil.which("ferrum", path=str(BIN)) or shutil.which("ferrum")
    return [found] if found else [sys.executable, "-m", "ferrum_cli"]
