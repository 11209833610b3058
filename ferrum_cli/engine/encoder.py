"""How the batched engine's encoder computes (`--compute`), and the encoder pass over windows."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from ..errors import DeviceError, UsageError
from ..options import COMPUTES, TranscribeOptions
from ..platform.cpu import (
    cpu_flags,
    cpu_has_native_bf16,
    half_products_available,
    int8_available,
    int8_sums_exactly,
)
from .attention import (
    SPEEDUP_NEEDED,
    best_thread_seconds,
    cpu_attention_by_head,
    cpu_cross_attention_in_two_products,
    remembered_for_machine,
)

if TYPE_CHECKING:  # torch is imported where the model runs, so that the CLI starts before it loads
    import torch

MEASURE_VERSION = 6  # of the remembered timing; 3: int8 measured too; 4: each path against the more exact one;
# 5: on one thread, in its own CPU time; 6: bfloat16 with the attention cpu_attention_by_head chose
ENCODER_BATCH = 1  # windows per encoder pass on a CPU: one window's activations are reused from the heap


@dataclass(frozen=True)
class Compute:
    """How the batched engine computes: the encoder's products, and the dtype of the decoder's
    cross-attention features (see decoding.StaticCacheInference)."""

    encoder: str  # "int8", "bfloat16" (autocast) or the model's own dtype
    cache_dtype: torch.dtype


def check_compute(compute: str) -> None:
    """`--compute` names what the batched engine's encoder computes in on a CPU."""
    if compute not in COMPUTES:
        raise UsageError(f"unknown compute {compute!r}; choose {', '.join(COMPUTES)}")
    if compute == "int8" and not int8_available():
        raise DeviceError("this torch has no int8 matrix product; use auto, float32 or bfloat16")


def plan_compute(model, options: TranscribeOptions) -> Compute:
    """`--compute` on a float32 model on a CPU; GPUs and half-precision models compute in the model's dtype."""
    import torch

    weights = next(model.parameters()).dtype
    if model.device.type != "cpu" or weights != torch.float32:
        return Compute(str(weights).removeprefix("torch."), weights)
    choice = cpu_auto_compute() if options.compute == "auto" else options.compute
    return Compute(choice, torch.bfloat16 if choice == "bfloat16" else cpu_feature_dtype())


def cpu_feature_dtype() -> torch.dtype:
    """The decoder's cross-attention features where the encoder is not in bfloat16: float16 on
    fbgemm's float16-weight products (half the reading, float32 sums), else float32."""
    import torch

    return torch.float16 if half_products_available() else torch.float32


def cpu_auto_compute() -> str:
    """What `--compute auto` runs the encoder in on this CPU: float32, bfloat16 or int8.

    Instructions do not make a compute faster on every CPU (docs/performance.md), so each one
    this CPU can run as well as float32 is measured once per CPU and torch version, and the
    answer remembered: bfloat16 where it has bfloat16 instructions, int8 where
    its int8 products sum 8-bit operands exactly (VNNI; AVX2's, whose weights are held to what
    its 16-bit pair sums take, change words: docs/performance.md).
    """
    candidates = _auto_candidates()
    if candidates == ["float32"]:
        return "float32"
    answer = remembered_for_machine(f"cpu-compute-{MEASURE_VERSION}", lambda: _fastest(candidates), str(candidates))
    return answer if answer in candidates else "float32"


def _auto_candidates() -> list[str]:
    return ["float32"] + ["bfloat16"] * cpu_has_native_bf16() + ["int8"] * int8_sums_exactly()


def cpu_path() -> dict:
    """Which path the batched engine takes on this CPU, and why (`ferrum status`)."""
    import torch

    flags = cpu_flags()
    named = [("amx_bf16", "AMX"), ("avx512_bf16", "AVX512-BF16"), ("avx512f", "AVX-512"), ("avx2", "AVX2")]
    best = next((name for flag, name in named if flag in flags), "below AVX2")
    encoder = cpu_auto_compute()
    in_bfloat16 = encoder == "bfloat16"  # its attention, and the decoder's over its features, are measured too
    measured = [c for c in _auto_candidates() if c != "float32"]
    if encoder != "float32":
        why = (
            f"{encoder} products measured the fastest on this {best} CPU, at least {SPEEDUP_NEEDED}x "
            "float32 and any more exact path"
        )
    elif measured:
        why = f"{' and '.join(measured)} products were not {SPEEDUP_NEEDED}x float32 on this {best} CPU"
    else:
        why = f"{best} has no bfloat16 instructions"
    if "int8" not in measured:
        why += (
            "; int8 products here add pairs of products in 16 bits (no VNNI), so int8 (--compute int8) "
            "keeps each pair of weights' sum within +-128, which changes a few words, and auto never picks it"
            if int8_available()
            else "; no int8 products in this torch"
        )
    return {
        "instructions": best,
        "torch_kernels": torch.backends.cpu.get_cpu_capability(),  # what ATen dispatches to
        "encoder": encoder,
        "encoder_attention": "head by head" if in_bfloat16 and cpu_attention_by_head() else "fused",
        "cross_attention": "two products" if in_bfloat16 and cpu_cross_attention_in_two_products() else "fused",
        "decoder_features": "bfloat16" if encoder == "bfloat16" else str(cpu_feature_dtype()).removeprefix("torch."),
        "int8_kernels": "exact" if int8_sums_exactly() else "16-bit pairs" if int8_available() else None,
        "why": why,
    }


