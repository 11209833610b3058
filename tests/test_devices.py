"""Device and compute choice that depends on the machine."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from functools import cache

import pytest
import torch

from ferrum_cli.engine import attention, encoder
from ferrum_cli.engine.quantize import Int8Linear
from ferrum_cli.options import TranscribeOptions
from ferrum_cli.platform.cpu import int8_available, int8_sums_exactly, usable_cpus

from .helpers import FERRUM, JFK, ROOT, corpus, corpus_rows, errors_against, needs_corpus, words

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
    remembered = list((tmp_path / "derived").glob("cpu-compute-*.json"))
    candidates = encoder._auto_candidates()
    if candidates == ["float32"]:
        assert first == "float32" and remembered == []  # nothing but float32 to run: nothing to measure
        return
    assert len(remembered) == 1 and json.loads(remembered[0].read_text()) == first and first in candidates
    other = next(c for c in candidates if c != first)
    remembered[0].write_text(json.dumps(other))  # a later run reads the answer, not the clock
    assert encoder.cpu_auto_compute() == other


def test_the_bfloat16_attention_is_measured_once_per_machine_and_the_model_runs_it(tmp_path, monkeypatch):
    """Head by head or torch's fused kernel in the encoder, two products or the fused kernel in
    the decoder's cross-attention: on 2 Zen 5 cores the first of each was the faster, on this
    Xeon with AMX the fused ones (docs/performance.md), so it is measured, not assumed."""
    import numpy as np

    from ferrum_cli.engine.encoder import encode_windows
    from ferrum_cli.engine.model import FerrumWhisper, ModelDimensions

    monkeypatch.setenv("FERRUM_CACHE_DIR", str(tmp_path))
    first = attention.cpu_attention_by_head()
    (remembered,) = (tmp_path / "derived").glob("cpu-attention-*.json")
    assert json.loads(remembered.read_text()) is first
    remembered.write_text(json.dumps(not first))  # a later run reads the answer, not the clock
    assert attention.cpu_attention_by_head() is (not first)

    dims = ModelDimensions(80, 1500, 64, 1, 1, 51865, 448, 64, 1, 1)
    model = FerrumWhisper(dims).eval()
    encode_windows(model, [np.zeros(16000, np.float32)], "bfloat16")
    assert [block.attn.by_head for block in model.encoder.blocks] == [not first]

    from ferrum_cli.engine.decoding import StaticCacheInference

    two_products = attention.cpu_cross_attention_in_two_products()  # the decoder's, over bfloat16 features
    (remembered,) = (tmp_path / "derived").glob("cpu-cross-attention-*.json")
    remembered.write_text(json.dumps(not two_products))
    with torch.no_grad():
        inference = StaticCacheInference(model, initial_token_length=3, sot_index=0, cache_dtype=torch.bfloat16)
        inference.logits(torch.tensor([[50258, 50259, 50359]]), torch.randn(1, 1500, 64))
    assert inference.two_products is (not two_products)


# torch products in bursts on every core, as a build or another model beside ferrum runs them
BUSY = (
    "import time, torch\na = torch.randn(512, 512)\nwhile True:\n    [a @ a for _ in range(50)]\n    time.sleep(0.003)"
)


def test_auto_compute_picks_the_same_path_on_a_busy_machine():
    """The first run on a machine remembers its path for good, so what other processes run then
    must not tip it: timed by the clock on every thread, it picked int8 or float32 over bfloat16
    in a third of the tries beside such processes, and int8 reads words differently."""
    candidates = encoder._auto_candidates()
    if candidates == ["float32"]:
        pytest.skip("this CPU has only float32 for the encoder: nothing is measured")
    quiet = encoder._block_seconds(candidates)
    picked = encoder._pick(quiet)
    if (
        not encoder._pick(quiet, encoder.SPEEDUP_NEEDED * 0.8)
        == picked
        == encoder._pick(quiet, encoder.SPEEDUP_NEEDED * 1.2)
    ):
        pytest.skip(f"two paths here are within 20% of the speed-up that decides between them: {quiet}")
    # as a user's process runs: OpenMP's threads spin a while before they sleep (conftest)
    environment = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    busy_processes = min(usable_cpus(), 8)  # one per CPU, each a torch process of about 250 MB, at most 8
    load = [subprocess.Popen([sys.executable, "-c", BUSY], env=environment) for _ in range(busy_processes)]
    measure = (
        f"from ferrum_cli.engine import encoder; print(repr([encoder._fastest({candidates!r}) for _ in range(5)]))"
    )
    try:
        time.sleep(2)  # torch imported, the bursts running
        run = subprocess.run([sys.executable, "-c", measure], env=environment, capture_output=True, text=True)
    finally:
        for process in load:
            process.kill()
            process.wait()
    assert run.returncode == 0, run.stderr
    busy = ast.literal_eval(run.stdout.strip())
    assert busy == [picked] * 5


@pytest.mark.skipif(not int8_available(), reason="this torch has no int8 matrix product")
def test_an_int8_linear_layer_stays_close_to_float32():
    """Weights rounded per output channel, each frame per row, as this CPU's product sums them."""
    pairs = not int8_sums_exactly()
    torch.manual_seed(0)
    linear = torch.nn.Linear(512, 2048)
    x = torch.randn(1, 1500, 512) * torch.logspace(-2, 1, 1500)[None, :, None]  # frames 1,000x apart in level
    x[0, 7, 3] = 300.0  # and one outlier, which only its own frame's scale takes
    with torch.no_grad():
        exact, rounded = linear(x), Int8Linear(linear, pairs)(x)
    assert rounded.shape == exact.shape and rounded.dtype == torch.float32
    per_frame = (rounded - exact).norm(dim=-1) / exact.norm(dim=-1)
    assert per_frame.max().item() < (0.03 if pairs else 0.015)


