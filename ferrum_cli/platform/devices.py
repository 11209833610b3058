"""Which device and dtype a model runs on: what is available, and the choice `auto` makes."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import DeviceError
from .cpu import cpu_name

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
