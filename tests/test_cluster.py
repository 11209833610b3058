"""`ferrum transcribe --cluster`: the batch on a real multi-node Ray cluster on 127.0.0.1 (a head
with no CPUs for work and two worker nodes with one each), started for this module, stopped at
its end. The driver is the real `ferrum` in a subprocess."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from .helpers import (
    CORPUS,
    FERRUM,
    as_from_a_terminal,
    corpus_rows,
    diarization_error_rate,
    free_port,
    needs_corpus,
    run_ferrum,
    summary_counts,
)

ray = pytest.importorskip("ray", reason="Ray is the cluster extra (make install)")
pytestmark = pytest.mark.cluster
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


@contextmanager
def closed_address() -> Iterator[str]:
    """host:port of a loopback port held bound and never listening, so nothing else takes it."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{held.getsockname()[1]}"


def worker_pids(running: bool = False) -> list[int]:
    """The ferrum workers' processes on this machine; running: those inside a transcription."""
    listing = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    wanted = WORKER + (".transcribe" if running else "")
    return [int(line.split()[0]) for line in listing.splitlines() if wanted in line]


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
def test_diarization_on_the_cluster_tells_the_speakers_apart(cluster, tmp_path):
    """The workers run the same post-processing stage: speakers on every segment, and turns that
    score as a local run's do against the reference (tests/test_diarize.py)."""
    inputs = [str(CORPUS / "diarization" / "pyannote_sample.wav"), clips("en", 1)[0]]
    args = [*inputs, "--diarize", "-f", "json", "-f", "rttm", "--threads", "1", "-q", "-o", str(tmp_path)]
    spread = run_ferrum("transcribe", *args, "--cluster", cluster)
    assert spread.returncode == 0, spread.stderr
    rttm = (tmp_path / "pyannote_sample.rttm").read_text()
    assert diarization_error_rate(rttm, "pyannote_sample") <= 0.2
    for name, speakers in (("pyannote_sample", {"SPEAKER_00", "SPEAKER_01"}), (Path(inputs[1]).stem, {"SPEAKER_00"})):
        doc = json.loads((tmp_path / f"{name}.json").read_text())
        assert {s["speaker"] for s in doc["segments"]} == speakers, name


