"""Device and compute choice that depends on the machine."""

from __future__ import annotations

import json
import subprocess
from functools import cache

import pytest
import torch

from ferrum_cli.engine import encoder
from ferrum_cli.engine.quantize import Int8Linear
from ferrum_cli.platform import cpu
from ferrum_cli.platform.cpu import full_range_activations, int8_available

from .helpers import FERRUM, JFK, ROOT, corpus, words

AS_AVX2 = ROOT.parent / "shared" / "bench" / "as_avx2.sh"  # hides AVX-512 and AMX from a command (root, Linux)


@cache
def avx2_emulation() -> str | None:
    """Why as_avx2.sh cannot run here, or None when it can."""
    if not AS_AVX2.exists():
        return f"{AS_AVX2} is absent; CI has it"
    probe = subprocess.run([str(AS_AVX2), "true"], capture_output=True, text=True)
    return f"as_avx2.sh does not run here: {probe.stderr.strip()[:200]}" if probe.returncode else None


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


def test_a_cpu_with_avx2_and_nothing_newer_gets_float32_products_and_float16_features():
    """What most users' CPUs get, on this machine with AVX-512 and AMX hidden: `ferrum status`
    names the path and why, and the path transcribes."""
    if (why := avx2_emulation()) is not None:
        pytest.skip(why)
    status = subprocess.run([str(AS_AVX2), FERRUM, "status", "--json"], capture_output=True, text=True, timeout=300)
    assert status.returncode == 0, status.stderr
    path = json.loads(status.stdout)["cpu_path"]
    assert path["instructions"] == "AVX2" and path["torch_kernels"] == "AVX2"
    assert path["encoder"] == "float32" and path["decoder_features"] == "float16"
    assert "AVX2 has no bfloat16 instructions" in path["why"]
    proc = subprocess.run(
        [str(AS_AVX2), FERRUM, "transcribe", str(corpus(JFK)), "--language", "en"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert "ask not what your country can do for you" in words(proc.stdout)
