"""Device and compute choice that depends on the machine."""

from __future__ import annotations

import json

import pytest
import torch

from ferrum_cli.engine import encoder
from ferrum_cli.engine.quantize import Int8Linear
from ferrum_cli.platform import cpu
from ferrum_cli.platform.cpu import full_range_activations, int8_available


def test_auto_compute_is_measured_once_per_machine_and_remembered(tmp_path, monkeypatch):
    monkeypatch.setenv("FERRUM_CACHE_DIR", str(tmp_path))
    first = encoder.cpu_auto_compute()
    remembered = list((tmp_path / "derived").glob("cpu-bfloat16-faster-*.json"))
    if not cpu.cpu_has_native_bf16():
        assert first == "float32" and remembered == []  # no bfloat16 instructions: nothing to measure
        return
    assert len(remembered) == 1 and json.loads(remembered[0].read_text()) is (first == "bfloat16")
    remembered[0].write_text(json.dumps(first != "bfloat16"))  # a later run reads the answer, not the clock
    assert encoder.cpu_auto_compute() != first


@pytest.mark.skipif(not int8_available(), reason="int8 products need torch's fbgemm engine (x86)")
def test_an_int8_linear_layer_stays_close_to_float32():
    reduce_range = not full_range_activations()  # 7-bit activations where 8 could saturate
    torch.manual_seed(0)
    linear = torch.nn.Linear(512, 2048)
    x = torch.randn(3, 1500, 512)
    with torch.no_grad():
        exact, rounded = linear(x), Int8Linear(linear, reduce_range)(x)
    assert rounded.shape == exact.shape
    assert ((rounded - exact).norm() / exact.norm()).item() < (0.03 if reduce_range else 0.02)
