"""The cluster scenario of `make bench`: the longform (the 12 English clips joined 6 times) and
the 12 clips through `ferrum transcribe --cluster local --workers 1` against the same run
without --cluster, both whole processes with the model load, both with --threads as many as the
cores. On one machine a cluster cannot be faster: this measures what Ray's start, the actor and
the driver's round trips cost. Beside it, two rows with no target that split that cost: Ray's
own start and stop with nothing on it (a process that only calls ray.init and ray.shutdown),
and the same run joining a cluster that is already up (a head node on 127.0.0.1 started by
the bench), as a cluster user runs it. Best of BENCH_ROUNDS. Run alone: python bench/cluster_bench.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from unittest.mock import patch

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "2"))


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd[:4])}... exited {proc.returncode}: {proc.stderr[-2000:]}")
    return time.perf_counter() - start


RAY_ALONE = r"""
import logging, ray
ray.init(address="local", include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
ray.shutdown()
"""


def measure(ferrum: list[str], inputs: list[str], console) -> tuple[list[dict], dict, dict]:
    """(rows, ratios, targets): seconds without --cluster, with --cluster local, joining a
    running cluster, and Ray's start and stop alone."""
    threads = str(os.cpu_count() or 1)

    def run(*extra: str) -> float:
        with tempfile.TemporaryDirectory() as out:
            cmd = [*ferrum, "transcribe", *inputs, "-o", out, "-f", "txt", "-q", "--language", "en",
                   "--threads", threads, *extra]  # fmt: skip
            return timed(cmd)

    best = {"local": float("inf"), "cluster": float("inf"), "running": float("inf"), "ray": float("inf")}
    for _ in range(ROUNDS):
        best["local"] = min(best["local"], run())
        best["cluster"] = min(best["cluster"], run("--cluster", "local", "--workers", "1"))
        best["ray"] = min(best["ray"], timed([sys.executable, "-c", RAY_ALONE]))
    with running_cluster(int(threads)) as address:
        for _ in range(ROUNDS):
            best["running"] = min(best["running"], run("--cluster", address, "--workers", "1"))
    rows = [
        {"scenario": "cluster", "system": "ferrum, one process", "seconds": round(best["local"], 2)},
        {"scenario": "cluster", "system": "ferrum --cluster local --workers 1", "seconds": round(best["cluster"], 2)},
        {
            "scenario": "cluster",
            "system": "ferrum --cluster ADDRESS --workers 1, cluster already up",
            "seconds": round(best["running"], 2),
        },  # fmt: skip
        {
            "scenario": "cluster",
            "system": "Ray's start and stop alone (ray.init, ray.shutdown)",
            "seconds": round(best["ray"], 2),
        },  # fmt: skip
    ]
    ratio = round(best["cluster"] / best["local"], 2)
    ratios = {
        "--cluster local 1 worker / without": ratio,
        "--cluster on a running cluster 1 worker / without": round(best["running"] / best["local"], 2),
        "Ray's start and stop alone / without": round(best["ray"] / best["local"], 2),
    }
    console.print(f"  cluster  {best['local']:.2f} s alone, {best['cluster']:.2f} s on --cluster local: {ratio}x")
    console.print(
        f"  cluster  {best['running']:.2f} s on a cluster already up; Ray's start and stop alone {best['ray']:.2f} s"
    )
    return rows, ratios, {"--cluster local 1 worker / without": ("<=", 1.15)}


@contextmanager
def running_cluster(cpus: int):
    """A one-node Ray cluster on 127.0.0.1 for the time of the block; its address. The variable
    keeps Ray on loopback (see tests/test_cluster.py); the token Ray sets up for it reaches
    ferrum through the environment this process hands on."""
    from ray.cluster_utils import Cluster

    with patch.dict(os.environ, {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}):
        head = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus, "node_ip_address": "127.0.0.1",
                                                             "include_dashboard": False})  # fmt: skip
        try:
            head.wait_for_nodes()
            yield head.address
        finally:
            head.shutdown()


if __name__ == "__main__":
    from rich.console import Console

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import build_audio, ferrum_command

    with tempfile.TemporaryDirectory() as work:
        audio = build_audio(Path(work))
        rows, ratios, targets = measure(ferrum_command(), [audio["longform"], *audio["clips"]], Console())
    print(json.dumps({"rows": rows, "ratios": ratios, "targets": targets}, indent=1))