@needs_corpus
def test_a_worker_killed_mid_run_has_its_files_done_by_another_and_a_bad_file_fails_once(cluster, tmp_path):
    bad = tmp_path / "not_audio.wav"
    bad.write_bytes(b"RIFF" + bytes(range(256)) * 40)
    inputs = clips("en") + [str(bad)]
    out = tmp_path / "out"
    driver = subprocess.Popen(
        [FERRUM, "transcribe", *inputs, "-o", str(out), "-f", "txt", "-f", "json", "--threads", "1",
         "-m", "tiny.en", "--cluster", cluster],
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


def _twenty_four_files(tmp_path: Path, cluster: str) -> tuple[Path, list[str]]:
    """(the output folder, transcribe's arguments) for a folder of the English clips twice over,
    as copies: the same file twice is one input. tiny.en: what is tested is how the run ends and
    resumes, not base's words."""
    folder = tmp_path / "talks"
    folder.mkdir()
    for copy in range(2):
        for clip in clips("en"):
            shutil.copy(clip, folder / f"{copy}_{Path(clip).name}")
    out = tmp_path / "out"
    return out, [str(folder), "-o", str(out), "-f", "txt", "-f", "json", "--threads", "1", "-m", "tiny.en",
                 "--cluster", cluster]  # fmt: skip


@needs_corpus
def test_ctrl_c_keeps_finished_outputs_leaves_no_worker_and_skip_existing_resumes(cluster, tmp_path):
    out, args = _twenty_four_files(tmp_path, cluster)  # the run is still going when it is interrupted
    driver = subprocess.Popen(
        [FERRUM, "transcribe", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=as_from_a_terminal,
    )  # fmt: skip
    deadline = time.monotonic() + 180
    while not (out.exists() and list(out.glob("*.json"))) and time.monotonic() < deadline:
        time.sleep(0.1)
    driver.send_signal(signal.SIGINT)
    _, stderr = driver.communicate(timeout=120)
    assert driver.returncode == 130, stderr
    finished = {p.stem for p in out.glob("*.json")}
    assert finished and {p.stem for p in out.glob("*.txt")} == finished  # whole pairs only
    assert not list(out.glob(".*")) and "Traceback" not in stderr
    assert len(finished) < 24
    deadline = time.monotonic() + 30
    while worker_pids() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not worker_pids(), "ferrum's workers outlived the interrupted run"
    resumed = run_ferrum("transcribe", *args, "--skip-existing")
    assert resumed.returncode == 0, resumed.stderr
    assert summary_counts(resumed.stderr) == (24 - len(finished), len(finished), 0)
    assert len(list(out.glob("*.json"))) == 24


@needs_corpus
def test_workers_that_stop_answering_end_the_run_in_bounded_time_and_skip_existing_resumes(cluster, tmp_path):
    """A run whose head node went down waited 30 minutes and more. Here every worker is frozen
    (SIGSTOP) mid-run: the cluster is up, the workers hold their CPUs, and nothing comes back."""
    out, args = _twenty_four_files(tmp_path, cluster)  # more than the 16 two workers have in flight
    env = {**os.environ, "FERRUM_CLUSTER_STALL_SECONDS": "5"}
    driver = subprocess.Popen(
        [FERRUM, "transcribe", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    deadline = time.monotonic() + 180
    while not (out.exists() and list(out.glob("*.json"))) and time.monotonic() < deadline:
        time.sleep(0.1)
    frozen = worker_pids()
    assert frozen, "no worker started"
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        _, stderr = driver.communicate(timeout=120)
    finally:
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    assert driver.returncode == 1, stderr
    assert "the cluster stopped answering" in stderr and "Traceback" not in stderr
    finished = {p.stem for p in out.glob("*.json")}
    assert finished and {p.stem for p in out.glob("*.txt")} == finished and not list(out.glob(".*"))
    deadline = time.monotonic() + 30
    while worker_pids() and time.monotonic() < deadline:
        time.sleep(0.2)
    resumed = run_ferrum("transcribe", *args, "--skip-existing")
    assert resumed.returncode == 0, resumed.stderr
    assert summary_counts(resumed.stderr) == (24 - len(finished), len(finished), 0)


@needs_corpus
def test_a_model_no_worker_can_load_is_one_line(cluster, tmp_path):
    """An unknown name is told before the cluster is joined (no cluster listens at the first
    address), a path with nothing there by the workers, which read it, as the CLI says it."""
    clip = clips("en", 1)[0]
    with closed_address() as closed:
        unknown = run_ferrum("transcribe", clip, "-o", str(tmp_path), "-m", "tiny.eng", "--cluster", closed)
    assert unknown.returncode == 4
    assert unknown.stderr.splitlines()[0].startswith("error: unknown model 'tiny.eng'; known names: ")
    missing = run_ferrum("transcribe", clip, "-o", str(tmp_path), "-m", "/no/such/model.pt", "--cluster", cluster)
    assert missing.returncode == 1
    assert missing.stderr.splitlines() == [
        "error: no worker could start on the cluster: no such model file or directory: /no/such/model.pt"
    ]
    assert not list(tmp_path.iterdir())


def test_workers_without_a_cluster_is_a_usage_error():
    proc = run_ferrum("transcribe", "x.wav", "--workers", "2")
    assert proc.returncode == 2 and "--workers needs --cluster" in proc.stderr


@needs_corpus
def test_a_cluster_address_that_cannot_answer_is_one_line_at_once(tmp_path):
    """A closed port and a malformed address are told before Ray is asked (Ray would retry for a
    minute and print each retry), and a port where something other than Ray listens as soon as
    Ray's core says so (5 s; Ray waits on for minutes); nothing is written."""
    with closed_address() as closed, socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen(8)  # takes connections and never says a word: not Ray's protocol
        not_ray = f"127.0.0.1:{other.getsockname()[1]}"
        for address, why in (
            (closed, f"nothing listens on {closed}"),
            ("127.0.0.1:x", "not an address of the form host:port"),
            (not_ray, "what listens there is not a Ray head (its port is 6379 unless `ray start --port` set another)"),
        ):
            started = time.monotonic()
            proc = run_ferrum("transcribe", clips("en", 1)[0], "-o", str(tmp_path), "--cluster", address)
            assert time.monotonic() - started < 30
            assert proc.returncode == 1
            assert proc.stderr.splitlines() == [f"error: cannot join the Ray cluster at {address}: {why}"]
    assert not list(tmp_path.iterdir())


@needs_corpus
def test_cluster_auto_whose_cluster_is_gone_is_one_line_at_once(tmp_path):
    """`--cluster auto` joins RAY_ADDRESS, else the cluster `ray start` last made on this machine
    (an address Ray keeps after the cluster is killed), and Ray retries a dead one for a minute.
    Where nothing listens there, the line names the address and where it came from, at once.
    (RAY_ADDRESS here: which of the others Ray picks depends on what else runs on the machine.)"""
    with closed_address() as closed:
        started = time.monotonic()
        proc = run_ferrum("transcribe", clips("en", 1)[0], "-o", str(tmp_path), "--cluster", "auto",
                          env={"RAY_ADDRESS": closed})  # fmt: skip
        assert time.monotonic() - started < 30  # Ray itself retries such an address for a minute
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"error: cannot join the Ray cluster at auto ({closed}, RAY_ADDRESS): nothing listens on {closed}"
    ]
    assert not list(tmp_path.iterdir())


@pytest.fixture
def token_cluster():
    """(address, token) of a one-node cluster on 127.0.0.1 with Ray's token authentication, as
    `ray start` makes one by default, in a `ray start --block` that takes its processes with it
    when it ends. Its token is its own (RAY_AUTH_TOKEN), not the one in ~/.ray."""
    port = free_port()
    token = secrets.token_hex(32)
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    head = subprocess.Popen(
        [str(Path(FERRUM).parent / "ray"), "start", "--head", "--block", "--port", str(port), "--num-cpus", "1",
         "--node-ip-address", "127.0.0.1", "--include-dashboard", "false", "--disable-usage-stats"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert head.poll() is None, "ray start ended"
                time.sleep(0.5)
        yield f"127.0.0.1:{port}", token
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()


@needs_corpus
def test_a_cluster_that_asks_for_a_token_not_given_says_so_in_one_line(token_cluster, tmp_path):
    """A driver with RAY_AUTH_MODE unset does not send Ray's token to a cluster named by address
    (Ray sends it unasked only to one it finds itself): the user reads why and what to set in one
    line as soon as the cluster refuses, not after Ray's 20 s of retries; a wrong token is told as
    such; with RAY_AUTH_MODE=token and the token the same run joins."""
    address, token = token_cluster
    clip = clips("en", 1)[0]
    args = ["transcribe", clip, "-o", str(tmp_path), "--threads", "1", "--cluster", address]
    loopback = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    loopback["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # see cluster(): the driver stays on 127.0.0.1
    started = time.monotonic()
    proc = subprocess.run([FERRUM, *args], env=loopback, capture_output=True, text=True, timeout=300)
    assert time.monotonic() - started < 15  # Ray retries a refused token for 20 s before it gives up
    assert proc.returncode == 1
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "asks for Ray's token" in proc.stderr and "RAY_AUTH_MODE=token" in proc.stderr
    assert not list(tmp_path.iterdir())
    wrong = run_ferrum(*args, env={**loopback, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64})
    assert wrong.returncode == 1 and len(wrong.stderr.splitlines()) == 1, wrong.stderr
    assert "refuses the token given" in wrong.stderr and "the cluster's token" in wrong.stderr
    joined = run_ferrum(*args, "-q", env={**loopback, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
    assert joined.returncode == 0, joined.stderr
    assert [p.name for p in tmp_path.iterdir()] == [Path(clip).stem + ".txt"]


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
