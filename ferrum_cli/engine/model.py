"""openai-whisper's model, built from any checkpoint format, with a leaner vocabulary projection."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor
from whisper.model import ModelDimensions, MultiHeadAttention, TextDecoder, Whisper

from ..errors import ModelIntegrityError
from ..weights.checkpoints import Weights
from .attention import attention_by_head


class PositionalTextDecoder(TextDecoder):
    """TextDecoder that can project only some positions onto the vocabulary.

    Incremental decoding reads the logits of one or two positions; openai-whisper
    projects all of them (up to 224 prompt rows x 51865 tokens on the first pass).
    """

    def forward(
        self,
        x: Tensor,
        xa: Tensor,
        kv_cache: dict | None = None,
        logit_positions: list[int] | None = None,
    ) -> Tensor:
        offset = next(iter(kv_cache.values())).shape[1] if kv_cache else 0
        x = self.token_embedding(x) + self.positional_embedding[offset : offset + x.shape[-1]]
        x = x.to(xa.dtype)
        for block in self.blocks:
            x = block(x, xa, mask=self.mask, kv_cache=kv_cache)
        if logit_positions is not None:
            x = x[:, logit_positions]
        x = self.ln(x)
        return (x @ torch.transpose(self.token_embedding.weight.to(x.dtype), 0, 1)).float()


class EncoderAttention(MultiHeadAttention):
    """The encoder's self-attention (no mask): on a CPU in bfloat16, head by head where that is
    measured faster than torch's fused kernel (attention.cpu_attention_by_head)."""

    by_head = True  # on a CPU in bfloat16; set per model by use_attention_by_head

    def qkv_attention(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None):
        if not self.by_head or mask is not None or q.device.type != "cpu" or q.dtype != torch.bfloat16:
            return super().qkv_attention(q, k, v, mask)
        heads = [t.view(*t.shape[:2], self.n_head, -1).transpose(1, 2) for t in (q, k, v)]
        return attention_by_head(*heads).transpose(1, 2).flatten(start_dim=2), None


def with_encoder_attention(blocks: Iterable[torch.nn.Module]) -> None:
    """Residual attention blocks of an encoder take EncoderAttention; weights stay as they are."""
    for block in blocks:
        block.attn.__class__ = EncoderAttention


def use_attention_by_head(blocks: Iterable[torch.nn.Module], by_head: bool) -> None:
    """Whether the encoder's attention runs head by head on a CPU in bfloat16, or fused."""
    for block in blocks:
        block.attn.by_head = by_head


class FerrumWhisper(Whisper):
    """openai-whisper's Whisper with PositionalTextDecoder and EncoderAttention; decode() uses
    our decoding task."""

    def __init__(self, dims: ModelDimensions) -> None:
        super().__init__(dims)
        with_encoder_attention(self.encoder.blocks)
        self.decoder = PositionalTextDecoder(
            dims.n_vocab, dims.n_text_ctx, dims.n_text_state, dims.n_text_head, dims.n_text_layer
        )

    def decode(self, mel: Tensor, options=None, **kwargs):  # type: ignore[override]
        from .decoding import decode

        return decode(self, mel, options, **kwargs)


@contextmanager
def _without_random_init() -> Iterator[None]:
    """Random init of weights we overwrite at once is a third of a cold start."""
    classes = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Embedding, torch.nn.LayerNorm)
    saved = [cls.reset_parameters for cls in classes]
    for cls in classes:
        cls.reset_parameters = lambda self: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        for cls, method in zip(classes, saved):
            cls.reset_parameters = method  # type: ignore[method-assign]


def build_model(weights: Weights, device: str, dtype: torch.dtype) -> FerrumWhisper:
    """Construct without random init, then take the checkpoint's tensors."""
    try:
        dims = ModelDimensions(**weights.dims)
    except TypeError as exc:
        raise ModelIntegrityError(f"checkpoint dims are malformed: {exc}") from None
    with _without_random_init():
        model = FerrumWhisper(dims)
    state = {k: v.to(torch.float32) if v.is_floating_point() else v for k, v in weights.state_dict.items()}
    try:
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as exc:
        raise ModelIntegrityError(f"checkpoint does not fit its dims: {str(exc).splitlines()[0]}") from None
    missing = [k for k in missing if not k.endswith("alignment_heads")]
    if missing:
        raise ModelIntegrityError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[0]}")
    heads = torch.zeros(dims.n_text_layer, dims.n_text_head, dtype=torch.bool)
    for layer, head in weights.alignment_heads or []:
        if 0 <= layer < dims.n_text_layer and 0 <= head < dims.n_text_head:
            heads[layer, head] = True
    if not heads.any():
        heads[dims.n_text_layer // 2 :] = True  # openai-whisper's own default
    model.register_buffer("alignment_heads", heads.to_sparse(), persistent=False)
    # float16 holds a float16 checkpoint's weights exactly: the decoder's float16 products need not check
    model.float16_checkpoint = all(
        v.dtype == torch.float16 for v in weights.state_dict.values() if v.is_floating_point()
    )
    model = model.to(device=device, dtype=dtype)
    for module in model.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.float()  # openai-whisper normalizes in float32 and CPU kernels want float32 weights for it
    model.eval()
    return model