def _fastest(candidates: list[str]) -> str:
    """The candidate in which one encoder block of base runs the fastest, as _pick takes it."""
    return _pick(_block_seconds(candidates))


def _pick(seconds: dict[str, float], speedup_needed: float = SPEEDUP_NEEDED) -> str:
    """seconds' keys go from the most exact path; each is taken only when speedup_needed times
    faster than the one chosen before it, so that two paths of about one speed (bfloat16 and
    int8) do not swap run to run."""
    chosen = "float32"
    for compute in seconds:  # from the most exact: each rounds more, so it must be clearly faster
        if seconds[chosen] > speedup_needed * seconds[compute]:
            chosen = compute
    return chosen


def _block_seconds(candidates: list[str]) -> dict[str, float]:
    """CPU seconds of one encoder block of base (1500 frames, width 512) in each candidate, as
    the encoder runs it (attention.best_thread_seconds)."""
    import torch
    from whisper.model import ResidualAttentionBlock

    from .model import use_attention_by_head, with_encoder_attention
    from .quantize import int8_layers

    with torch.random.fork_rng(devices=[]):  # the caller's random state stays as it was
        block, x = ResidualAttentionBlock(512, 8).eval(), torch.randn(1, 1500, 512)
    with_encoder_attention([block])
    if "bfloat16" in candidates:
        use_attention_by_head([block], cpu_attention_by_head())
    blocks = dict.fromkeys(candidates, block)
    if "int8" in blocks:  # a candidate only where the products sum exactly
        blocks["int8"] = int8_layers(block, pairs_in_16_bits=False)

    def run(compute: str) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=compute == "bfloat16"):
            blocks[compute](x)

    return best_thread_seconds({compute: partial(run, compute) for compute in candidates})


def _stft_long(samples: np.ndarray, n_fft: int) -> np.ndarray:
    """Samples that the STFT's reflected padding (n_fft // 2 either side) can read: a window of
    a few milliseconds (a damaged file's) failed it, as the silence after it that openai-whisper
    pads with would not have."""
    return samples if len(samples) > n_fft // 2 else np.pad(samples, (0, n_fft // 2 + 1 - len(samples)))


def encode_windows(model, windows: list[np.ndarray], compute: str | None = None) -> torch.Tensor:
    """[windows, 1500, width] encoder output for windows of samples, each padded to 30 s of log-mel:
    int8 products, autocast to bfloat16, or (None) the model's own dtype."""
    import torch
    from whisper.audio import N_FFT, N_FRAMES, log_mel_spectrogram, pad_or_trim

    from ..platform.devices import torch_dtype

    weights = next(model.parameters()).dtype
    encoder, dtype = model.encoder, weights
    if compute == "int8":
        from .quantize import int8_encoder

        encoder = int8_encoder(model)
    elif compute is not None:
        dtype = torch_dtype(compute)
    if dtype == torch.bfloat16 and model.device.type == "cpu":
        from .model import use_attention_by_head

        use_attention_by_head(encoder.blocks, cpu_attention_by_head())
    step = ENCODER_BATCH if model.device.type == "cpu" else len(windows)
    out = []
    for i in range(0, len(windows), max(step, 1)):
        mels = [
            pad_or_trim(log_mel_spectrogram(torch.from_numpy(_stft_long(w, N_FFT)), model.dims.n_mels), N_FRAMES)
            for w in windows[i : i + step]
        ]
        mel = torch.stack(mels).to(model.device, weights)
        with torch.no_grad(), torch.autocast(model.device.type, dtype=dtype, enabled=dtype != weights):
            out.append(encoder(mel).to(weights))
    return out[0] if len(out) == 1 else torch.cat(out)
