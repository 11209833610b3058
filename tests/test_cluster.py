"""`ferrum transcribe --cluster`: the batch on a real multi-node Ray cluster on 127.0.0.1 (a head
with no CPUs for work and two worker nodes with one each), started for this module, stopped at
its end. The driver is the real `ferrum` in a subprocess."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .conftest import FERRUM, corpus_rows, needs_corpus, run_ferrum

ray = pytest.importorskip("ray", reason="Ray is the cluster extra (make install)")
WORKER = "ray::TranscriptionWorker"


@pytest.fixture(scope="module")
def cluster():
    """The cluster's address. Ray takes a node's outward IP for itself, even when told
    127.0.0.1, unless told it is not clustering across machines: with that, every node, and the
    driver that inherits the variable, stays on loopback."""
    from ray.cluster_utils import Cluster

    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        head = {"num_cpus": 0, "node_ip_address": "127.0.0.1", "include_dashboard": False}
        nodes = Cluster(initialize_head=True, head_node_args=head)
        try:
            for _ in range(2):
                nodes.add_node(num_cpus=1, node_ip_address="127.0.0.1")
            nodes.wait_for_nodes()
            yield nodes.address
        finally:
            nodes.shutdown()


def clips(language: str | None = None, count: int = 12) -> list[str]:
    rows = [r for r in corpus_rows() if language is None or r["language"] == language]
    return [r["path"] for r in rows][:count]


def worker_pids(running: bool = False) -> list[int]:
    """The ferrum workers' processes on this machine; running: those inside a transcription."""
    listing = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    wanted = WORKER + (".transcribe" if running else "")
    return [int(line.split()[0]) for line in listing.splitlines() if wanted in line]


def summary_counts(stderr: str) -> tuple[int, int, int]:
    """(done, skipped, failed) from the summary table."""
    row = next(line for line in stderr.splitlines() if re.match(r"^│\s+\d+\s+│", line))
    done, skipped, failed = (int(x) for x in re.findall(r"│\s+(\d+)\s+(?=│)", row)[:3])
    return done, skipped, failed


def outputs(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@needs_corpus
def test_the_corpus_on_the_cluster_gives_the_outputs_of_a_local_run_byte_for_byte(cluster, tmp_path):
    inputs = clips(count=10)  # several languages, detected on the workers
    args = [*inputs, "-f", "txt", "-f", "json", "--threads", "1", "-q"]
    local = run_ferrum("transcribe", *args, "-o", str(tmp_path / "local"))
    assert local.returncode == 0, local.stderr
    spread = run_ferrum("transcribe", *args, "-o", str(tmp_path / "cluster"), "--cluster", cluster)
    assert spread.returncode == 0, spread.stderr
    assert outputs(tmp_path / "cluster") == outputs(tmp_path / "local")
    assert len(outputs(tmp_path / "local")) == 2 * len(inputs)


@needs_corpus
def test_a_worker_killed_mid_run_has_its_files_done_by_another_and_a_bad_file_fails_once(cluster, tmp_path):
    bad = tmp_path / "not_audio.wav"
    bad.write_bytes(b"RIFF" + bytes(range(256)) * 40)
    inputs = clips("en") + [str(bad)]
    out = tmp_path / "out"
    driver = subprocess.Popen(
        [FERRUM, "transcribe", *inputs, "-o", str(out), "-f", "txt", "-f", "json", "--threads", "1",
         "--cluster", cluster],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not worker_pids(running=True) and time.monotonic() < deadline:
        time.sleep(0.1)
    victims = worker_pids(running=True)
    assert victims, "no worker started transcribing"
    subprocess.run(["kill", "-9", str(victims[0])], check=True)
    _, stderr = driver.communicate(timeout=300)
    assert driver.returncode == 1, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(bad) in errors[0], stderr
    assert stderr.count(str(bad)) == 1, stderr
    assert "Traceback" not in stderr
    assert summary_counts(stderr) == (len(inputs) - 1, 0, 1)
    written = outputs(out)
    assert len(written) == 2 * (len(inputs) - 1) and not list(out.glob(".*"))
    for name, data in written.items():
        if name.endswith(".json"):
            assert json.loads(data)["text"]


@needs_corpus
def test_ctrl_c_keeps_finished_outputs_leaves_no_worker_and_skip_existing_resumes(cluster, tmp_path):
    folder = tmp_path / "talks"
    folder.mkdir()
    for copy in range(3):  # 36 files: the run is still going when it is interrupted
        for clip in clips("en"):
            shutil.copy(clip, folder / f"{copy}_{Path(clip).name}")  # copies: the same file twice is one input
    out = tmp_path / "out"
    args = [str(folder), "-o", str(out), "-f", "txt", "-f", "json", "--threads", "1", "--cluster", cluster]
    driver = subprocess.Popen([FERRUM, "transcribe", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while not (out.exists() and list(out.glob("*.json"))) and time.monotonic() < deadline:
        time.sleep(0.1)
    driver.send_signal(signal.SIGINT)
    _, stderr = driver.communicate(timeout=120)
    assert driver.returncode == 130, stderr
    finished = {p.stem for p in out.glob("*.json")}
    assert finished and {p.stem for p in out.glob("*.txt")} == finished  # whole pairs only
    assert not list(out.glob(".*")) and "Traceback" not in stderr
    assert len(finished) < 36
    deadline = time.monotonic() + 30
    while worker_pids() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not worker_pids(), "ferrum's workers outlived the interrupted run"
    resumed = run_ferrum("transcribe", *args, "--skip-existing")
    assert resumed.returncode == 0, resumed.stderr
    assert summary_counts(resumed.stderr) == (36 - len(finished), len(finished), 0)
    assert len(list(out.glob("*.json"))) == 36


def test_workers_without_a_cluster_is_a_usage_error():
    proc = run_ferrum("transcribe", "x.wav", "--workers", "2")
    assert proc.returncode == 2 and "--workers needs --cluster" in proc.stderr


@needs_corpus
def test_cluster_local_starts_a_throwaway_ray_and_gives_the_same_text(tmp_path):
    clip = clips("en", 1)[0]
    alone = run_ferrum("transcribe", clip, "-q", "--threads", "1")
    local = run_ferrum("transcribe", clip, "-q", "--threads", "1", "--cluster", "local", "--workers", "1")
    assert local.returncode == 0, local.stderr
    assert local.stdout == alone.stdout and alone.stdout.strip()


@needs_corpus
def test_more_workers_than_the_cluster_has_room_for_go_on_with_those_that_start(cluster, tmp_path):
    inputs = clips("en", 4)
    args = ["-o", str(tmp_path), "--threads", "1", "--workers", "4", "--cluster", cluster]  # room for 2
    proc = run_ferrum("transcribe", *inputs, *args)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.stem for p in tmp_path.glob("*.txt")) == sorted(Path(i).stem for i in inputs)