def test_weights_for_products_that_add_pairs_in_16_bits_keep_most_of_their_eighth_bit():
    """Where the product adds inputs 2j and 2j+1 in 16 bits, each such pair of a row's weights
    sums within +-128, and the row's scale is set by that and by its largest weight, not halved
    for all (7-bit weights): on weights spread as Whisper's are (bell-shaped, a few outliers),
    the rounding error stays near 8-bit weights' and well under 7-bit ones'."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(511, 256)  # an odd width: the last input is paired with nothing
    with torch.no_grad():
        linear.weight.copy_(torch.randn(256, 511) * 0.05)
        linear.weight[3, 10] = 0.6  # an outlier, which sets its row's scale either way
    weight = linear.weight.detach()

    def rounding_error(layer: Int8Linear) -> float:
        return ((layer.weight_t.t().float() * layer.weight_scale[:, None] - weight).norm() / weight.norm()).item()

    eight, paired = Int8Linear(linear), Int8Linear(linear, pairs_in_16_bits=True)
    sums = torch.nn.functional.pad(paired.weight_t.t().int(), (0, 1)).view(256, -1, 2).sum(-1)
    assert sums.abs().max().item() <= 128 and paired.weight_t.abs().max().item() <= 127
    seven = eight.weight_scale * 127 / 63  # 7-bit weights' scale, what these products took before
    assert rounding_error(paired) < 1.35 * rounding_error(eight)
    assert (paired.weight_scale / seven).mean().item() < 0.7  # Whisper base's encoder: 0.61
    assert paired.weight_scale[3].item() == pytest.approx(eight.weight_scale[3].item(), rel=0.02)


def test_int8_products_without_vnni_overflow_8_bit_weights_and_sum_pair_held_ones_exactly():
    """On an AVX2 CPU (emulated) the int8 product adds pairs of u8 x s8 products in 16 bits:
    8-bit weights against full-scale frames saturate; ferrum's weights, each pair of them held
    within +-128, sum exactly."""
    if (why := avx2_emulation()) is not None:
        pytest.skip(why)
    script = (
        "import torch\n"
        "from ferrum_cli.engine.quantize import Int8Linear\n"
        "from ferrum_cli.platform.cpu import int8_sums_exactly\n"
        "torch.manual_seed(0)\n"
        "linear, x = torch.nn.Linear(512, 512), torch.randn(1500, 512)\n"
        "with torch.no_grad():\n"
        "    exact = linear(x)\n"
        "    for pairs in (False, True):\n"
        "        layer = Int8Linear(linear, pairs)\n"
        "        scale = x.abs().amax(-1, keepdim=True) / 127\n"
        "        frames = (x / scale).round().to(torch.int8)\n"
        "        summed = torch._int_mm(frames, layer.weight_t).long()\n"
        "        exact_sum = frames.long() @ layer.weight_t.long()\n"
        "        print(pairs, torch.equal(summed, exact_sum), ((layer(x) - exact).norm() / exact.norm()).item())\n"
        "print(int8_sums_exactly())\n"
    )
    proc = subprocess.run([str(AS_AVX2), sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    eight, paired, exact = proc.stdout.split("\n")[:3]
    assert exact == "False"  # the probe finds it so
    assert eight.split()[1] == "False" and float(eight.split()[2]) > 0.1, proc.stdout
    assert paired.split()[1] == "True" and float(paired.split()[2]) < 0.03, proc.stdout


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


@needs_corpus
@pytest.mark.skipif(not int8_available(), reason="this torch has no int8 matrix product")
def test_int8_reads_the_corpus_as_float32_does_within_a_word_or_two(executor):
    """The referenced clips of every language under 10 s, each alone in its language, and the
    English ones packed: int8 products (as this CPU runs them) make at most two word errors
    more in total than float32, and no clip more than one."""
    rows = [r for r in corpus_rows() if r["reference_transcript"] != "none" and float(r["duration_seconds"]) < 10]
    english = [r for r in rows if r["language"] == "en"]

    def errors(compute: str) -> dict[str, int]:
        counts = {}
        for row in rows:
            if row["language"] != "en":
                text = executor.transcribe(row["path"], TranscribeOptions(language=row["language"], compute=compute))
                counts[row["file"]] = errors_against(row["reference_transcript"], text.text, row["language"])
        options = TranscribeOptions(language="en", compute=compute)
        packed = dict(executor.transcribe_many([(r["path"], r["path"]) for r in english], options))
        for row in english:
            counts[row["file"]] = errors_against(row["reference_transcript"], packed[row["path"]].text, "en")
        return counts

    exact, rounded = errors("float32"), errors("int8")
    assert sum(rounded.values()) <= sum(exact.values()) + 2, (exact, rounded)
    assert all(rounded[name] <= exact[name] + 1 for name in exact), (exact, rounded)
