"""What the CPU can do: its name, its instruction sets, and the int8 kernels torch has for it."""

from __future__ import annotations


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
    """fbgemm (x86) with its int8 dynamic linear."""
    import torch

    return "fbgemm" in torch.backends.quantized.supported_engines and hasattr(torch.ops.quantized, "linear_dynamic")


def full_range_activations() -> bool:
    """8-bit activations need VNNI: without it fbgemm's 16-bit pair sums can saturate, so 7 bits."""
    return "avx512_vnni" in cpu_flags()
