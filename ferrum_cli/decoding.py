"""The decoding engine: openai-whisper's DecodingTask, with less work per token.

- Only the positions that are read (the SOT position on the first pass, then the last
  one) are projected onto the vocabulary.
- With greedy decoding, sequences that reach end-of-text leave the batch, together
  with their key/value cache rows and audio features.
- The model may run in float16 or bfloat16 on any device.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor
from whisper.decoding import DecodingOptions, DecodingResult, DecodingTask, GreedyDecoder, PyTorchInference


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


class FerrumDecodingTask(DecodingTask):
    def __init__(self, model, options: DecodingOptions) -> None:
        super().__init__(model, options)
        self.inference = PositionalInference(model, len(self.initial_tokens), self.sot_index)

    def _get_audio_features(self, mel: Tensor) -> Tensor:
        dtype = next(self.model.parameters()).dtype
        mel = mel.to(dtype)
        if mel.shape[-2:] == (self.model.dims.n_audio_ctx, self.model.dims.n_audio_state):
            return mel  # already encoded
        return self.model.encoder(mel)

    def _main_loop(self, audio_features: Tensor, tokens: Tensor):
        if isinstance(self.decoder, GreedyDecoder) and self.n_group == 1 and self.options.temperature == 0:
            return self._greedy_loop(audio_features, tokens)
        return self._general_loop(audio_features, tokens)

    def _no_speech_probs(self, first_logits: Tensor) -> list[float]:
        if self.tokenizer.no_speech is None:
            return [np.nan] * first_logits.shape[0]
        return first_logits[:, 0].float().softmax(dim=-1)[:, self.tokenizer.no_speech].tolist()

    def _general_loop(self, audio_features: Tensor, tokens: Tensor):
        """openai-whisper's loop (beam search, sampling), with positional logits."""
        sum_logprobs = torch.zeros(tokens.shape[0], device=audio_features.device)
        no_speech_probs: list[float] = []
        try:
            for i in range(self.sample_len):
                logits = self.inference.logits(tokens, audio_features)
                if i == 0:
                    no_speech_probs = self._no_speech_probs(logits)
                logits = logits[:, -1]
                for logit_filter in self.logit_filters:
                    logit_filter.apply(logits, tokens)
                tokens, completed = self.decoder.update(tokens, logits, sum_logprobs)
                if completed or tokens.shape[-1] > self.n_ctx:
                    break
        finally:
            self.inference.cleanup_caching()
        return tokens, sum_logprobs, no_speech_probs

    def _greedy_loop(self, audio_features: Tensor, tokens: Tensor):
        """Greedy decoding where finished sequences leave the batch."""
        eot = self.tokenizer.eot
        n_batch = tokens.shape[0]
        device = audio_features.device
        sum_logprobs = torch.zeros(n_batch, device=device)
        out = torch.full((n_batch, tokens.shape[-1] + self.sample_len + 1), eot, dtype=tokens.dtype, device=device)
        out[:, : tokens.shape[-1]] = tokens
        length = tokens.shape[-1]
        active = torch.arange(n_batch, device=device)
        no_speech_probs: list[float] = []
        try:
            for i in range(self.sample_len):
                logits = self.inference.logits(tokens, audio_features)
                if i == 0:
                    no_speech_probs = self._no_speech_probs(logits)
                logits = logits[:, -1]
                for logit_filter in self.logit_filters:
                    logit_filter.apply(logits, tokens)
                next_tokens = logits.argmax(dim=-1)
                logprobs = torch.log_softmax(logits.float(), dim=-1)
                sum_logprobs[active] += logprobs[torch.arange(len(active), device=device), next_tokens]
                out[active, length] = next_tokens
                tokens = torch.cat([tokens, next_tokens[:, None]], dim=-1)
                length += 1
                running = next_tokens != eot
                if not bool(running.any()) or length > self.n_ctx:
                    break
                if not bool(running.all()):
                    active, tokens, audio_features = active[running], tokens[running], audio_features[running]
                    self.inference.keep_rows(running)
        finally:
            self.inference.cleanup_caching()
        return out[:, : length + 1], sum_logprobs, no_speech_probs


@torch.no_grad()
def decode(
    model, mel: Tensor, options: DecodingOptions | None = None, **kwargs
) -> DecodingResult | list[DecodingResult]:
    """Drop-in for whisper.decoding.decode, so openai-whisper's transcribe() runs on it."""
    from dataclasses import replace

    options = replace(options or DecodingOptions(), **kwargs)
    single = mel.ndim == 2
    if single:
        mel = mel.unsqueeze(0)
    results = FerrumDecodingTask(model, options).run(mel)
    return results[0] if single else results
