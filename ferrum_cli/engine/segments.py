"""A decoded window's tokens as segments: text between Whisper's timestamp tokens."""

from __future__ import annotations

import re

from ..audio.constants import TIMESTAMP_SECONDS
from ..results import Segment


def segments_from_tokens(result, offset: float, duration: float, tokenizer) -> list[Segment]:
    """Split a window's tokens at its timestamp tokens; text after the last one ends with the window.

    offset: where the window starts in its input, seconds; duration: its length. Ids are 0..n-1
    within the window: the engine numbers segments in its input once they are in time order.
    """
    begin = tokenizer.timestamp_begin
    segments: list[Segment] = []
    start, pending, pending_logprobs = 0.0, [], []
    logprobs = getattr(result, "token_logprobs", None)

    def close(end: float) -> None:
        text = tokenizer.decode(pending)
        if not text.strip():
            return
        start_s, end_s = min(start, duration), min(max(end, start), duration)
        segments.append(
            Segment(
                len(segments),
                round(offset + start_s, 3),
                round(offset + end_s, 3),
                text,
                list(pending),
                result.avg_logprob,
                result.no_speech_prob,
                result.compression_ratio,
                result.temperature,
                token_logprobs=None if logprobs is None else list(pending_logprobs),
            )
        )

    for k, token in enumerate(result.tokens):
        if token >= begin:
            stamp = (token - begin) * TIMESTAMP_SECONDS
            if pending:
                close(stamp)
                pending, pending_logprobs = [], []
            start = stamp
        else:
            pending.append(token)
            if logprobs is not None:
                pending_logprobs.append(logprobs[k])
    if pending:
        close(duration)
    return segments


def repeats_the_end(text: str, before: str, most: int = 3) -> bool:
    """Whether `text` is only the last word or few of `before`. Whisper's last timestamp can fall
    inside the last word it read, and the tail decoded from there reads that word again."""
    words, previous = re.findall(r"\w+", text.lower()), re.findall(r"\w+", before.lower())
    return 0 < len(words) <= most and previous[-len(words) :] == words
