"""Checkpoint formats: openai .pt, Hugging Face directories, CTranslate2 directories.

Each loader returns the same thing, openai-whisper's dims and state dict, so one model
class serves all of them.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ModelIntegrityError, ModelNotFoundError


@dataclass
class Weights:
    dims: dict[str, int]
    state_dict: dict  # name -> torch.Tensor, openai-whisper's names
    alignment_heads: list[list[int]] | None
    format: str  # "openai-pt", "hf", "ct2", "pack", "cache"
    source: str  # the path or pack it came from
    sha256: str  # of the source file (model.bin, .pt, weights file)
    name: str = ""
    extra: dict = field(default_factory=dict)


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


# torch's weights-only unpickler names these where a pickle would import, call or build
# something other than tensors and plain containers; "Unsupported operand" is a file that is no pickle
CODE_IN_PICKLE = ("GLOBAL ", "call reduce", "create new object", "Can only build")


def load_openai_pt(path: Path) -> Weights:
    """weights_only=True: a checkpoint that carries pickled code is refused, never run."""
    import pickle

    import torch

    not_one = f"cannot load checkpoint {path}: it is not a PyTorch checkpoint, or it is damaged"
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except OSError as exc:
        raise ModelIntegrityError(f"cannot load checkpoint {path}: {exc.strerror or exc}") from None
    except pickle.UnpicklingError as exc:  # torch's message for any pickle it refuses says weights_only
        if any(mark in str(exc) for mark in CODE_IN_PICKLE):
            raise ModelIntegrityError(
                f"cannot load checkpoint {path}: it carries pickled code, which ferrum never runs"
            ) from None
        raise ModelIntegrityError(not_one) from None
    except Exception:  # zipfile and pickle raise many types on other files (IndexError on a text file)
        raise ModelIntegrityError(not_one) from None
    if not isinstance(checkpoint, dict) or "dims" not in checkpoint:
        raise ModelIntegrityError(f"{path} is not an openai-whisper checkpoint (no 'dims')")
    heads = checkpoint.get("alignment_heads")
    return Weights(
        dims=dict(checkpoint["dims"]),
        state_dict=checkpoint["model_state_dict"],
        alignment_heads=_heads_from_mask(heads) if heads is not None else None,
        format="openai-pt",
        source=str(path),
        sha256=sha256_file(path),
        name=path.stem,
    )


def _heads_from_mask(mask) -> list[list[int]]:
    import torch

    if isinstance(mask, torch.Tensor):
        return [[int(a), int(b)] for a, b in mask.to_dense().nonzero().tolist()]
    return [list(map(int, pair)) for pair in mask]


# Hugging Face name -> openai-whisper name, for one layer's parameters or the model's own.
_HF_LAYER = {
    "self_attn.q_proj": "attn.query",
    "self_attn.k_proj": "attn.key",
    "self_attn.v_proj": "attn.value",
    "self_attn.out_proj": "attn.out",
    "self_attn_layer_norm": "attn_ln",
    "encoder_attn.q_proj": "cross_attn.query",
    "encoder_attn.k_proj": "cross_attn.key",
    "encoder_attn.v_proj": "cross_attn.value",
    "encoder_attn.out_proj": "cross_attn.out",
    "encoder_attn_layer_norm": "cross_attn_ln",
    "fc1": "mlp.0",
    "fc2": "mlp.2",
    "final_layer_norm": "mlp_ln",
}
_HF_TOP = {
    "encoder.conv1": "encoder.conv1",
    "encoder.conv2": "encoder.conv2",
    "encoder.layer_norm": "encoder.ln_post",
    "decoder.embed_tokens": "decoder.token_embedding",
    "decoder.layer_norm": "decoder.ln",
}
_HF_LAYER_RE = re.compile(r"^(encoder|decoder)\.layers\.(\d+)\.(.+)\.(weight|bias)$")


def hf_to_openai_name(name: str) -> str | None:
    """openai-whisper's name for a Hugging Face parameter; None for ones it does not keep."""
    name = name.removeprefix("model.")
    if name == "proj_out.weight":
        return None  # tied to the token embedding
    if name in ("encoder.embed_positions.weight", "decoder.embed_positions.weight"):
        return name.split(".")[0] + ".positional_embedding"
    if m := _HF_LAYER_RE.match(name):
        side, index, module, kind = m.groups()
        if module in _HF_LAYER:
            return f"{side}.blocks.{index}.{_HF_LAYER[module]}.{kind}"
        return None
    module, _, kind = name.rpartition(".")
    if module in _HF_TOP:
        return f"{_HF_TOP[module]}.{kind}"
    return None


def load_hf_directory(model_dir: Path) -> Weights:
    import torch

    config = json.loads((model_dir / "config.json").read_text("utf-8"))
    if config.get("model_type") != "whisper":
        raise ModelIntegrityError(f"{model_dir} is a {config.get('model_type')!r} model, not Whisper")
    safetensors_path, bin_path = model_dir / "model.safetensors", model_dir / "pytorch_model.bin"
    if safetensors_path.exists():
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            hf_state = load_file(str(safetensors_path))
        except (SafetensorError, OSError) as exc:
            raise ModelIntegrityError(f"cannot read {safetensors_path}: {exc}") from None
        weights_file = safetensors_path
    elif bin_path.exists():
        try:
            hf_state = torch.load(bin_path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise ModelIntegrityError(f"cannot load {bin_path}: {str(exc).splitlines()[0]}") from None
        weights_file = bin_path
    else:
        raise ModelNotFoundError(f"{model_dir} has config.json but no model.safetensors or pytorch_model.bin")
    state = {}
    for hf_name, tensor in hf_state.items():
        if (name := hf_to_openai_name(hf_name)) is not None:
            state[name] = tensor
    dims = {
        "n_mels": config["num_mel_bins"],
        "n_audio_ctx": config["max_source_positions"],
        "n_audio_state": config["d_model"],
        "n_audio_head": config["encoder_attention_heads"],
        "n_audio_layer": config["encoder_layers"],
        "n_vocab": config["vocab_size"],
        "n_text_ctx": config["max_target_positions"],
        "n_text_state": config["d_model"],
        "n_text_head": config["decoder_attention_heads"],
        "n_text_layer": config["decoder_layers"],
    }
    heads = (config.get("generation_config") or {}).get("alignment_heads") or config.get("alignment_heads")
    gen_path = model_dir / "generation_config.json"
    if heads is None and gen_path.exists():
        heads = json.loads(gen_path.read_text("utf-8")).get("alignment_heads")
    return Weights(dims, state, heads, "hf", str(model_dir), sha256_file(weights_file), model_dir.name)


def load_ct2_directory(model_dir: Path) -> Weights:
    from .ct2 import read_directory

    dims, state, heads = read_directory(model_dir)
    return Weights(dims, state, heads, "ct2", str(model_dir), sha256_file(model_dir / "model.bin"), model_dir.name)


def load_path(path: Path) -> Weights:
    """Any checkpoint on disk, by what it holds."""
    if path.is_dir():
        if (path / "model.bin").exists():
            return load_ct2_directory(path)
        if (path / "config.json").exists():
            return load_hf_directory(path)
        raise ModelNotFoundError(
            f"{path} is neither a CTranslate2 (model.bin) nor a Hugging Face (config.json) model directory"
        )
    if path.is_file():
        return load_openai_pt(path)
    raise no_model_at(path)


def no_model_at(path: Path) -> ModelNotFoundError:
    return ModelNotFoundError(f"no such model file or directory: {path}")
