"""What the CPU can do: its name, its instruction sets, and the int8 kernels torch has for it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager
from functools import lru_cache
from typing import TypeVar

T = TypeVar("T")


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, as taskset and containers' cpusets set it)."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            line = next((line for line in fh if line.startswith("flags")), "")
    except OSError:
        return set()
    return set(line.split(":", 1)[-1].split())


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX: the CPU has bfloat16 instructions (which alone does not make them faster)."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def int8_available() -> bool:
    """torch's int8 matrix product (torch._int_mm) runs on this CPU."""
    return _int8_probe() is not None


def int8_sums_exactly() -> bool:
    """Whether this CPU's int8 product sums 8-bit operands exactly. VNNI adds each product into
    32 bits; AVX2 alone (vpmaddubsw) adds pairs of them into 16 bits, which saturate unless each
    pair of weights sums within +-128 (quantize.Int8Linear). Probed, since torch's kernels, not
    the flags, decide."""
    return _int8_probe() is True


@lru_cache(maxsize=1)
def _int8_probe() -> bool | None:
    """None: no int8 product; else whether full-scale operands came out exact."""
    import torch

    if not hasattr(torch, "_int_mm"):
        return None
    full = torch.full((64, 512), 127, dtype=torch.int8)
    try:
        with single_threaded():  # the caller may be a thread that must not keep an OpenMP pool
            summed = torch._int_mm(full, full.t())  # weights laid out as Int8Linear keeps them
    except RuntimeError:
        return None
    return bool((summed == 127 * 127 * 512).all())


def half_products_available() -> bool:
    """fbgemm (x86) with its float16-weight linear, which computes in float32."""
    import torch

    return "fbgemm" in torch.backends.quantized.supported_engines and hasattr(
        torch.ops.quantized, "linear_prepack_fp16"
    )


class Background:
    """work() on a thread from now; result() waits for it and returns its value, or raises its
    exception on the caller's thread. daemon False: a process that ends waits for it."""

    def __init__(self, work: Callable[[], T], name: str, daemon: bool = True) -> None:
        self._outcome: dict = {}
        self._thread = threading.Thread(target=self._run, args=(work,), name=name, daemon=daemon)
        self._thread.start()

    def _run(self, work: Callable[[], T]) -> None:
        try:
            self._outcome["value"] = work()
        except BaseException as exc:  # handed to the caller as it is
            self._outcome["error"] = exc

    def result(self) -> T:
        self._thread.join()
        if "error" in self._outcome:
            raise self._outcome["error"]
        return self._outcome["value"]


def on_own_thread(work: Callable[[], T]) -> T:
    """work() on a thread that ends with it.

    torch's OpenMP keeps a pool of threads for each thread that has run parallel work, for the
    thread's life. While two such threads live on the same cores, every op pays for waking pool
    threads that went to sleep (docs/performance.md). Loading a model this way leaves the caller
    without a pool, so that an engine thread started later is the only one.
    """
    return Background(work, "ferrum-load").result()


@contextmanager
def single_threaded(after: int | None = None):
    """torch on one thread within: for small ops that run no slower so (Silero's steps), on a
    thread that must not keep an OpenMP pool beside the engine's (see on_own_thread).

    after: the thread count to set on leaving, where not this thread's own. torch's count is also
    the one a thread starting later begins with, so helper threads that share a task leave the
    count their caller had, whichever of them leaves last."""
    import torch

    threads = torch.get_num_threads() if after is None else after
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
