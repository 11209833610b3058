"""Temperature fallback, as openai-whisper's: a window whose text fails the thresholds is decoded
again at the next temperature; a loop that outlives them all is cut to one copy."""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

from ..options import TranscribeOptions

if TYPE_CHECKING:
    import torch


def repetition_loop(tokens: list[int], min_repeats: int = 5, max_period: int = 16) -> tuple[int, int] | None:
    """(start, period) of the first run where the same 1..max_period tokens repeat min_repeats times.

    Whisper's failure mode on hard audio is a loop of one phrase; the compression ratio catches
    long loops, this catches short ones too.
    """
    n = len(tokens)
    for start in range(n):
        for period in range(1, max_period + 1):
            end = start + period * min_repeats
            if end > n:
                break
            unit = tokens[start : start + period]
            if all(tokens[start + k * period : start + (k + 1) * period] == unit for k in range(1, min_repeats)):
                return start, period
    return None


def text_tokens(result, eot: int) -> list[int]:
    return [t for t in result.tokens if t < eot]


def cut_loop(result, tokenizer):
    """Keep one copy of a loop that outlived every fallback temperature: the loop is never emitted."""
    tokens = text_tokens(result, tokenizer.eot)
    found = repetition_loop(tokens)
    if found is None:
        return result
    start, period = found
    kept = tokens[: start + period]
    changes = {"tokens": kept, "text": tokenizer.decode(kept).strip()}
    if (logprobs := getattr(result, "token_logprobs", None)) is not None:
        text_logprobs = [lp for t, lp in zip(result.tokens, logprobs) if t < tokenizer.eot]
        changes["token_logprobs"] = tuple(text_logprobs[: len(kept)])
    return replace(result, **changes)


def is_silence(result, options: TranscribeOptions) -> bool:
    """openai-whisper's rule: no speech is likely and the text is unsure."""
    return (
        options.no_speech_threshold is not None
        and result.no_speech_prob > options.no_speech_threshold
        and options.logprob_threshold is not None
        and result.avg_logprob < options.logprob_threshold
    )


def needs_fallback(result, options: TranscribeOptions, eot: int) -> bool:
    return is_loop(text_tokens(result, eot), result.compression_ratio, options) or is_unsure(result, options)


def is_loop(tokens: list[int], compression_ratio: float, options: TranscribeOptions) -> bool:
    """One phrase over and over: a short run repeated, or text that compresses too well."""
    if repetition_loop(tokens):
        return True
    threshold = options.compression_ratio_threshold
    return threshold is not None and compression_ratio > threshold


def is_unsure(result, options: TranscribeOptions) -> bool:
    """A low mean log probability, unless the window is silence."""
    if options.logprob_threshold is not None and result.avg_logprob < options.logprob_threshold:
        return not is_silence(result, options)
    return False


@contextmanager
def seeded_sampling(seed: int) -> Iterator[None]:
    """Temperature sampling from a fixed seed, so that the same input gives the same text on
    every run; the caller's random state is left as it was."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def decode_with_fallback(
    model,
    features: torch.Tensor,
    options: TranscribeOptions,
    prompt: list[int] | None,
    cache_dtype: torch.dtype,
    tokenizer,
    languages: list[str] | None = None,
    one_look: AbstractSet[int] = frozenset(),
    unfinished: torch.Tensor | None = None,
) -> list:
    """Decode encoded windows ([windows, 1500, width]) together; those that fail the thresholds
    go again at the next temperature, except the rows in one_look, decoded at the first only.

    languages: one per row, where rows come from inputs detected apart; unfinished: see
    decoding.SpeechContinuation.
    """
    from whisper.decoding import DecodingOptions

    results: list = [None] * features.shape[0]
    pending = list(range(features.shape[0]))
    for step, temperature in enumerate(options.temperature):
        kwargs = options.decode_kwargs(temperature)
        with seeded_sampling(int(temperature * 1000)):
            rows = [languages[i] for i in pending] if languages else None
            if rows:
                kwargs["language"] = None  # each row carries its own input's language
            decoded = model.decode(
                features[pending],
                DecodingOptions(**kwargs, prompt=prompt),
                fast_cache_dtype=cache_dtype,
                row_languages=rows,
                unfinished=None if unfinished is None else unfinished[pending],
            )
        still = []
        for index, result in zip(pending, decoded):
            results[index] = result
            if not (step == 0 and index in one_look) and needs_fallback(result, options, tokenizer.eot):
                still.append(index)
        pending = still
        if not pending:
            break
    for index in pending:  # still failing at the last temperature: at least never emit a loop
        results[index] = cut_loop(results[index], tokenizer)
    return results
