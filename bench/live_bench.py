"""The live scenario of `make bench`: the English longform fed to `ferrum transcribe - --live` by a
real-time pacer (0.1 s of audio every 0.1 s, as a microphone gives it).

Latency, per clip copy (a sentence or a few): from the moment the pacer has written the copy's
last sample to the moment the last line that covers the copy reaches stdout. WER of the live text
against the references, beside the offline run of the same file. BENCH_LIVE_SPEED paces faster
(2 = twice real time) to try it out; the figures of record are at 1.
A second file, the clips reversed 4 times, is fed all at once as a check with no target.
Run alone: python bench/live_bench.py [copies of the 12 clips, default 6].
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

SPEED = float(os.environ.get("BENCH_LIVE_SPEED", "1"))
STEP_SECONDS = 0.1
GAP_SECONDS = 1.0  # after each copy in the joined file (run_bench.joined)
LIVE = ["transcribe", "-", "--live", "-f", "jsonl", "-q", "--language", "en"]  # ferrum's arguments, paced or not


def pace(proc: subprocess.Popen, pcm: bytes, started: dict) -> None:
    """A 16-bit 16 kHz mono WAV into the process's stdin at SPEED times real time."""
    rate = 32000 * SPEED
    step = int(32000 * STEP_SECONDS)
    started["at"] = start = time.monotonic()
    try:
        for i in range(0, len(pcm), step):
            proc.stdin.write(pcm[i : i + step])
            proc.stdin.flush()
            time.sleep(max(0.0, start + (i + step) / rate - time.monotonic()))
    finally:
        proc.stdin.close()


def live_run(ferrum: list[str], wav: str) -> tuple[list[tuple[float, dict]], float]:
    """Each jsonl line with the second it arrived after the pacer began, and the pacer's start."""
    pcm = Path(wav).read_bytes()  # the header first, as a recorder's pipe starts
    proc = subprocess.Popen(
        [*ferrum, *LIVE],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    errors: list[bytes] = []
    threading.Thread(target=lambda: errors.append(proc.stderr.read()), daemon=True).start()
    time.sleep(5)  # the model loads before the speaker starts, as it would for a live source
    started: dict = {}
    pacer = threading.Thread(target=pace, args=(proc, pcm, started))
    pacer.start()
    lines = [(time.monotonic(), json.loads(line)) for line in proc.stdout]
    pacer.join()
    if proc.wait() != 0:
        sys.exit(f"bench: ferrum --live exited {proc.returncode}: {b''.join(errors).decode()[-2000:]}")
    return [(at - started["at"], line) for at, line in lines], started["at"]


def latencies(lines: list[tuple[float, dict]], layout: list[tuple[str, float, float]]) -> list[float]:
    """Per copy: when its last covering line arrived, less when the pacer wrote the copy's end."""
    out = []
    for _, start, end in layout:
        covering = [at for at, seg in lines if start <= (seg["start"] + seg["end"]) / 2 < end + GAP_SECONDS]
        if covering:
            out.append(max(covering) - end / SPEED)
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def latency_figures(delays: list[float], layout: list) -> dict:
    """Copies heard, and the p50, p95 and worst of their latencies."""
    return {
        "copies": len(layout),
        "copies_heard": len(delays),
        "latency_p50": round(statistics.median(delays), 2) if delays else None,
        "latency_p95": round(percentile(delays, 0.95), 2) if delays else None,
        "latency_max": round(max(delays), 2) if delays else None,
    }


def offline_text(ferrum: list[str], wav: str) -> str:
    out = subprocess.run([*ferrum, "transcribe", wav, "-f", "json", "-q", "--language", "en"], capture_output=True)
    if out.returncode != 0:
        sys.exit(f"bench: ferrum exited {out.returncode}: {out.stderr.decode()[-2000:]}")
    return json.loads(out.stdout)["text"]


def live_at_once(ferrum: list[str], wav: str) -> str:
    """The text of `ferrum transcribe - --live` with the whole file written into the pipe at once."""
    with open(wav, "rb") as fh:
        out = subprocess.run([*ferrum, *LIVE], stdin=fh, capture_output=True)
    if out.returncode != 0:
        sys.exit(f"bench: ferrum --live exited {out.returncode}: {out.stderr.decode()[-2000:]}")
    return " ".join(json.loads(line)["text"].strip() for line in out.stdout.splitlines() if line.strip())


def measure(
    ferrum: list[str], wav: str, layout: list, reference: str, wer, console, check: tuple[str, str] | None = None
) -> tuple[dict, dict, dict]:
    """(row, ratios, targets) of the live scenario; wer(reference, text) as the bench scores.

    check: (wav, reference) of a second file, the clips in another order, fed at once (the live
    planner cuts a stream alike at any pace): its live WER beside its offline WER, with no target.
    """
    offline = offline_text(ferrum, wav)
    lines, _ = live_run(ferrum, wav)
    live_text = " ".join(seg["text"].strip() for _, seg in lines)
    delays = latencies(lines, layout)
    row = {
        "scenario": "live",
        "system": f"ferrum --live, paced at {SPEED:g}x real time",
        **latency_figures(delays, layout),
        "wer_live": round(wer(reference, live_text), 4),
        "wer_offline": round(wer(reference, offline), 4),
    }
    if check is not None:
        check_wav, check_reference = check
        row["wer_live_check"] = round(wer(check_reference, live_at_once(ferrum, check_wav)), 4)
        row["wer_offline_check"] = round(wer(check_reference, offline_text(ferrum, check_wav)), 4)
    console.print(
        f"  live    p50 {row['latency_p50']} s  p95 {row['latency_p95']} s  max {row['latency_max']} s  "
        f"WER {row['wer_live']} live against {row['wer_offline']} offline  ({row['copies_heard']}/{len(layout)} copies)"
    )
    ratios = {
        "live latency p95 s": row["latency_p95"],
        "live WER - offline WER (points)": round((row["wer_live"] - row["wer_offline"]) * 100, 2),
        "live copies heard / copies": round(len(delays) / len(layout), 3),
    }
    if check is not None:
        check_live, check_offline = row["wer_live_check"], row["wer_offline_check"]
        console.print(f"  live    WER {check_live} live against {check_offline} offline: clips reversed, fed at once")
        ratios["live WER - offline WER, clips reversed (points)"] = round((check_live - check_offline) * 100, 2)
    targets = {
        "live latency p95 s": ("<=", 2.5),
        "live WER - offline WER (points)": ("<=", 1.0),
        "live copies heard / copies": (">=", 1.0),
    }
    return row, ratios, targets


if __name__ == "__main__":
    import tempfile

    from rich.console import Console

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import english_longforms, ferrum_command, wer, write_wav

    audio = english_longforms(int(sys.argv[1]) if len(sys.argv) > 1 else 6)
    (samples, layout, reference), (backwards, _, check_reference) = audio["longform"], audio["reversed"]
    with tempfile.TemporaryDirectory() as work:
        wav, check = str(Path(work) / "longform.wav"), str(Path(work) / "reversed.wav")
        write_wav(Path(wav), samples)
        write_wav(Path(check), backwards)
        row, ratios, targets = measure(
            ferrum_command(), wav, layout, reference, wer, Console(), (check, check_reference)
        )
    print(json.dumps({"row": row, "ratios": ratios, "targets": targets}, indent=1))
