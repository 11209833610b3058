"""A batch on a Ray cluster (`--cluster`): the jobs, options and outputs of run_batch, with the
transcription done by worker actors and the outputs written here by the same writers.

Ray actors rather than Ray Data: each worker keeps one model and one engine for its life and has
a few files in flight at a time, which it batches together as the CLI does. The driver keeps the
queue, so it decides the retries: a file whose worker is lost goes to a new worker, a file's own
error is final. Ray does the placement, the transport and the failure detection.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import ClusterError, FerrumError, InputError, UsageError
from .inputs import Job
from .runner import BatchEvents, BatchPlan, BatchSummary, fail_job, finish_job, jobs_to_run

IN_FLIGHT = 8  # files per worker at once: its engine batches their windows together
MAX_LOSSES = 3  # times a file may lose its worker before it fails
WAIT_SECONDS = 1.0
CONNECT_SECONDS = 60.0
JOIN_POLL_SECONDS = 0.1  # how often what Ray prints while joining is read
REACH_SECONDS = 5.0  # for the cluster's port to take a TCP connection
START_SECONDS = 300.0  # for the first worker to load its model
STALL_SECONDS = 120.0  # with nothing finished for this long, the workers are asked whether they still answer
ANSWER_SECONDS = 15.0  # for a worker to answer that (or what it can read)
SHUTDOWN_SECONDS = 15.0  # for Ray to let go; a cluster that stopped answering may never


@dataclass(frozen=True)
class ClusterSettings:
    address: str  # "auto", "local", "ray://host:10001" or a GCS address host:port
    workers: int | None  # None: as many as the cluster's CPUs (or GPUs) allow
    model: str
    device: str
    dtype: str
    threads: int | None  # CPUs per worker; 1 when not given


class TranscriptionWorker:
    """One model on a Ray worker; Workers builds it with ray.remote.

    A threaded actor: the files in flight on it (a task each) feed one long-lived engine
    (EngineService), so its batches take windows from all of them, and the next file is read as
    soon as one is done, while the others are decoded.
    """

    def __init__(self, model: str, device: str, dtype: str, threads: int) -> None:
        from .. import WhisperModelExecutor

        self.executor = WhisperModelExecutor.from_path(model, device, dtype, threads)
        self.service = None  # started by the first batched task
        self.lock = threading.Lock()

    def ready(self) -> bool:
        """Answers once the model is loaded (Ray runs __init__ first)."""
        return True

    def can_read(self, path: str, size: int) -> bool:
        """Whether this worker sees the driver's file at the same path (shared storage)."""
        try:
            return os.path.getsize(path) == size
        except OSError:
            return False

    def transcribe(self, source: str | bytes, options):
        """The Transcription of a path or of a file's bytes, or its FerrumError."""
        from .. import Ticket, audio_opener

        with self.lock:
            if self.service is None:
                self.service = self.executor.serve()
        outcome: list = []
        done = threading.Event()

        def on_done(result) -> None:
            outcome.append(result)
            done.set()

        self.service.submit(
            Ticket(audio_opener(source, options.audio_stream), options, lambda segment, language: None, on_done)
        )
        done.wait()
        return outcome[0]


def connect(address: str):
    """The ray module, connected to the cluster at address; an unreachable one is an error within
    CONNECT_SECONDS (Ray itself goes on retrying for minutes), and one whose port refuses at once."""
    try:
        import ray
    except ImportError:
        raise UsageError("--cluster needs Ray: pip install 'ferrum-cli[cluster]'") from None
    found, whence = _found_address(address)
    why = _unreachable(found)
    if why:
        raise ClusterError(f"cannot join the Ray cluster at {address}{whence}: {why}")
    # "local": a new instance even where RAY_ADDRESS names a running one; ferrum reports, Ray's INFO lines are noise
    kwargs = {"address": address, "log_to_driver": False, "logging_level": logging.ERROR}
    if not address.startswith("ray://"):  # Ray Client takes no dashboard option
        kwargs["include_dashboard"] = False
    outcome: dict = {}

    def init() -> None:
        try:
            ray.init(**kwargs)
            outcome["ok"] = True
        except Exception as exc:  # Ray's own errors: ConnectionError, RuntimeError, ValueError
            outcome["error"] = exc

    if address == "local":  # here: the processes it starts die with the thread that started them
        init()
        said = ""
    else:  # Ray's core prints each retry of a failing join on stderr: ferrum reads it and reports once
        with tempfile.TemporaryFile("w+b") as printed:
            with _stderr_into(printed):
                joining = threading.Thread(target=init, name="ray-init", daemon=True)
                joining.start()
                said = _joined(joining, printed)
    if "ok" in outcome:
        return ray
    told = _told_early(said)
    if told:
        raise ClusterError(f"cannot join the Ray cluster at {address}: {told}")
    if "error" not in outcome:
        message = f"no answer in {CONNECT_SECONDS:.0f} s"
    else:
        exc = outcome["error"]
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    raise ClusterError(f"cannot join the Ray cluster at {address}: {message}")


