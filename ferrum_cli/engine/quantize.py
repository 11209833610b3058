"""`--compute int8`: int8 products for the encoder's layers that read a layer norm (x86, fbgemm).

Weights are rounded to int8 once per model, with one scale per output channel; activations are
rounded per product by fbgemm's dynamic linear, with one scale for the whole product. That suits
the query, key and value projections and the first MLP layer, which read a layer norm's output;
the other layers read activations with outliers that one scale cannot hold. Words change
(docs/performance.md), so int8 is asked for, never automatic.
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import Tensor, nn

from ..platform.cpu import full_range_activations
from .derived import derived


class Int8Linear(nn.Module):
    """A linear layer as fbgemm's int8 product: per-channel weights, per-product activations."""

    def __init__(self, linear: nn.Linear, reduce_range: bool) -> None:
        super().__init__()
        weight = linear.weight.detach().float()
        scales = (weight.abs().amax(dim=1) / 127).clamp(min=1e-12).double()
        zero_points = torch.zeros(weight.shape[0], dtype=torch.long)
        with warnings.catch_warnings():  # torch marks quantized tensors as deprecated
            warnings.simplefilter("ignore", UserWarning)
            qweight = torch.quantize_per_channel(weight, scales, zero_points, 0, torch.qint8)
        bias = None if linear.bias is None else linear.bias.detach().float()
        self.packed = torch.ops.quantized.linear_prepack(qweight, bias)
        self.reduce_range = reduce_range

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.quantized.linear_dynamic(x, self.packed, self.reduce_range)


def _shallow(module: nn.Module) -> nn.Module:
    """A copy that shares every parameter, buffer, hook and child, with its own table of children."""
    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    return clone


def int8_layers(block: nn.Module, reduce_range: bool) -> nn.Module:
    """A residual attention block whose query, key, value and first MLP layers are Int8Linear."""
    clone, attn, mlp = _shallow(block), _shallow(block.attn), _shallow(block.mlp)
    for name in ("query", "key", "value"):
        attn._modules[name] = Int8Linear(getattr(block.attn, name), reduce_range)
    mlp._modules["0"] = Int8Linear(block.mlp[0], reduce_range)
    clone._modules["attn"], clone._modules["mlp"] = attn, mlp
    return clone


def int8_encoder(model) -> nn.Module:
    """The model's encoder with int8_layers in every block, built once and kept on the model."""

    def build() -> nn.Module:
        reduce_range = not full_range_activations()
        encoder = _shallow(model.encoder)
        encoder._modules["blocks"] = nn.ModuleList(int8_layers(b, reduce_range) for b in model.encoder.blocks)
        return encoder

    return derived(model, "int8 encoder", build)
