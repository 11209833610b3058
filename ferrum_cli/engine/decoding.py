"""The decoding engine: openai-whisper's DecodingTask, with less work per token.

- Only the positions that are read (the SOT position on the first pass, then the last
  one) are projected onto the vocabulary.
- With greedy decoding and sampling, sequences that reach end-of-text leave the batch, together
  with their key/value cache rows and audio features.
- The model may run in float16 or bfloat16 on any device.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributions import Categorical
from whisper.decoding import (
    BeamSearchDecoder,
    DecodingOptions,
    DecodingResult,
    DecodingTask,
    GreedyDecoder,
    PyTorchInference,
    SuppressBlank,
)
from whisper.utils import compression_ratio

from ..platform.cpu import half_products_available
from .attention import attend_features, features_in_two_products
from .derived import derive_ahead, derived


class PositionalInference(PyTorchInference):
    def __init__(self, model, initial_token_length: int, sot_index: int) -> None:
        super().__init__(model, initial_token_length)
        self.sot_index = sot_index

    def logits(self, tokens: Tensor, audio_features: Tensor) -> Tensor:
        """[batch, 2, vocab] on the first pass (SOT, last), [batch, 1, vocab] after."""
        if not self.kv_cache:
            self.kv_cache, self.hooks = self.model.install_kv_cache_hooks()
        if tokens.shape[-1] > self.initial_token_length:
            tokens, positions = tokens[:, -1:], [0]
        else:
            positions = [self.sot_index, tokens.shape[-1] - 1]
        return self.model.decoder(tokens, audio_features, kv_cache=self.kv_cache, logit_positions=positions)

    def keep_rows(self, rows: Tensor) -> None:
        for module, cached in self.kv_cache.items():
            self.kv_cache[module] = cached[rows]


class StaticCacheInference:
    """Decoding state in preallocated tensors: self-attention keys and values for every position,
    and the audio features once for cross-attention.

    Cross-attention keys are features @ Wk.T, so a head's scores are (Wk_h.T q_h) @ features.T;
    values come out as (softmax @ features) @ Wv_h.T + b_h. Folding the projections into the
    query and the output this way, no layer needs keys and values of its own: the state per
    sequence is the features (1500 x width), not 2 x layers x 1500 x width, which lets more
    sequences share a batch and spares computing 12 key/value projections per window.

    The features are kept in `cache_dtype`, which halves that memory traffic in bfloat16 or in
    float16. float16 features are fbgemm float16-weight products that compute in float32
    (HalfFeatures), for x86 CPUs without bfloat16 instructions; they fall back to the model's
    dtype where those products do not apply. The vocabulary projection is in cache_dtype where it
    is not on HalfWeightProducts, while the decoder's own layers run in the model's dtype:
    bfloat16 there changed words.

    Beam search's beams (`group` rows a window, one after another) share their window's features:
    each window's are read once a step for all its beams' queries.
    """

    def __init__(
        self,
        model,
        initial_token_length: int,
        sot_index: int,
        cache_dtype: torch.dtype,
        max_length: int | None = None,
        group: int = 1,
    ) -> None:
        """max_length: the most positions a sequence will take (initial tokens and samples);
        the caches hold that many, not the decoder's 448, which halves them for one window.
        group: rows a window (beam search's beams), which share its one row of features."""
        self.decoder = model.decoder
        self.group = group
        self.max_length = max_length
        self.dtype = next(model.decoder.parameters()).dtype
        self.cache_dtype = cache_dtype
        self.folded = _folded_cross_attention(model)
        self.model = model
        self.half_weights: HalfWeightProducts | None = None
        self.initial_token_length, self.sot_index = initial_token_length, sot_index
        self.features: Tensor | None = None
        self.half_features: list[HalfFeatures] | None = None
        self.self_k: Tensor | None = None
        self.self_v: Tensor | None = None
        self.length = 0

    def _heads(self, x: Tensor, n_head: int) -> Tensor:
        return x.view(x.shape[0], x.shape[1], n_head, -1).transpose(1, 2)

    def _start(self, audio_features: Tensor) -> None:
        decoder = self.decoder
        n_batch, n_ctx = audio_features.shape[0] * self.group, decoder.positional_embedding.shape[0]
        n_ctx = min(n_ctx, self.max_length or n_ctx)
        windows = audio_features  # one row a window, which its `group` rows share
        n_head = decoder.blocks[0].attn.n_head
        width = decoder.token_embedding.weight.shape[1]
        self.half_weights = _half_weight_products(self.model)
        self.half_features = None
        if self.cache_dtype == torch.float16:
            if self.half_weights is None:  # fbgemm's products do not apply: features as the model has them
                self.cache_dtype = self.dtype
            else:
                self.half_features = [HalfFeatures(row) for row in windows]
        self.features = None if self.half_features is not None else windows.to(self.cache_dtype)
        self.two_products = self.features is not None and features_in_two_products(self.features)
        self.owns_features = self.features is not audio_features  # not the caller's: keep_rows may write in it
        shape = (len(decoder.blocks), n_batch, n_head, n_ctx, width // n_head)
        self.self_k = torch.empty(shape, dtype=self.dtype, device=audio_features.device)
        self.self_v = torch.empty(shape, dtype=self.dtype, device=audio_features.device)
        self.length = 0

    def _cross_attention(self, i: int, q: Tensor) -> Tensor:
        """Layer i's cross-attention for queries q [batch, tokens, width], before its output projection."""
        key, value, bias = self.folded[i]
        n_batch, n_tokens = q.shape[:2]
        n_head = key.shape[0]
        folded = _folded(self._heads(q, n_head), key)  # [batch, head, tokens, width]
        folded = folded.reshape(n_batch // self.group, self.group * n_head * n_tokens, -1)  # by window
        if self.half_features is not None:
            mixed = torch.stack([row.attend(queries) for row, queries in zip(self.half_features, folded)])
        else:
            mixed = attend_features(folded.to(self.cache_dtype), self.features, self.two_products).to(self.dtype)
        out = _folded(mixed.view(n_batch, n_head, n_tokens, -1), value, bias[:, None])  # [..., head width]
        return out.transpose(1, 2).flatten(2)

    def logits(self, tokens: Tensor, audio_features: Tensor) -> Tensor:
        """[batch, 2, vocab] on the first pass (SOT, last), [batch, 1, vocab] after."""
        if self.self_k is None:
            self._start(audio_features)
        if self.length:
            tokens, positions = tokens[:, -1:], [0]
        else:
            positions = [self.sot_index, tokens.shape[-1] - 1]
        decoder = self.decoder
        start, n_new = self.length, tokens.shape[-1]
        end = start + n_new
        x = (decoder.token_embedding(tokens) + decoder.positional_embedding[start:end]).to(self.dtype)
        linear = self._linear
        for i, block in enumerate(decoder.blocks):
            attn = block.attn
            h = block.attn_ln(x)
            q = self._heads(linear(attn.query, h), attn.n_head)
            self.self_k[i, :, :, start:end] = self._heads(linear(attn.key, h), attn.n_head)
            self.self_v[i, :, :, start:end] = self._heads(linear(attn.value, h), attn.n_head)
            o = _self_attention(
                q, self.self_k[i, :, :, :end], self.self_v[i, :, :, :end], causal=n_new > 1 and start == 0
            )
            x = x + linear(attn.out, o.transpose(1, 2).flatten(2))
            cross = block.cross_attn
            x = x + linear(cross.out, self._cross_attention(i, linear(cross.query, block.cross_attn_ln(x))))
            h = block.mlp_ln(x)
            x = x + (block.mlp(h) if self.half_weights is None else self.half_weights.mlp(block.mlp, h))
        self.length = end
        x = decoder.ln(x[:, positions])
        if self.half_weights is not None:
            return self.half_weights.project(x)
        projection = _projection(self.model, self.cache_dtype)
        return (x.to(projection.dtype) @ projection.T).float()

    def _linear(self, layer: nn.Linear, x: Tensor) -> Tensor:
        return layer(x) if self.half_weights is None else self.half_weights.linear(layer, x)

    def keep_rows(self, rows: Tensor) -> None:
        """The rows that go on move up in place over those that ended, and of the self-attention
        caches only the positions filled so far: new buffers from indexing page-fault in afresh.
        Beam search's beams leave with their window, all together."""
        kept = rows.nonzero().flatten().tolist()
        windows = rows[:: self.group]  # a window's features, kept with its first beam
        kept_windows = windows.nonzero().flatten().tolist()
        if self.half_features is not None:
            self.half_features = [self.half_features[window] for window in kept_windows]
        elif not self.owns_features:  # the caller's tensor: copied once, then ours
            self.features, self.owns_features = self.features[windows], True
        else:
            _move_up(self.features, kept_windows, 0)
            self.features = self.features[: len(kept_windows)]
        for cache in (self.self_k, self.self_v):
            _move_up(cache[:, :, :, : self.length], kept, 1)
        self.self_k, self.self_v = self.self_k[:, : len(kept)], self.self_v[:, : len(kept)]

    def rearrange_kv_cache(self, source_indices: list[int]) -> None:
        """Beam search: each row goes on from the row it names (a beam of its own window, so the
        features stay as they are). Only the rows that change are copied."""
        moved = [row for row, source in enumerate(source_indices) if source != row]
        if moved:
            device = self.self_k.device
            targets = torch.tensor(moved, device=device)
            sources = torch.tensor([source_indices[row] for row in moved], device=device)
            for cache in (self.self_k, self.self_v):
                cache[:, targets, :, : self.length] = cache[:, sources, :, : self.length]

    def cleanup_caching(self) -> None:
        self.features, self.self_k, self.self_v, self.length = None, None, None, 0
        self.half_features = None


PROCESS_ENDING = threading.Event()  # set at exit: every decoding loop stops at its next token (service._stop_at_exit)
_stopped_threads: set[int] = set()  # engine threads whose caller left early: their decodings stop at the next token


class DecodingStopped(Exception):
    """The process is ending, or the caller left: a decoding in hand is dropped rather than finished."""


def stop_decoding_on(thread_id: int) -> None:
    """Decodings on that thread stop at their next token (DecodingStopped), until resume_decoding_on."""
    _stopped_threads.add(thread_id)


def resume_decoding_on(thread_id: int) -> None:
    _stopped_threads.discard(thread_id)


def _check_stopped() -> None:
    if PROCESS_ENDING.is_set() or threading.get_ident() in _stopped_threads:
        raise DecodingStopped


FOLD_ROWS = 16  # query rows per product of a fold: one shape for any batch (see _folded)


def _folded(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x @ weight (+ bias) for x [batch, head, tokens, n] and weight [head, n, m], bias broadcast.

    On a CPU the rows of all sequences go through each head's weight together, FOLD_ROWS at a
    time with zeros after the last: the weights (8 x 64 x 512 floats a layer) are read once a
    step, not once a row, and every product has the same shape whatever the batch, so a
    sequence's numbers do not depend on what else shares its batch.
    """
    if x.device.type != "cpu":
        return x @ weight if bias is None else x @ weight + bias
    n_batch, n_head, n_tokens, width = x.shape
    rows = n_batch * n_tokens
    padded = -(-rows // FOLD_ROWS) * FOLD_ROWS
    stacked = x.new_empty(n_head, padded, width)
    stacked[:, :rows] = x.transpose(0, 1).reshape(n_head, rows, width)
    stacked[:, rows:] = 0
    out = torch.empty(n_head, padded, weight.shape[-1], dtype=x.dtype)
    for at in range(0, padded, FOLD_ROWS):
        torch.bmm(stacked[:, at : at + FOLD_ROWS], weight, out=out[:, at : at + FOLD_ROWS])
    out = out[:, :rows].view(n_head, n_batch, n_tokens, -1).transpose(0, 1)
    return out if bias is None else out + bias


def _move_up(cache: Tensor, kept: list[int], dim: int) -> None:
    """Copies the entries `kept` (ascending) of dim to its start, in order."""
    for to, source in enumerate(kept):
        if to != source:
            cache.select(dim, to).copy_(cache.select(dim, source))


def _self_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
    """softmax(q k^T / sqrt(d)) v for [batch, head, tokens, d] queries over [batch, head, positions, d].

    Written out rather than torch's fused kernel, which rounds a row differently when it has the
    batch to itself: a sequence's text must not depend on what else shares its batch.
    """
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:  # the first pass: the prompt's tokens, which start at position 0
        n = q.shape[-2]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), -torch.inf)
    return torch.softmax(scores, dim=-1) @ v


def _projection(model, dtype: torch.dtype) -> Tensor:
    """The token embedding as the output projection, in dtype."""
    weight = model.decoder.token_embedding.weight
    if weight.dtype == dtype:
        return weight
    return derived(model, f"projection {dtype}", lambda: weight.detach().to(dtype))


class HalfWeightProducts:
    """The decoder's linear layers and vocabulary projection as fbgemm float16-weight products.

    With a dozen rows per step these products are bound by memory, not arithmetic. fbgemm keeps
    the weights in float16 and widens them as it goes, computing in float32, so a step reads half
    as much. Only weights that float16 holds exactly are taken (the packs are float16), so no
    weight is rounded. Timings: docs/performance.md.
    """

    def __init__(self, projection: list[object], linears: dict[nn.Linear, object]) -> None:
        """projection: the vocabulary in blocks of PROJECTION_BLOCK tokens, packed one by one."""
        self.projection, self.linears = projection, linears

    def project(self, x: Tensor) -> Tensor:
        x = x.float()
        return torch.cat([torch.ops.quantized.linear_dynamic_fp16(x, block) for block in self.projection], dim=-1)

    def linear(self, layer: nn.Linear, x: Tensor) -> Tensor:
        return torch.ops.quantized.linear_dynamic_fp16(x, self.linears[layer])

    def mlp(self, mlp: nn.Sequential, x: Tensor) -> Tensor:
        return self.linear(mlp[2], F.gelu(self.linear(mlp[0], x)))


class HalfFeatures:
    """One row's audio features [frames, width] packed twice as fbgemm float16 weights, for its
    cross-attention: once as keys, once transposed as values (about 16 ms a row on 2 cores).

    Each step reads them in float16, half of float32, while the products run in float32. One row
    per product, so a row's text does not depend on its batch.
    """

    def __init__(self, features: Tensor) -> None:
        self.keys = _prepack(features)
        self.values = _prepack(features.T.contiguous())

    def attend(self, queries: Tensor) -> Tensor:
        """softmax(queries features^T) features, [queries, width] for queries [queries, width]."""
        weights = torch.softmax(torch.ops.quantized.linear_dynamic_fp16(queries, self.keys), dim=-1)
        return torch.ops.quantized.linear_dynamic_fp16(weights, self.values)


def _prepack(weight: Tensor, bias: Tensor | None = None) -> object:
    return torch.ops.quantized.linear_prepack_fp16(weight.detach(), None if bias is None else bias.detach())


HALF_WEIGHTS = "float16-weight products"
PROJECTION_BLOCK = 16384  # fbgemm packs base's [51865, 512] vocabulary in 0.42 s whole, 0.20 s in blocks


def _half_weight_products(model) -> HalfWeightProducts | None:
    """HalfWeightProducts for a float32 decoder on a CPU with fbgemm, when float16 holds its weights.
    They are packed once per model and used for every batch, however few its rows: fbgemm computes
    a row alike whatever else is in the batch, so a window decodes to the same text alone or shared."""
    make = _half_weight_packer(model)
    return None if make is None else derived(model, HALF_WEIGHTS, make)


def pack_decoder_ahead(model) -> None:
    """Start packing the decoder's float16-weight products (about 0.7 s for base) on a thread of
    their own, where they apply; the first batch takes them from there."""
    make = _half_weight_packer(model)
    if make is not None:
        derive_ahead(model, HALF_WEIGHTS, make)


def _half_weight_packer(model) -> Callable[[], HalfWeightProducts | None] | None:
    """What packs the products, or None where they do not apply (not a float32 decoder on x86)."""

    def make() -> HalfWeightProducts | None:
        decoder = model.decoder
        layers = [  # those StaticCacheInference calls: the cross-attention's keys and values are folded
            layer
            for b in decoder.blocks
            for layer in (b.attn.query, b.attn.key, b.attn.value, b.attn.out, b.cross_attn.query, b.cross_attn.out)
            + (b.mlp[0], b.mlp[2])
        ]
        weights = [decoder.token_embedding.weight] + [layer.weight for layer in layers]
        exact = getattr(model, "float16_checkpoint", False)  # widened from float16 by build_model
        if not exact and any(not torch.equal(w.detach().half().float(), w.detach()) for w in weights):
            return None
        packed = {layer: _prepack(layer.weight, layer.bias) for layer in layers}
        vocabulary = decoder.token_embedding.weight.detach().split(PROJECTION_BLOCK)
        return HalfWeightProducts([_prepack(block.contiguous()) for block in vocabulary], packed)

    weight = model.decoder.token_embedding.weight
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return None
    if not half_products_available():
        return None  # fbgemm is x86's; other CPUs keep the float32 products
    return make


def _folded_cross_attention(model) -> list[tuple[Tensor, Tensor, Tensor]]:
    """Per layer: the key weight by head [head, head width, width], scaled by 1/sqrt(head width);
    the value weight by head, transposed [head, width, head width]; the value bias [head, head width].
    Contiguous, as batched products on them round a row the same however many rows there are."""

    def fold() -> list[tuple[Tensor, Tensor, Tensor]]:
        folded = []
        for block in model.decoder.blocks:
            attn = block.cross_attn
            width = attn.key.weight.shape[1]
            head = width // attn.n_head
            key = attn.key.weight.detach().view(attn.n_head, head, width) * head**-0.5
            value = attn.value.weight.detach().view(attn.n_head, head, width).transpose(1, 2).contiguous()
            bias = attn.value.bias.detach().view(attn.n_head, head)
            folded.append((key, value, bias))
        return folded

    return derived(model, "folded cross-attention", fold)


class BlankSuppression(SuppressBlank):
    """openai-whisper's SuppressBlank with its token ids found once, without special-token checks.

    SuppressBlank encodes " " on every first step, and tiktoken's first encode with special
    tokens disallowed compiles a regex of all 1,600 of them at each cold start.
    """

    def __init__(self, tokenizer, sample_begin: int) -> None:
        super().__init__(tokenizer, sample_begin)
        self.blank = tokenizer.encoding.encode_ordinary(" ") + [tokenizer.eot]

    def apply(self, logits: Tensor, tokens: Tensor) -> None:
        if tokens.shape[1] == self.sample_begin:
            logits[:, self.blank] = -np.inf


class SpeechContinuation:
    """End-of-text is masked in a row while its window holds speech after the last timestamp.

    Whisper sometimes closes a segment and ends a window that goes on speaking. openai-whisper
    then seeks to that timestamp and decodes a new window; here the same row goes on, with the
    window already encoded. `unfinished[row, k]`: speech follows timestamp k in that row's window.
    """

    def __init__(self, tokenizer, sample_begin: int, unfinished: Tensor) -> None:
        self.eot, self.timestamp_begin = tokenizer.eot, tokenizer.timestamp_begin
        self.sample_begin = sample_begin
        self.unfinished = unfinished

    def apply(self, logits: Tensor, tokens: Tensor) -> None:
        if tokens.shape[1] <= self.sample_begin:
            return
        stamp = tokens[:, -1] - self.timestamp_begin  # a segment just closed where it is >= 0
        rows = torch.arange(tokens.shape[0], device=tokens.device)
        index = stamp.clamp(0, self.unfinished.shape[1] - 1)
        logits[(stamp >= 0) & self.unfinished[rows, index], self.eot] = -np.inf

    def keep_rows(self, rows: Tensor) -> None:
        self.unfinished = self.unfinished[rows]


class BatchedBeamSearch(BeamSearchDecoder):
    """openai-whisper's beam search step, its candidates scored and ranked as tensors.

    Its own update reads every beam's tokens into Python and each of its candidates' scores one
    `.item()` at a time: with the beams of a batch of windows, a tenth of decoding. Here the
    prefixes of a window's beams are read only for the candidates that end there. Where two beams
    of a window hold the same tokens (its first step), its own update runs, which merges them.

    Each beam's token log probabilities follow it (`history`), and each candidate found keeps its
    own (`finished_logprobs`, beside `finished_sequences`): a packed input is judged by its own
    tokens, as with greedy decoding, and segments carry them (Segment.token_logprobs).
    """

    def __init__(self, beam_size: int, eot: int, inference, patience: float | None = None) -> None:
        super().__init__(beam_size, eot, inference, patience)
        self.history: Tensor | None = None  # [rows, steps]: the log probability of each beam's tokens
        self.finished_logprobs: list[dict[tuple, tuple[float, ...]]] = []  # a window's, beside finished_sequences

    def update(self, tokens: Tensor, logits: Tensor, sum_logprobs: Tensor) -> tuple[Tensor, bool]:
        n_rows, beams = tokens.shape[0], self.beam_size
        n_windows = n_rows // beams
        logprobs = F.log_softmax(logits.float(), dim=-1)
        if self.history is None:
            self.history = logprobs.new_zeros(n_rows, 0)
        grouped = tokens.view(n_windows, beams, -1)
        if bool((grouped[:, :, None] == grouped[:, None]).all(-1).sum((1, 2)).gt(beams).any()):
            return self._merging_update(tokens, logits, sum_logprobs, logprobs)
        if self.finished_sequences is None:
            self.finished_sequences = [{} for _ in range(n_windows)]
        top_logprobs, top_tokens = logprobs.topk(beams + 1)  # [rows, beams + 1], as its update takes them
        scores = (sum_logprobs[:, None] + top_logprobs).view(n_windows, -1)  # float32 sums, as its .item()s
        order = scores.sort(dim=-1, descending=True, stable=True).indices  # ties in (beam, rank) order
        ranked_scores = scores.gather(1, order).tolist()
        ranked_tokens = top_tokens.view(n_windows, -1).gather(1, order).tolist()
        ranked_logprobs = top_logprobs.view(n_windows, -1).gather(1, order).tolist()
        first_rows = torch.arange(n_windows, device=order.device)[:, None] * beams
        ranked_sources = (order // (beams + 1) + first_rows).tolist()
        sources, next_tokens, next_logprobs, finished_sequences, finished_logprobs = [], [], [], [], []
        for window in range(n_windows):
            finished, own, saved = {}, {}, 0
            ranked = zip(ranked_scores[window], ranked_tokens[window], ranked_sources[window], ranked_logprobs[window])
            for score, token, source, logprob in ranked:
                if token == self.eot:
                    sequence = tuple(tokens[source].tolist() + [token])
                    finished[sequence] = score
                    own[sequence] = (*self.history[source].tolist(), logprob)
                else:
                    sum_logprobs[len(sources)] = score
                    sources.append(source)
                    next_tokens.append(token)
                    next_logprobs.append(logprob)
                    saved += 1
                    if saved == beams:
                        break
            finished_sequences.append(finished)
            finished_logprobs.append(own)
        chosen = torch.tensor(next_tokens, dtype=tokens.dtype, device=tokens.device)
        tokens = torch.cat([tokens[sources], chosen[:, None]], dim=-1)
        self.history = torch.cat([self.history[sources], self.history.new_tensor(next_logprobs)[:, None]], dim=-1)
        self.inference.rearrange_kv_cache(sources)
        for window, newly_finished in enumerate(finished_sequences):
            previously_finished = self.finished_sequences[window]
            for seq in sorted(newly_finished, key=newly_finished.get, reverse=True):
                if len(previously_finished) >= self.max_candidates:
                    break
                previously_finished[seq] = newly_finished[seq]
                self.finished_logprobs[window][seq] = finished_logprobs[window][seq]
        completed = all(len(sequences) >= self.max_candidates for sequences in self.finished_sequences)
        return tokens, completed

    def _merging_update(self, tokens: Tensor, logits: Tensor, sum_logprobs: Tensor, logprobs: Tensor):
        """openai-whisper's own update, which merges a window's identical beams; each new beam and
        candidate then takes its log probabilities from a beam of its window that held its prefix."""
        beams, before = self.beam_size, tokens.tolist()
        holder = {}  # (window, prefix): a row that held it
        for row, prefix in enumerate(before):
            holder.setdefault((row // beams, tuple(prefix)), row)
        tokens, completed = super().update(tokens, logits, sum_logprobs)
        after = tokens.tolist()
        sources = [holder[(row // beams, tuple(sequence[:-1]))] for row, sequence in enumerate(after)]
        taken = logprobs[sources, tokens[:, -1]]
        for window, sequences in enumerate(self.finished_sequences):
            own = self.finished_logprobs[window]
            for sequence in sequences.keys() - own.keys():
                row = holder[(window, sequence[:-1])]
                own[sequence] = (*self.history[row].tolist(), logprobs[row, self.eot].item())
        self.history = torch.cat([self.history[sources], taken[:, None]], dim=-1)
        return tokens, completed


@dataclass(frozen=True)
class DecodedWindow(DecodingResult):
    """openai-whisper's result, with the log probability of each of its tokens as sampled
    (after the logit filters, as its avg_logprob sums them); None from beam search."""

    token_logprobs: tuple[float, ...] | None = None


class FerrumDecodingTask(DecodingTask):
    def __init__(
        self,
        model,
        options: DecodingOptions,
        fast_cache_dtype: torch.dtype | None = None,
        row_languages: list[str] | None = None,
        unfinished: Tensor | None = None,
    ) -> None:
        super().__init__(model, options)
        self.logit_filters = [
            BlankSuppression(f.tokenizer, f.sample_begin) if type(f) is SuppressBlank else f for f in self.logit_filters
        ]
        self.continuation = None
        if unfinished is not None and not options.without_timestamps:
            unfinished = unfinished.repeat_interleave(self.n_group, dim=0)
            self.continuation = SpeechContinuation(self.tokenizer, self.sample_begin, unfinished)
            self.logit_filters.insert(0, self.continuation)
        self.inference = PositionalInference(model, len(self.initial_tokens), self.sot_index)
        if hasattr(self.decoder, "inference"):  # beam search reorders the caches of the inference it was given
            self.decoder.inference = self.inference
        self.fast_cache_dtype = fast_cache_dtype
        self.row_languages = row_languages
        self.sampled_tokens: Tensor | None = None  # [rows, positions]: the greedy loop's, prompt included
        self.sampled_logprobs: Tensor | None = None  # [rows, positions]: of each sampled token
        self.beam_logprobs: list[dict[tuple, tuple[float, ...]]] | None = None  # each window's candidates'

    @torch.no_grad()
    def run(self, mel: Tensor) -> list[DecodedWindow]:
        """openai-whisper's run(), with the features one row a window throughout: its run() needs
        them repeated for every beam or sample, copies that beam search's caches never read and
        that held a large part of its memory (docs/performance.md, "Beam search")."""
        self.decoder.reset()
        n_audio, group, eot = mel.shape[0], self.n_group, self.tokenizer.eot
        audio_features = self._get_audio_features(mel)  # [windows, frames, width]
        tokens = torch.tensor([self.initial_tokens]).repeat(n_audio, 1)
        languages, language_probs = self._detect_language(audio_features, tokens)
        if self.options.task == "lang_id":
            return [DecodedWindow(audio_features=features, language=language, language_probs=probs)
                    for features, language, probs in zip(audio_features, languages, language_probs)]  # fmt: skip
        tokens = tokens.repeat_interleave(group, dim=0).to(audio_features.device)
        tokens, sum_logprobs, no_speech_probs = self._main_loop(audio_features, tokens)
        tokens, sum_logprobs = self.decoder.finalize(
            tokens.reshape(n_audio, group, -1), sum_logprobs.reshape(n_audio, group)
        )
        candidates = [[t[self.sample_begin : (t == eot).nonzero()[0, 0]] for t in window] for window in tokens]
        selected = self.sequence_ranker.rank(candidates, sum_logprobs)
        windows = []
        for i, chosen in enumerate(selected):
            text_tokens = candidates[i][chosen].tolist()
            text = self.tokenizer.decode(text_tokens).strip()
            windows.append(DecodedWindow(
                audio_features=audio_features[i], language=languages[i], tokens=text_tokens, text=text,
                avg_logprob=sum_logprobs[i][chosen] / (len(text_tokens) + 1), no_speech_prob=no_speech_probs[i * group],
                temperature=self.options.temperature, compression_ratio=compression_ratio(text),
                token_logprobs=self._token_logprobs(i, tuple(tokens[i][chosen].tolist()), text_tokens),
            ))  # fmt: skip
        return windows

    def _token_logprobs(
        self, window: int, sequence: tuple[int, ...], text_tokens: list[int]
    ) -> tuple[float, ...] | None:
        """The log probability of each of the window's text tokens as decoded: from the candidate
        beam search chose (`sequence`), or the row of the greedy loop's best-of-n samples that
        gave these tokens; None from openai-whisper's own beam search (the sequential engine)."""
        n = len(text_tokens)
        if self.beam_logprobs is not None:
            found = self.beam_logprobs[window].get(sequence)
            return tuple(found[:n]) if found is not None and len(found) >= n else None
        sampled = self.sampled_logprobs
        if sampled is None:
            return None
        start = self.sample_begin
        rows = range(window * self.n_group, (window + 1) * self.n_group)
        row = next((r for r in rows if self.sampled_tokens[r, start : start + n].tolist() == text_tokens), rows[0])
        return tuple(sampled[row, start : start + n].tolist())

    def _detect_language(self, audio_features: Tensor, tokens: Tensor):
        """Rows of one batch may come from files in different languages, each already known."""
        if self.row_languages is None or self.sot_index + 1 >= tokens.shape[1]:
            return super()._detect_language(audio_features, tokens)
        tokens[:, self.sot_index + 1] = torch.tensor(
            [self.tokenizer.to_language_token(lang) for lang in self.row_languages], device=tokens.device
        )
        return list(self.row_languages), None

    def _get_audio_features(self, mel: Tensor) -> Tensor:
        """[windows, frames, width]: the encoder's output, or mel where it is that already."""
        dtype = next(self.model.parameters()).dtype
        mel = mel.to(dtype)
        encoded = mel.shape[-2:] == (self.model.dims.n_audio_ctx, self.model.dims.n_audio_state)
        return mel if encoded else self.model.encoder(mel)

    def _main_loop(self, audio_features: Tensor, tokens: Tensor):
        if isinstance(self.decoder, GreedyDecoder):
            return self._greedy_loop(audio_features, tokens)
        return self._beam_loop(audio_features, tokens)

    def _no_speech_probs(self, first_logits: Tensor) -> list[float]:
        if self.tokenizer.no_speech is None:
            return [np.nan] * first_logits.shape[0]
        return first_logits[:, 0].float().softmax(dim=-1)[:, self.tokenizer.no_speech].tolist()

    def _next_logits(
        self, step: int, tokens: Tensor, audio_features: Tensor, no_speech_probs: list[float]
    ) -> tuple[Tensor, list[float]]:
        """The last position's logits ([batch, vocabulary]) with the filters applied; on the first
        step the no-speech probabilities are read off the SOT position first."""
        logits = self.inference.logits(tokens, audio_features)
        if step == 0:
            no_speech_probs = self._no_speech_probs(logits)
        logits = logits[:, -1]
        for logit_filter in self.logit_filters:
            logit_filter.apply(logits, tokens)
        return logits, no_speech_probs

    def _beam_loop(self, audio_features: Tensor, tokens: Tensor):
        """openai-whisper's beam search over a batch of windows, each with its beams one after
        another. A window leaves the batch once its candidates are all found, as a greedy row does
        at its end, with its beams as they are then: what openai-whisper's loop gives it alone.
        That loop went on computing the beams of a batch's windows that were done, for as long as
        any had candidates to find, and where patience is under 1 finalize() took their unfinished
        beams as they had grown meanwhile: a window's text depended on its batch. openai-whisper's
        transcribe() (the sequential engine) decodes one window, with its own update and caches."""
        group = self.n_group
        if self.fast_cache_dtype is not None:
            self.inference = self._static_cache_inference(group=group)
            self.decoder = BatchedBeamSearch(group, self.tokenizer.eot, self.inference, self.options.patience)
        decoder = self.decoder
        tracked = isinstance(decoder, BatchedBeamSearch)  # it keeps each beam's token log probabilities
        n_windows = tokens.shape[0] // group
        finished: list[dict] = [{} for _ in range(n_windows)]  # each window's, filled by decoder.update
        self.beam_logprobs = [{} for _ in range(n_windows)] if tracked else None  # of each window's candidates
        left: dict[int, tuple[Tensor, Tensor, Tensor | None]] = {}  # a window's beams, sums and log probabilities
        windows = list(range(n_windows))  # those still in the batch, in row order
        sum_logprobs = torch.zeros(tokens.shape[0], device=audio_features.device)
        no_speech_probs: list[float] = []

        def leave(k: int) -> None:  # the k-th window still in the batch, as its beams stand
            rows = slice(k * group, (k + 1) * group)
            left[windows[k]] = tokens[rows], sum_logprobs[rows], decoder.history[rows] if tracked else None

        try:
            for i in range(self.sample_len):
                _check_stopped()
                logits, no_speech_probs = self._next_logits(i, tokens, audio_features, no_speech_probs)
                decoder.finished_sequences = [finished[window] for window in windows]
                if tracked:
                    decoder.finished_logprobs = [self.beam_logprobs[window] for window in windows]
                tokens, completed = decoder.update(tokens, logits, sum_logprobs)
                if completed or tokens.shape[-1] > self.n_ctx:
                    break
                done = [len(finished[window]) >= decoder.max_candidates for window in windows]
                if any(done):
                    for k in range(len(windows)):
                        if done[k]:
                            leave(k)
                    rows = torch.tensor([not d for d in done], device=tokens.device).repeat_interleave(group)
                    tokens, sum_logprobs = tokens[rows], sum_logprobs[rows]
                    self.inference.keep_rows(rows)
                    if self.continuation is not None:
                        self.continuation.keep_rows(rows)
                    if tracked:
                        decoder.history = decoder.history[rows]
                    windows = [window for window, d in zip(windows, done) if not d]
        finally:
            self.inference.cleanup_caching()
        for k in range(len(windows)):
            leave(k)
        decoder.finished_sequences = finished
        length = max(beams.shape[-1] for beams, _, _ in left.values())
        eot = self.tokenizer.eot
        every = torch.full((n_windows * group, length), eot, dtype=tokens.dtype, device=tokens.device)
        for window, (beams, _, history) in left.items():  # a window that left early is read from `finished`
            every[window * group : (window + 1) * group, : beams.shape[-1]] = beams
            for beam in range(group) if tracked else ():  # as finalize() names a beam it takes unfinished
                key = tuple(every[window * group + beam].tolist() + [eot])
                self.beam_logprobs[window].setdefault(key, tuple(history[beam].tolist()))
        return every, torch.cat([left[window][1] for window in range(n_windows)]), no_speech_probs

    def _static_cache_inference(self, group: int = 1) -> StaticCacheInference:
        return StaticCacheInference(
            self.model,
            len(self.initial_tokens),
            self.sot_index,
            self.fast_cache_dtype,
            max_length=len(self.initial_tokens) + self.sample_len,  # one position per call of the loop
            group=group,
        )

    def _greedy_loop(self, audio_features: Tensor, tokens: Tensor):
        """Greedy decoding, or sampling at a temperature, where finished sequences leave the batch."""
        if self.n_group > 1:  # best-of-n: each sample goes its own way, with its own row of features
            audio_features = audio_features.repeat_interleave(self.n_group, dim=0)
        if self.fast_cache_dtype is not None:
            self.inference = self._static_cache_inference()
        eot = self.tokenizer.eot
        n_batch = tokens.shape[0]
        device = audio_features.device
        sum_logprobs = torch.zeros(n_batch, device=device)
        out = torch.full((n_batch, tokens.shape[-1] + self.sample_len + 1), eot, dtype=tokens.dtype, device=device)
        out[:, : tokens.shape[-1]] = tokens
        self.sampled_tokens, self.sampled_logprobs = out, torch.zeros(out.shape, device=device)
        length = tokens.shape[-1]
        active = torch.arange(n_batch, device=device)
        no_speech_probs: list[float] = []
        try:
            for i in range(self.sample_len):
                _check_stopped()
                logits, no_speech_probs = self._next_logits(i, tokens, audio_features, no_speech_probs)
                if self.options.temperature == 0:
                    next_tokens = logits.argmax(dim=-1)
                else:  # as whisper's GreedyDecoder samples
                    next_tokens = Categorical(logits=logits / self.options.temperature).sample()
                logprobs = torch.log_softmax(logits.float(), dim=-1)
                chosen = logprobs[torch.arange(len(active), device=device), next_tokens]
                sum_logprobs[active] += chosen
                self.sampled_logprobs[active, length] = chosen
                out[active, length] = next_tokens
                tokens = torch.cat([tokens, next_tokens[:, None]], dim=-1)
                length += 1
                running = next_tokens != eot
                if not bool(running.any()) or length > self.n_ctx:
                    break
                if not bool(running.all()):
                    active, tokens = active[running], tokens[running]
                    if not isinstance(self.inference, StaticCacheInference):  # that one keeps its own
                        audio_features = audio_features[running]
                    self.inference.keep_rows(running)
                    if self.continuation is not None:
                        self.continuation.keep_rows(running)
        finally:
            self.inference.cleanup_caching()
        return out[:, : length + 1], sum_logprobs, no_speech_probs


@torch.no_grad()
def decode(
    model,
    mel: Tensor,
    options: DecodingOptions | None = None,
    fast_cache_dtype: torch.dtype | None = None,
    row_languages: list[str] | None = None,
    unfinished: Tensor | None = None,
    **kwargs,
) -> DecodingResult | list[DecodingResult]:
    """Drop-in for whisper.decoding.decode, so openai-whisper's transcribe() runs on it.

    fast_cache_dtype: greedy decoding uses the static-cache decoder, its caches in this dtype.
    row_languages: the language of each row, when a batch mixes files (options.language is then None).
    unfinished: [rows, timestamps] bool, where each row's window holds speech after a timestamp
    (see SpeechContinuation).
    """
    from dataclasses import replace

    options = replace(options or DecodingOptions(), **kwargs)
    single = mel.ndim == 2
    if single:
        mel = mel.unsqueeze(0)
    results = FerrumDecodingTask(model, options, fast_cache_dtype, row_languages, unfinished).run(mel)
    return results[0] if single else results
