"""int8 products for the encoder's linear layers (`--compute int8`, and `auto` where it is the
fastest and the products sum exactly).

As CTranslate2 rounds them: each weight row (output channel) to int8 with a scale of its own,
once per model; each activation row (one frame) with a scale of its own, per product. A frame's
own scale holds the outliers some frames have, where one scale for the whole product (fbgemm's
dynamic linear) had to leave the layers that read them in float32 (docs/performance.md).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from ..platform.cpu import int8_sums_exactly
from .derived import derived

LAYERS = (("attn", "query"), ("attn", "key"), ("attn", "value"), ("attn", "out"), ("mlp", "0"), ("mlp", "2"))


class Int8Linear(nn.Module):
    """A linear layer as an int8 product: weights per output channel, activations per row.

    pairs_in_16_bits: the CPU's int8 product (AVX2 without VNNI, vpmaddubsw) adds the products of
    inputs 2j and 2j+1 in 16 bits, against activations shifted to 0..255, so each such pair of a
    row's weights must sum within +-128 or the sum saturates. The row's scale is then set by its
    largest pair sum as well as by its largest weight, which keeps most of the eighth bit that
    7-bit weights threw away (docs/performance.md)."""

    def __init__(self, linear: nn.Linear, pairs_in_16_bits: bool = False) -> None:
        super().__init__()
        weight = linear.weight.detach().float()  # [out, in]
        largest = weight.abs().amax(dim=1)
        if pairs_in_16_bits:  # an odd width's last input is paired with nothing: a zero
            pairs = nn.functional.pad(weight, (0, weight.shape[1] % 2)).view(weight.shape[0], -1, 2).sum(-1)
            largest = torch.maximum(largest, pairs.abs().amax(dim=1))  # rounding adds at most 1: 128
        self.weight_scale = (largest / 127).clamp(min=1e-12)  # [out]
        self.weight_t = torch.round(weight / self.weight_scale[:, None]).to(torch.int8).t()  # [in, out]
        self.bias = None if linear.bias is None else linear.bias.detach().float()

    def forward(self, x: Tensor) -> Tensor:
        """x [..., in] float -> [..., out] float32."""
        rows = x.reshape(-1, x.shape[-1]).float()
        scale = (rows.abs().amax(dim=-1, keepdim=True) / 127).clamp(min=1e-12)  # [rows, 1]
        quantized = (rows / scale).round_().to(torch.int8)
        out = torch._int_mm(quantized, self.weight_t).float().mul_(scale).mul_(self.weight_scale)
        if self.bias is not None:
            out.add_(self.bias)
        return out.view(*x.shape[:-1], out.shape[-1])


def _shallow(module: nn.Module) -> nn.Module:
    """A copy that shares every parameter, buffer, hook and child, with its own table of children."""
    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    return clone


def int8_layers(block: nn.Module, pairs_in_16_bits: bool) -> nn.Module:
    """A residual attention block whose six linear layers are Int8Linear; the rest is shared."""
    clone, parts = _shallow(block), {part: _shallow(getattr(block, part)) for part, _ in LAYERS}
    for part, name in LAYERS:
        parts[part]._modules[name] = Int8Linear(getattr(block, part)._modules[name], pairs_in_16_bits)
    clone._modules.update(parts)
    return clone


def int8_encoder(model) -> nn.Module:
    """The model's encoder with int8_layers in every block, built once and kept on the model."""

    def build() -> nn.Module:
        pairs = not int8_sums_exactly()
        encoder = _shallow(model.encoder)
        encoder._modules["blocks"] = nn.ModuleList(int8_layers(b, pairs) for b in model.encoder.blocks)
        return encoder

    return derived(model, "int8 encoder", build)
