"""Device and dtype choice."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import DeviceError, UsageError

DTYPES = ("float32", "float16", "bfloat16")


def available_devices() -> list[str]:
    import torch

    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        devices.append("mps")
    return devices


def describe_devices() -> list[dict]:
    """Each device with its memory, for `ferrum status`."""
    import torch

    out = []
    for name in available_devices():
        if name.startswith("cuda"):
            props = torch.cuda.get_device_properties(int(name.split(":")[1]))
            out.append({"device": name, "name": props.name, "memory_bytes": props.total_memory})
        elif name == "cpu":
            out.append({"device": "cpu", "name": cpu_name(), "memory_bytes": _total_ram()})
        else:
            out.append({"device": name, "name": "Apple GPU", "memory_bytes": _total_ram()})
    return out


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _total_ram() -> int:
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


@dataclass(frozen=True)
class Placement:
    device: str
    dtype: str


def choose(device: str = "auto", dtype: str = "auto") -> Placement:
    """auto: cuda, then mps, then cpu; float16 on GPUs, float32 on CPU."""
    available = available_devices()
    device = (device or "auto").lower()
    if device == "auto":
        device = next((d for d in available if d.startswith("cuda")), None) or ("mps" if "mps" in available else "cpu")
    elif device == "cuda":
        device = "cuda:0"
    if device not in available:
        raise DeviceError(f"device {device!r} is not available here; available: {', '.join(available)}")
    dtype = (dtype or "auto").lower()
    if dtype == "auto":
        dtype = "float32" if device == "cpu" else "float16"
    if dtype not in DTYPES:
        raise DeviceError(f"unknown dtype {dtype!r}; choose auto, {', '.join(DTYPES)}")
    if not dtype_supported(device, dtype):
        usable = [d for d in DTYPES if dtype_supported(device, d)]
        raise DeviceError(f"{device} cannot run {dtype}; usable there: {', '.join(usable)}")
    return Placement(device, dtype)


def dtype_supported(device: str, dtype: str) -> bool:
    import torch

    if dtype == "float32":
        return True
    if device == "cpu":
        # float16 matmuls on CPU are emulated and slow but correct; bfloat16 is native with AVX512-BF16/AMX.
        return True
    if device.startswith("cuda"):
        return dtype != "bfloat16" or torch.cuda.is_bf16_supported()
    return dtype == "float16"


def torch_dtype(dtype: str):
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]


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


CPU_COMPUTES = ("float32", "bfloat16", "int8")
SPEEDUP_NEEDED = 1.1  # bfloat16 rounds the encoder's products: worth it only when faster


def check_compute(compute: str) -> None:
    """`--compute` names what the batched engine's encoder computes in on a CPU."""
    if compute not in ("auto", *CPU_COMPUTES):
        raise UsageError(f"unknown compute {compute!r}; choose auto, {', '.join(CPU_COMPUTES)}")
    if compute == "int8":
        from .quantize import int8_available

        if not int8_available():
            raise DeviceError("int8 needs torch's fbgemm engine (x86 CPUs); use auto, float32 or bfloat16")


def cpu_auto_compute() -> str:
    """What `--compute auto` runs the batched engine's encoder in on this CPU: float32 or bfloat16.

    The flags do not settle it. With AMX, and on AMD's Zen 5 (0.15 s a window against 0.54 s),
    base's encoder runs 1.5-3x faster in bfloat16; on an Intel Xeon with AVX512-BF16 but no AMX
    it ran slower (0.60 s a window against 0.37 s in float32, with torch's fused attention). So it
    is measured, once per CPU, torch version and thread count, and remembered. int8 is never
    automatic: it changes words on the corpus (see quantize.py).
    """
    if not cpu_has_native_bf16():
        return "float32"
    import hashlib

    import torch

    from .cache import remembered

    machine = f"{cpu_name()}|{sorted(cpu_flags())}|{torch.__version__}|{torch.get_num_threads()}"
    key = hashlib.sha256(machine.encode()).hexdigest()[:16]
    answer = remembered(f"cpu-bfloat16-faster-{MEASURE_VERSION}-{key}", _bfloat16_measured_faster)
    return "bfloat16" if answer is True else "float32"


MEASURE_VERSION = 2  # 2: the block's attention as the encoder runs it (model.EncoderAttention)


def _bfloat16_measured_faster() -> bool:
    """One encoder block of base (1500 frames, width 512) in float32 and in bfloat16 autocast,
    as the encoder runs it, best of interleaved rounds (a slow spell hits both)."""
    import time

    import torch
    from whisper.model import ResidualAttentionBlock

    from .model import with_encoder_attention

    with torch.random.fork_rng(devices=[]):  # the caller's random state stays as it was
        block, x = ResidualAttentionBlock(512, 8).eval(), torch.randn(1, 1500, 512)
    with_encoder_attention([block])
    best = {torch.float32: float("inf"), torch.bfloat16: float("inf")}
    with torch.no_grad():
        for _ in range(3):
            for dtype in best:
                start = time.perf_counter()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
                    block(x)
                best[dtype] = min(best[dtype], time.perf_counter() - start)
    return best[torch.float32] > SPEEDUP_NEEDED * best[torch.bfloat16]
