"""The attention kernels whose speed depends on the CPU, and the choice between them.

In bfloat16 on a CPU neither torch's fused attention nor the hand-written ways are the faster
everywhere (docs/performance.md), so each choice is timed once per CPU and torch version and the
answer remembered; the way that rounds less is kept unless the other is SPEEDUP_NEEDED times faster.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING

from ..platform.cpu import cpu_flags, cpu_name, single_threaded

if TYPE_CHECKING:  # torch is imported where the model runs, so that the CLI starts before it loads
    from torch import Tensor

SPEEDUP_NEEDED = 1.1  # a path that rounds more (bfloat16, int8, scores in bfloat16) must be clearly faster
ATTENTION_VERSION = 1  # of the remembered choices of the bfloat16 attentions (encoder, cross-attention)


def attention_by_head(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(d)) v for [batch, heads, frames, d], one head at a time into one
    reused score buffer.

    On some CPUs (AMD Zen 5) torch's fused attention is slow in bfloat16 for Whisper's shapes,
    while one head's scores stay in cache between the two products and the softmax; on others
    (a Xeon with AMX) the fused kernel is the faster, so which runs is measured
    (docs/performance.md). In float32 the fused kernel is the faster, so it is used there.
    """
    import torch

    n_batch, n_head, n_frames, width = q.shape
    q = q * width**-0.5
    out = torch.empty(q.shape, dtype=q.dtype)
    scores = torch.empty(n_frames, k.shape[2], dtype=q.dtype)
    with torch.autocast("cpu", enabled=False):  # the inputs are in their dtype already; out= needs that
        for b in range(n_batch):
            for h in range(n_head):
                torch.matmul(q[b, h], k[b, h].transpose(0, 1), out=scores)
                torch.softmax(scores, dim=-1, out=scores)
                torch.matmul(scores, v[b, h], out=out[b, h])
    return out


def features_in_two_products(features: Tensor) -> bool:
    """Whether bfloat16 features on a CPU are attended to in two products rather than torch's
    fused kernel: measured per CPU (cpu_cross_attention_in_two_products)."""
    import torch

    if features.device.type != "cpu" or features.dtype != torch.bfloat16:
        return False
    return cpu_cross_attention_in_two_products()


def attend_features(queries: Tensor, features: Tensor, two_products: bool = False) -> Tensor:
    """softmax(queries features^T) features, for [batch, queries, width] and [batch, frames, width].

    Every head attends over the same features. One fused attention call with the heads as queries
    reads them once; in bfloat16 on some CPUs that kernel is slow for 8 queries, and two products
    (two_products) are the faster there (docs/performance.md). Their second, a sum over 1500
    frames, is taken row by row: oneDNN's batched bfloat16 product rounds a row differently at
    some batch sizes than alone, and a window's text must not depend on its batch.
    """
    import torch
    import torch.nn.functional as F

    if two_products:
        weights = torch.softmax(torch.bmm(queries, features.transpose(1, 2)), dim=-1)
        mixed = torch.empty(queries.shape[0], queries.shape[1], features.shape[2], dtype=features.dtype)
        for row in range(queries.shape[0]):
            torch.mm(weights[row], features[row], out=mixed[row])
        return mixed
    return F.scaled_dot_product_attention(queries[:, None], features[:, None], features[:, None], scale=1.0)[:, 0]


@lru_cache(maxsize=1)
def machine_key() -> str:
    """What a remembered measurement holds for: this CPU and this torch (read once: /proc/cpuinfo
    grows with the cores, and the choices are looked up per decoding batch)."""
    import torch

    return f"{cpu_name()}|{sorted(cpu_flags())}|{torch.__version__}"


def cpu_attention_by_head() -> bool:
    """Whether the encoder's self-attention in bfloat16 runs head by head on this CPU, rather than
    in torch's fused kernel. Neither is the faster on every CPU (docs/performance.md), so both are
    measured once per CPU and torch version, and the answer remembered; the fused kernel, which
    rounds less, unless head by head is SPEEDUP_NEEDED times faster."""
    return _measured_once("cpu-attention", _attention_by_head_measured)


def _measured_once(name: str, measure: Callable[[], bool]) -> bool:
    """measure()'s answer for this CPU and torch, measured once and remembered in the cache."""
    return bool(remembered_for_machine(f"{name}-{ATTENTION_VERSION}", measure))


def remembered_for_machine(name: str, measure: Callable[[], object], detail: str = ""):
    """measure()'s JSON answer for this CPU and torch (and `detail`, what else it depends on),
    measured once and remembered in the cache under name and a hash of them."""
    from ..weights.cache import remembered

    key = hashlib.sha256("|".join(filter(None, (machine_key(), detail))).encode()).hexdigest()[:16]
    return remembered(f"{name}-{key}", measure)


def cpu_cross_attention_in_two_products() -> bool:
    """Whether the decoder's cross-attention over bfloat16 features runs as two products on this
    CPU, rather than torch's fused kernel (attend_features): measured once per CPU and
    torch version, as cpu_attention_by_head is, and the fused kernel, which rounds less (its
    softmax weights stay in float32), kept unless the two products are SPEEDUP_NEEDED times faster."""
    return _measured_once("cpu-cross-attention", _cross_attention_measured)


def _cross_attention_measured() -> bool:
    """Twelve rows' cross-attention of base (8 queries over 1500 frames of width 512) in bfloat16
    each way (best_thread_seconds)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        queries, features = torch.randn(12, 8, 512, dtype=torch.bfloat16), torch.randn(12, 1500, 512).bfloat16()
    seconds = best_thread_seconds(
        {"fused": lambda: attend_features(queries, features), "two": lambda: attend_features(queries, features, True)}
    )
    return seconds["fused"] > SPEEDUP_NEEDED * seconds["two"]


def _attention_by_head_measured() -> bool:
    """One layer's attention of base (8 heads, 1500 frames) in bfloat16 each way (best_thread_seconds)."""
    import torch
    import torch.nn.functional as F

    with torch.random.fork_rng(devices=[]):
        q, k, v = (torch.randn(1, 8, 1500, 64, dtype=torch.bfloat16) for _ in range(3))
    seconds = best_thread_seconds(
        {"fused": lambda: F.scaled_dot_product_attention(q, k, v), "by_head": lambda: attention_by_head(q, k, v)}
    )
    return seconds["fused"] > SPEEDUP_NEEDED * seconds["by_head"]


def best_thread_seconds(ways: dict[str, Callable[[], object]], rounds: int = 3) -> dict[str, float]:
    """Each way's seconds, best of interleaved rounds, timed on one thread in that thread's own CPU
    time: what other processes run does not count, where wall time on every thread let a busy
    machine pick a slower path, which was then remembered (docs/performance.md)."""
    import torch

    best = dict.fromkeys(ways, float("inf"))
    with torch.no_grad(), single_threaded():
        for _ in range(rounds):
            for name, way in ways.items():
                start = time.thread_time()
                way()
                best[name] = min(best[name], time.thread_time() - start)
    return best