def _joined(joining: threading.Thread, printed) -> str:
    """What Ray printed while joining, once the join ends, or CONNECT_SECONDS pass, or what it
    printed tells already that the join will fail (_told_early), where Ray goes on retrying."""
    deadline = time.monotonic() + CONNECT_SECONDS
    said = ""
    while joining.is_alive() and time.monotonic() < deadline and not _told_early(said):
        joining.join(min(JOIN_POLL_SECONDS, max(0.0, deadline - time.monotonic())))
        printed.seek(0)
        said = printed.read().decode("utf-8", "replace")
    return said


def _told_early(said: str) -> str | None:
    """Why the join will fail, where Ray's core says so while it retries, or None:
    - a refused token, within a second (Ray retries for 20 s more);
    - a port that takes connections but does not speak Ray's protocol, within 5 s (a web server,
      say; Ray waits on for minutes)."""
    if "Unauthenticated" in said or "InvalidAuthToken" in said:
        if os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
            why, give = "it refuses the token given", "the cluster's token"
        else:
            why, give = "it asks for Ray's token", "RAY_AUTH_MODE=token"
        return f"{why}; give {give} (the token in ~/.ray/auth_token or RAY_AUTH_TOKEN)"
    if "Failed to connect to GCS at address" in said:
        return "what listens there is not a Ray head (its port is 6379 unless `ray start --port` set another)"
    return None


