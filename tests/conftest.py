"""Fixtures and hooks: a session model cache, the loaded model, the corpus's absence said once.
The helpers the tests share are in helpers.py."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from .helpers import CORPUS

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two test processes share the cores (make test). OpenMP's waiting threads spin, and two
    # processes that both spin slow each other down several times over (docs/performance.md,
    # "Several processes at once"). Set before torch loads, and so for each ferrum started here.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_configure(config) -> None:
    """make test's controller (two processes, pytest-xdist): one model cache, made here, that
    both share."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not getattr(config.option, "numprocesses", None):
        return
    if "FERRUM_TEST_KEEP_CACHE" not in os.environ:
        cache = tempfile.mkdtemp(prefix="ferrum-cache-")
        os.environ["FERRUM_CACHE_DIR"] = cache
        config.add_cleanup(lambda: shutil.rmtree(cache, ignore_errors=True))
    os.environ["FERRUM_TEST_SHARED_CACHE"] = "1"


def pytest_sessionstart(session) -> None:
    """Said once, at the top of the run (with -q too), rather than only in each skip's reason."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter and not (CORPUS / "manifest.tsv").exists():
        reporter.write_line(f"corpus: {CORPUS} is absent, so the tests that need it skip (CI has it)", yellow=True)


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """One model cache for the whole run, away from the user's own (with two processes, the
    controller's: pytest_configure)."""
    if "FERRUM_TEST_KEEP_CACHE" not in os.environ and "FERRUM_TEST_SHARED_CACHE" not in os.environ:
        os.environ["FERRUM_CACHE_DIR"] = str(tmp_path_factory.mktemp("ferrum-cache"))


@pytest.fixture(scope="session")
def executor():
    from ferrum_cli import WhisperModelExecutor

    ex = WhisperModelExecutor.from_path("base", device="cpu")
    yield ex
    ex.shutdown()
