"""The cluster scenario of `make bench`: the longform (the 12 English clips joined 6 times) and
the 12 clips through `ferrum transcribe --cluster local --workers 1` against the same run
without --cluster, both whole processes with the model load, both with --threads as many as the
cores. On one machine a cluster cannot be faster: this measures what Ray's start, the actor and
the driver's round trips cost. Best of BENCH_ROUNDS. Run alone: python bench/cluster_bench.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "2"))


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd[:4])}... exited {proc.returncode}: {proc.stderr[-2000:]}")
    return time.perf_counter() - start


def measure(ferrum: list[str], inputs: list[str], console) -> tuple[list[dict], dict, dict]:
    """(rows, ratios, targets): seconds without and with --cluster local, and their ratio."""
    threads = str(os.cpu_count() or 1)
    best = {"local": float("inf"), "cluster": float("inf")}
    for _ in range(ROUNDS):
        for name, extra in (("local", []), ("cluster", ["--cluster", "local", "--workers", "1"])):
            with tempfile.TemporaryDirectory() as out:
                cmd = [*ferrum, "transcribe", *inputs, "-o", out, "-f", "txt", "-q", "--language", "en",
                       "--threads", threads, *extra]  # fmt: skip
                best[name] = min(best[name], timed(cmd))
    rows = [
        {"scenario": "cluster", "system": "ferrum, one process", "seconds": round(best["local"], 2)},
        {"scenario": "cluster", "system": "ferrum --cluster local --workers 1", "seconds": round(best["cluster"], 2)},
    ]
    ratio = round(best["cluster"] / best["local"], 2)
    console.print(f"  cluster  {best['local']:.2f} s alone, {best['cluster']:.2f} s on --cluster local: {ratio}x")
    return rows, {"--cluster local 1 worker / without": ratio}, {"--cluster local 1 worker / without": ("<=", 1.15)}


if __name__ == "__main__":
    from rich.console import Console

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from run_bench import build_audio, ferrum_command

    with tempfile.TemporaryDirectory() as work:
        audio = build_audio(Path(work))
        rows, ratios, targets = measure(ferrum_command(), [audio["longform"], *audio["clips"]], Console())
    print(json.dumps({"rows": rows, "ratios": ratios, "targets": targets}, indent=1))