@contextmanager
def _stderr_into(file):
    """File descriptor 2 into file within: what Ray's C++ core prints goes there, not to the user."""
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(file.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _found_address(address: str) -> tuple[str, str]:
    """(the address Ray joins, where it came from) for "auto": RAY_ADDRESS, else the last
    `ray start`'s on this machine, which outlives a cluster that was killed (Ray retries it for a
    minute). Other addresses are themselves."""
    if address != "auto":
        return address, ""
    try:
        from ray._private.services import get_ray_address_from_environment

        found = get_ray_address_from_environment("auto", None)
    except ConnectionError:
        raise ClusterError(
            "no Ray cluster runs here: start one (ray start --head), give its address, or use --cluster local"
        ) from None
    except Exception:  # noqa: BLE001 - Ray's private helper, changed or gone: Ray itself tells
        return address, ""
    if not found or found == "auto":
        return address, ""
    whence = "RAY_ADDRESS" if os.environ.get("RAY_ADDRESS") else "the last cluster `ray start` made here"
    return found, f" ({found}, {whence})"


def _unreachable(address: str) -> str | None:
    """Why nothing answers at the address's host and port, or None (also for "auto" and "local",
    which Ray finds itself): a closed port is told at once, where Ray would retry for a minute."""
    if address in ("auto", "local"):
        return None
    parts = urlsplit(address if "://" in address else "//" + address)
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        return "not an address of the form host:port"
    if not host or port is None:
        return None  # Ray's own forms (a bare host, say): Ray tells
    try:
        socket.create_connection((host, port), timeout=REACH_SECONDS).close()
    except socket.gaierror:
        return f"unknown host {host}"
    except ConnectionRefusedError:
        return f"nothing listens on {host}:{port}"
    except OSError as exc:  # a timeout, no route
        return f"{host}:{port} does not answer ({exc.strerror or type(exc).__name__})"
    return None


def worker_count(ray, settings: ClusterSettings) -> int:
    if settings.workers:
        return settings.workers
    resources = ray.cluster_resources()
    if settings.device.startswith("cuda"):
        return max(1, int(resources.get("GPU", 0)))
    return max(1, int(resources.get("CPU", 1)) // (settings.threads or 1))


class Workers:
    """The actors: `actors` have loaded their model and take tasks, `starting` have not yet
    (the cluster may lack room for them until others finish, or an autoscaler adds nodes)."""

    def __init__(self, ray, settings: ClusterSettings, count: int) -> None:
        self.ray, self.settings = ray, settings
        gpus = 1 if settings.device.startswith("cuda") else 0
        self.actor_class = ray.remote(
            num_cpus=settings.threads or 1, num_gpus=gpus, max_restarts=0, max_concurrency=IN_FLIGHT + 1
        )(TranscriptionWorker)  # + 1: can_read is answered while IN_FLIGHT tasks run
        self.actors: list = []
        self.starting: dict[object, object] = {}  # ready() ref -> actor
        self.in_flight: dict[object, int] = {}  # actor -> tasks
        self.shared: dict[object, bool] = {}  # actor -> reads the driver's paths
        self.cause = ""  # why the last worker that could not start did not
        for _ in range(count):
            self._start()

    def wait_first(self) -> None:
        """Until one worker has loaded its model; none within START_SECONDS is an error."""
        deadline = time.monotonic() + START_SECONDS
        while not self.actors and self.starting and time.monotonic() < deadline:
            self.take_started(WAIT_SECONDS)
        if not self.actors:
            why = self.cause or f"none started within {START_SECONDS:.0f} s (is there room for --threads CPUs?)"
            raise ClusterError(f"no worker could start on the cluster: {why}")

    def take_started(self, timeout: float = 0.0) -> None:
        """Move the workers that have loaded their model to `actors`; drop those that failed."""
        from ray.exceptions import RayActorError

        if not self.starting:
            return
        ready, _ = self.ray.wait(list(self.starting), num_returns=len(self.starting), timeout=timeout)
        for ref in ready:
            actor = self.starting.pop(ref)
            try:
                self.ray.get(ref)
                self.actors.append(actor)
            except RayActorError as exc:
                self.cause = _cause_line(exc)

    def _start(self) -> None:
        s = self.settings
        actor = self.actor_class.remote(s.model, s.device, s.dtype, s.threads or 1)
        self.starting[actor.ready.remote()] = actor

    def replace(self, actor) -> None:
        """A lost worker: forgotten, and another started in its place."""
        if actor in self.actors:
            self.actors.remove(actor)
            self._start()
            try:
                self.ray.kill(actor)  # a silent one still holds its CPUs
            except Exception:  # already gone
                pass
        self.in_flight.pop(actor, None)
        self.shared.pop(actor, None)

    def answering(self, within: float) -> bool:
        """Whether any worker answers within `within` seconds: a long file keeps its worker busy,
        but a worker (a threaded actor) answers while it transcribes unless it, or its node, is gone."""
        if not self.actors:
            return False
        from ray.exceptions import RayError

        waiting = [actor.ready.remote() for actor in self.actors]
        deadline = time.monotonic() + within
        while waiting and (left := deadline - time.monotonic()) > 0:
            answered, waiting = self.ray.wait(waiting, num_returns=1, timeout=left)
            for ref in answered:  # a lost worker's ping comes back too, as its error
                try:
                    return self.ray.get(ref)
                except RayError:
                    pass
        return False

    def free(self) -> list:
        return [a for a in self.actors if self.in_flight.get(a, 0) < IN_FLIGHT]

    def stop(self) -> None:
        for actor in [*self.actors, *self.starting.values()]:
            try:
                self.ray.kill(actor)
            except Exception:  # already gone
                pass


def run_cluster(plan: BatchPlan, events: BatchEvents, summary: BatchSummary, settings: ClusterSettings) -> BatchSummary:
    """Transcribe every job that needs it on the cluster's workers; outputs are written here as
    each file comes back, so an interruption keeps every finished one."""
    if plan.live:
        raise UsageError("--cluster transcribes files; --live and --mic run on this machine")
    outputs = dict(jobs_to_run(plan, events, summary))
    if not outputs:
        return summary
    from ..executor import check_model

    check_model(settings.model, path_here=False)  # a path is read on the workers
    ray = connect(settings.address)
    workers = None
    try:
        workers = Workers(ray, settings, worker_count(ray, settings))
        workers.wait_first()
        _drive(ray, workers, deque(outputs), outputs, plan, events, summary)
    finally:
        _let_go(ray, workers)
    return summary


def _let_go(ray, workers: Workers | None) -> None:
    """Stop the workers and disconnect, for at most SHUTDOWN_SECONDS: a cluster whose head is gone
    may never answer, and the run has ended either way."""

    def stop() -> None:
        if workers is not None:
            workers.stop()
        ray.shutdown()

    stopping = threading.Thread(target=stop, name="ray-shutdown", daemon=True)
    stopping.start()
    stopping.join(SHUTDOWN_SECONDS)


def _drive(ray, workers: Workers, queue: deque, outputs: dict, plan: BatchPlan, events, summary) -> None:
    from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

    tasks: dict[object, tuple[object, Job]] = {}  # ref -> (actor, job)
    losses: dict[Job, int] = {}
    stall = float(os.environ.get("FERRUM_CLUSTER_STALL_SECONDS", STALL_SECONDS))
    progress = time.monotonic()  # when a file last came back or a worker last started
    while queue or tasks:
        started = len(workers.actors)
        workers.take_started()
        if len(workers.actors) > started:
            progress = time.monotonic()
        if time.monotonic() - progress > stall:
            if not workers.answering(min(ANSWER_SECONDS, stall)):  # a stall set short is not waited out longer
                raise ClusterError(
                    f"the cluster stopped answering: nothing came back for {stall:.0f} s and no worker answers; "
                    "finished outputs are kept (--skip-existing resumes)"
                )
            progress = time.monotonic()  # busy with long files
        if not workers.actors and not workers.starting:
            raise ClusterError(f"every worker was lost and none could start again: {workers.cause}")
        for actor in workers.free():
            while queue and workers.in_flight.get(actor, 0) < IN_FLIGHT:
                job = queue.popleft()
                try:
                    payload = _payload(ray, workers, actor, job)
                except FerrumError as exc:  # stdin could not be read
                    fail_job(job, exc.message, events, summary)
                    continue
                except (RayActorError, GetTimeoutError):  # lost, or silent, as it was asked what it can read
                    workers.replace(actor)
                    queue.appendleft(job)
                    break
                tasks[actor.transcribe.remote(payload, plan.options)] = (actor, job)
                workers.in_flight[actor] = workers.in_flight.get(actor, 0) + 1
        if not tasks:  # no worker has loaded its model yet, or none is left with room
            workers.take_started(WAIT_SECONDS)
            continue
        ready, _ = ray.wait(list(tasks), num_returns=1, timeout=WAIT_SECONDS)
        if ready:
            progress = time.monotonic()
        for ref in ready:
            actor, job = tasks.pop(ref)
            workers.in_flight[actor] = workers.in_flight.get(actor, 1) - 1
            try:
                result = ray.get(ref)
            except RayActorError as exc:  # the worker died, or its node: the file goes to another
                workers.replace(actor)
                losses[job] = losses.get(job, 0) + 1
                if losses[job] >= MAX_LOSSES:
                    fail_job(job, f"lost its worker {MAX_LOSSES} times: {_cause_line(exc)}", events, summary)
                else:
                    queue.appendleft(job)
                continue
            except RayTaskError as exc:  # a bug in the worker: this file fails, the rest go on
                fail_job(job, f"internal error on a worker: {_cause_line(exc)}", events, summary)
                continue
            finish_job(job, result, outputs[job], plan, events, summary)


def _stdin_bytes() -> bytes:
    """stdin whole, for a worker that cannot read the driver's."""
    data = sys.stdin.buffer.read()
    if not data:
        raise InputError("empty input on stdin")
    return data


def _payload(ray, workers: Workers, actor, job: Job):
    """The job's path where the worker reads the driver's files, else its bytes."""
    if job.is_stdin:
        return _stdin_bytes()
    if actor not in workers.shared:
        size = Path(job.source).stat().st_size
        workers.shared[actor] = ray.get(
            actor.can_read.remote(os.path.abspath(job.source), size), timeout=ANSWER_SECONDS
        )
    if workers.shared[actor]:
        return os.path.abspath(job.source)
    return Path(job.source).read_bytes()


def _cause_line(exc: BaseException) -> str:
    """The last line of a Ray error: the exception its traceback ends in, and of ferrum's own
    errors only their message, as the CLI says them."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    kind, said, message = lines[-1].partition(": ")
    return message if said and kind.startswith("ferrum_cli.errors.") else lines[-1]
