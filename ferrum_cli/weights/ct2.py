"""CTranslate2 Whisper models: a bounds-checked reader of model.bin and its mapping to openai-whisper."""

from __future__ import annotations

import math
import re
import struct
from pathlib import Path

import numpy as np

from ..errors import ModelIntegrityError

# CTranslate2's DataType enum, as written in model.bin.
_DTYPES: dict[int, np.dtype] = {
    0: np.dtype("<f4"),
    1: np.dtype("i1"),
    2: np.dtype("<i2"),
    3: np.dtype("<i4"),
    4: np.dtype("<f2"),
}
_BFLOAT16 = 5


class _Reader:
    def __init__(self, buf: memoryview) -> None:
        self.buf, self.pos = buf, 0

    def take(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise ModelIntegrityError("model.bin is truncated")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def raw(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise ModelIntegrityError("model.bin is truncated")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def text(self) -> str:
        raw = bytes(self.raw(self.take("<H")))
        try:
            return raw.rstrip(b"\0").decode("utf-8")
        except UnicodeDecodeError:
            raise ModelIntegrityError("model.bin has a malformed name") from None


def _bf16_to_f32(raw: memoryview) -> np.ndarray:
    halves = np.frombuffer(raw, "<u2").astype(np.uint32) << 16
    return halves.view(np.float32)


def read_model_bin(data: bytes | memoryview) -> tuple[str, dict[str, np.ndarray]]:
    """(spec name, variables) from the bytes of a model.bin. Aliases point at their targets."""
    r = _Reader(memoryview(data))
    version = r.take("<I")
    if not 1 <= version <= 10:
        raise ModelIntegrityError(f"not a CTranslate2 model.bin (format version {version})")
    spec = r.text()
    r.take("<I")  # spec revision
    variables: dict[str, np.ndarray] = {}
    for _ in range(r.take("<I")):
        name = r.text()
        dims = [r.take("<I") for _ in range(r.take("<B"))]
        dtype_id, nbytes = r.take("<B"), r.take("<I")
        raw = r.raw(nbytes)
        itemsize = 2 if dtype_id == _BFLOAT16 else _DTYPES[dtype_id].itemsize if dtype_id in _DTYPES else 1
        if nbytes % itemsize:
            raise ModelIntegrityError(f"model.bin variable {name!r}: {nbytes} bytes is not a whole number of values")
        if dtype_id == _BFLOAT16:
            arr = _bf16_to_f32(raw)
        elif dtype_id in _DTYPES:
            arr = np.frombuffer(raw, _DTYPES[dtype_id])
        else:
            raise ModelIntegrityError(f"model.bin variable {name!r} has unknown dtype {dtype_id}")
        # the product in Python's integers, which do not wrap; an empty variable's other dimensions
        # can still be too large for numpy to lay out
        if arr.size != math.prod(dims) or math.prod(d for d in dims if d) * arr.itemsize > np.iinfo(np.intp).max:
            raise ModelIntegrityError(f"model.bin variable {name!r}: size does not match its shape")
        variables[name] = arr.reshape(dims)
    if r.pos < len(r.buf):
        for _ in range(r.take("<I")):
            alias, target = r.text(), r.text()
            if target not in variables:
                raise ModelIntegrityError(f"model.bin alias {alias!r} points at nothing")
            variables[alias] = variables[target]
    return spec, variables


def _dequantized(variables: dict[str, np.ndarray], name: str) -> np.ndarray:
    """int8/int16 weights carry a per-row weight_scale: w = q / scale."""
    w = variables[name]
    if w.dtype.kind == "i":
        scale_name = name.rsplit("/", 1)[0] + "/weight_scale"
        if scale_name not in variables:
            raise ModelIntegrityError(f"quantized {name!r} has no weight_scale")
        scale = variables[scale_name].astype(np.float32).reshape(-1, *([1] * (w.ndim - 1)))
        return w.astype(np.float32) / scale
    return w


def _count_layers(variables: dict[str, np.ndarray], side: str) -> int:
    pattern = re.compile(rf"{side}/layer_(\d+)/")
    found = {int(m.group(1)) for k in variables if (m := pattern.match(k))}
    return max(found) + 1 if found else 0


class _StateDict:
    """openai-whisper's state dict, filled from CTranslate2's variables by name."""

    def __init__(self, variables: dict[str, np.ndarray]) -> None:
        self.variables, self.sd = variables, {}

    def get(self, name: str):
        import torch

        if name not in self.variables:
            raise ModelIntegrityError(f"not a Whisper model: {name!r} is missing")
        arr = _dequantized(self.variables, name)
        if arr.dtype not in (np.float16, np.float32):
            arr = arr.astype(np.float32)
        return torch.from_numpy(np.array(arr, copy=True))

    def linear(self, dst: str, src: str) -> None:
        self.sd[f"{dst}.weight"], self.sd[f"{dst}.bias"] = self.get(f"{src}/weight"), self.get(f"{src}/bias")

    def layer_norm(self, dst: str, src: str) -> None:
        self.sd[f"{dst}.weight"], self.sd[f"{dst}.bias"] = self.get(f"{src}/gamma"), self.get(f"{src}/beta")

    def split(self, dst: str, src: str, names: tuple[str, ...]) -> None:
        weights = self.get(f"{src}/weight").chunk(len(names))
        biases = self.get(f"{src}/bias").chunk(len(names))
        for name, w, b in zip(names, weights, biases):
            self.sd[f"{dst}.{name}.weight"] = w.contiguous()
            if name != "key":  # Whisper's key projections have no bias; CT2 stores zeros
                self.sd[f"{dst}.{name}.bias"] = b.contiguous()

    def block(self, dst: str, src: str, cross: bool) -> None:
        self.split(f"{dst}.attn", f"{src}/self_attention/linear_0", ("query", "key", "value"))
        self.linear(f"{dst}.attn.out", f"{src}/self_attention/linear_1")
        self.layer_norm(f"{dst}.attn_ln", f"{src}/self_attention/layer_norm")
        if cross:
            self.linear(f"{dst}.cross_attn.query", f"{src}/attention/linear_0")
            self.split(f"{dst}.cross_attn", f"{src}/attention/linear_1", ("key", "value"))
            self.linear(f"{dst}.cross_attn.out", f"{src}/attention/linear_2")
            self.layer_norm(f"{dst}.cross_attn_ln", f"{src}/attention/layer_norm")
        self.linear(f"{dst}.mlp.0", f"{src}/ffn/linear_0")
        self.linear(f"{dst}.mlp.2", f"{src}/ffn/linear_1")
        self.layer_norm(f"{dst}.mlp_ln", f"{src}/ffn/layer_norm")


def to_openai_state_dict(variables: dict[str, np.ndarray]):
    """Map CTranslate2 names onto openai-whisper's; un-fuse q/k/v and cross-attention k/v.

    Returns (dims, state_dict) with tensors in the checkpoint's float dtype.
    """
    n_enc, n_dec = _count_layers(variables, "encoder"), _count_layers(variables, "decoder")
    if not n_enc or not n_dec:
        raise ModelIntegrityError("not a Whisper model: no encoder or decoder layers")
    out = _StateDict(variables)
    out.linear("encoder.conv1", "encoder/conv1")
    out.linear("encoder.conv2", "encoder/conv2")
    out.sd["encoder.positional_embedding"] = out.get("encoder/position_encodings/encodings")
    for i in range(n_enc):
        out.block(f"encoder.blocks.{i}", f"encoder/layer_{i}", cross=False)
    out.layer_norm("encoder.ln_post", "encoder/layer_norm")
    out.sd["decoder.token_embedding.weight"] = out.get("decoder/embeddings/weight")
    out.sd["decoder.positional_embedding"] = out.get("decoder/position_encodings/encodings")
    for i in range(n_dec):
        out.block(f"decoder.blocks.{i}", f"decoder/layer_{i}", cross=True)
    out.layer_norm("decoder.ln", "decoder/layer_norm")
    return _dims(out.sd, variables, n_enc, n_dec), out.sd


def _dims(sd: dict, variables: dict[str, np.ndarray], n_enc: int, n_dec: int) -> dict:
    """openai-whisper's ModelDimensions, read off the tensors' shapes and the heads CTranslate2 records."""
    conv1, emb = sd["encoder.conv1.weight"], sd["decoder.token_embedding.weight"]
    return {
        "n_mels": conv1.shape[1],
        "n_audio_ctx": sd["encoder.positional_embedding"].shape[0],
        "n_audio_state": conv1.shape[0],
        "n_audio_head": int(np.asarray(variables["encoder/num_heads"]).reshape(-1)[0]),
        "n_audio_layer": n_enc,
        "n_vocab": emb.shape[0],
        "n_text_ctx": sd["decoder.positional_embedding"].shape[0],
        "n_text_state": emb.shape[1],
        "n_text_head": int(np.asarray(variables["decoder/num_heads"]).reshape(-1)[0]),
        "n_text_layer": n_dec,
    }


def read_directory(model_dir: Path) -> tuple[dict, dict, list[list[int]] | None]:
    """(dims, state_dict, alignment heads) of a CTranslate2 model directory."""
    import json

    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text("utf-8")) if config_path.exists() else {}
    spec, variables = read_model_bin((model_dir / "model.bin").read_bytes())
    if "whisper" not in spec.lower():
        raise ModelIntegrityError(f"{model_dir} holds a CTranslate2 {spec!r} model, not Whisper")
    dims, sd = to_openai_state_dict(variables)
    return dims, sd, config.get("alignment_heads")
