"""Word times for a whole batch of windows at once: openai-whisper's method (DTW over the
cross-attention weights of the alignment heads), with one decoder pass over the batch on the
features the engine already encoded, where openai-whisper encodes each window again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..audio.constants import SAMPLE_RATE
from ..results import Segment, Word

if TYPE_CHECKING:
    import torch

PREPEND_PUNCTUATIONS = "\"'“¿([{-"  # openai-whisper's defaults
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
SENTENCE_END_MARKS = ".。!！?？"
MEDIAN_FILTER_WIDTH = 7
# compare-exchanges after which the middle of seven values is at index 3 (a sorting network's)
MEDIAN_OF_SEVEN = (
    (0, 6), (2, 3), (4, 5), (0, 2), (1, 4), (3, 6), (0, 1), (2, 5), (3, 4), (1, 2), (4, 6), (2, 3), (4, 5), (3, 4)
)  # fmt: skip
# the alignment pass's tokens, and the text positions it projects, are padded to multiples of
# these: a few shapes over an hour, where each new one made oneDNN keep another kernel
TOKEN_STEP = 32
PROJECTED_STEP = 64
ALIGN_ROWS = 4  # rows per decoder pass: the attention weights of all heads are held per layer


def _rounded_up(count: int, step: int) -> int:
    return -(-count // step) * step


@dataclass
class WordTiming:
    word: str
    tokens: list[int]
    start: float  # seconds from the start of the window
    end: float
    probability: float | None  # None where the row is not scored


@dataclass
class AlignmentRow:
    """One window of a batch to align: its row of the features, what it said, how long it is."""

    row: int  # index into the batch's features
    prefix: list[int]  # the start-of-transcript sequence the text was decoded after
    text_tokens: list[int]
    frames: int  # mel frames of the window's audio (100 a second)
    language: str = "en"  # the text's language: unspaced scripts (ja, zh, th, ...) split into words by character
    scored: bool = True  # its words' probabilities wanted; False: their times only (words that carry speakers)


def align_batch(
    model, features: torch.Tensor, rows: list[AlignmentRow], tokenizer, bfloat16: bool = False
) -> list[list[WordTiming]]:
    """WordTimings of each row's text ([rows, 1500, width] features): decoder passes of
    ALIGN_ROWS rows, then one DTW over all of them (its cost is a loop over diagonals, whatever
    the number of rows). bfloat16: the passes in bfloat16 autocast, where the encoder runs so.
    A pass of rows none of which is scored stops at the last alignment heads' scores."""
    matrices, probabilities = [], []
    for at in range(0, len(rows), ALIGN_ROWS):
        found = _alignment_pass(model, features, rows[at : at + ALIGN_ROWS], tokenizer, bfloat16)
        matrices += found[0]
        probabilities += found[1]
    paths = dtw_batch([-m for m in matrices])
    return [_word_timings(path, probs, r, tokenizer) for path, probs, r in zip(paths, probabilities, rows)]


def _alignment_pass(
    model, features: torch.Tensor, rows: list[AlignmentRow], tokenizer, bfloat16: bool
) -> tuple[list[torch.Tensor], list[list[float]]]:
    """Each row's alignment matrix and text-token probabilities (each [] where the pass scores no
    row; a row that is not scored ignores its own), from one decoder pass over the rows."""
    import torch
    from whisper.model import disable_sdpa

    heads = model.alignment_heads.indices().T.tolist()  # (layer, head) pairs
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)
    sequences = [[*r.prefix, tokenizer.no_timestamps, *r.text_tokens, tokenizer.eot] for r in rows]
    width = min(_rounded_up(max(len(s) for s in sequences), TOKEN_STEP), model.dims.n_text_ctx)
    tokens = torch.full((len(rows), width), tokenizer.eot, dtype=torch.long, device=features.device)
    for i, sequence in enumerate(sequences):  # padded at the end: the causal mask keeps the pads out
        tokens[i, : len(sequence)] = torch.tensor(sequence)
    weights: dict[int, torch.Tensor] = {}

    def keep(layer: int):
        def hook(module, inputs, outputs):
            weights[layer] = outputs[-1][:, by_layer[layer]].float()  # [rows, heads, tokens, 1500]

        return hook

    decoder = model.decoder
    scored = any(r.scored for r in rows)
    last = len(decoder.blocks) if scored else max(by_layer)  # the layers run whole
    hooks = [decoder.blocks[layer].cross_attn.register_forward_hook(keep(layer)) for layer in by_layer if layer < last]
    audio = features[[r.row for r in rows]].to(next(model.parameters()).dtype)
    try:
        with torch.no_grad(), disable_sdpa(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bfloat16):
            x = decoder.token_embedding(tokens) + decoder.positional_embedding[: tokens.shape[1]]
            x = x.to(audio.dtype)
            for block in decoder.blocks[:last]:
                x = block(x, audio, mask=decoder.mask)
            if scored:
                probabilities = _text_probabilities(model, x, rows, tokenizer)
            else:
                weights[last] = _cross_scores(decoder.blocks[last], x, audio, by_layer[last], decoder.mask)
                probabilities = [[] for _ in rows]
    finally:
        for hook in hooks:
            hook.remove()
    qk = torch.cat([weights[layer] for layer in sorted(by_layer)], dim=1)
    return [_alignment_matrix(qk[i], r) for i, r in enumerate(rows)], probabilities


def _cross_scores(block, x: torch.Tensor, audio: torch.Tensor, heads: list[int], mask) -> torch.Tensor:
    """The cross-attention scores of `heads` in `block` ([rows, heads, tokens, 1500], float32)
    from its input x, as openai-whisper's qkv_attention computes them (the same numbers), without
    the values, the output and the MLP that only the text's probabilities need."""
    x = x + block.attn(block.attn_ln(x), mask=mask)[0]
    attn = block.cross_attn
    q, k = attn.query(block.cross_attn_ln(x)), attn.key(audio)
    scale = (q.shape[-1] // attn.n_head) ** -0.25
    q = q.view(*q.shape[:2], attn.n_head, -1).permute(0, 2, 1, 3)[:, heads]
    k = k.view(*k.shape[:2], attn.n_head, -1).permute(0, 2, 1, 3)[:, heads]
    return ((q * scale) @ (k * scale).transpose(-1, -2)).float()


def _text_probabilities(model, x: torch.Tensor, rows: list[AlignmentRow], tokenizer) -> list[list[float]]:
    """Each row's probability of each of its text tokens, projecting only the positions that
    predict them ([rows, tokens, width] hidden states) onto the text vocabulary."""
    import torch

    starts = [len(r.prefix) for r in rows]  # the no-timestamps position, which predicts the first text token
    picked = torch.cat([x[i, s : s + len(r.text_tokens)] for i, (s, r) in enumerate(zip(starts, rows))])
    count = len(picked)
    picked = torch.nn.functional.pad(picked, (0, 0, 0, _rounded_up(count, PROJECTED_STEP) - count))
    vocabulary = model.decoder.token_embedding.weight[: tokenizer.eot]
    logits = (model.decoder.ln(picked) @ vocabulary.T.to(picked.dtype)).float()[:count]
    targets = torch.tensor([t for r in rows for t in r.text_tokens])
    probs = logits.softmax(dim=-1)[torch.arange(len(targets)), targets].tolist()
    out, at = [], 0
    for r in rows:
        out.append(probs[at : at + len(r.text_tokens)])
        at += len(r.text_tokens)
    return out


def _alignment_matrix(qk: torch.Tensor, row: AlignmentRow) -> torch.Tensor:
    """openai-whisper's find_alignment up to its DTW: [text tokens + 1, frames / 2] from the row's
    qk [heads, tokens, 1500], normalised per head and median-filtered along time."""
    import torch

    start = len(row.prefix)  # the no-timestamps position, which predicts the first text token
    length = start + 1 + len(row.text_tokens) + 1
    weights = qk[:, :length, : row.frames // 2].softmax(dim=-1)
    std, mean = torch.std_mean(weights, dim=-2, keepdim=True, unbiased=False)
    weights = median_filter((weights - mean) / std)
    return weights.mean(dim=0)[start:-1]


def median_filter(x: torch.Tensor) -> torch.Tensor:
    """openai-whisper's median_filter of width 7 along the last axis of x [heads, tokens, frames]:
    the same values from a comparison network over seven shifted views, where it sorts a copy of
    every window (docs/performance.md)."""
    import torch
    import torch.nn.functional as F

    half = MEDIAN_FILTER_WIDTH // 2
    if x.shape[-1] <= half:
        return x
    padded = F.pad(x, (half, half, 0, 0), mode="reflect")
    frames = x.shape[-1]
    views = [padded[..., i : i + frames] for i in range(MEDIAN_FILTER_WIDTH)]
    for a, b in MEDIAN_OF_SEVEN:
        views[a], views[b] = torch.minimum(views[a], views[b]), torch.maximum(views[a], views[b])
    return views[half]


def dtw_batch(costs: list[torch.Tensor]) -> list[tuple[np.ndarray, np.ndarray]]:
    """(text indices, time indices) of the cheapest monotone path through each [M, N] cost
    matrix: openai-whisper's dtw_cpu, step for step and tie for tie, for all matrices at once
    along anti-diagonals, so that no compiler (numba) is needed at the first call. In numpy, whose
    small operations cost a third of torch's: a diagonal is a dozen of them."""
    rows, cols = max(c.shape[0] for c in costs), max(c.shape[1] for c in costs)
    x = np.zeros((len(costs), rows, cols), dtype=np.float64)
    for b, c in enumerate(costs):  # cells past a matrix's own corner never reach it
        x[b, : c.shape[0], : c.shape[1]] = c.double().numpy()
    # as dtw_cpu: each step adds a float64 cell to a float32 cost and keeps it in float32
    cost = np.full((len(costs), rows + 1, cols + 1), np.inf, dtype=np.float32)
    cost[:, 0, 0] = 0
    trace = np.full((len(costs), rows + 1, cols + 1), -1, dtype=np.int8)
    for diagonal in range(2, rows + cols + 1):
        i = np.arange(max(1, diagonal - cols), min(rows, diagonal - 1) + 1)
        j = diagonal - i
        c0, c1, c2 = cost[:, i - 1, j - 1], cost[:, i - 1, j], cost[:, i, j - 1]
        take0 = (c0 < c1) & (c0 < c2)
        take1 = ~take0 & (c1 < c0) & (c1 < c2)
        chosen = np.where(take0, c0, np.where(take1, c1, c2))
        cost[:, i, j] = (x[:, i - 1, j - 1] + chosen.astype(np.float64)).astype(np.float32)
        trace[:, i, j] = np.where(take0, 0, np.where(take1, 1, 2))
    return [_backtrace(trace[b], c.shape[0], c.shape[1]) for b, c in enumerate(costs)]


def _backtrace(trace: np.ndarray, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """openai-whisper's backtrace, from the corner (rows, cols) of a shared trace."""
    trace = trace[: rows + 1, : cols + 1].copy()
    trace[0, :], trace[:, 0] = 2, 1
    i, j, path = rows, cols, []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        step = trace[i, j]
        i, j = (i - 1, j - 1) if step == 0 else (i - 1, j) if step == 1 else (i, j - 1)
    text, time = np.array(path[::-1]).T
    return text, time


UNSPACED_LANGUAGES = {"zh", "ja", "th", "lo", "my", "yue"}  # openai-whisper's: no spaces between words


def split_words(tokenizer, tokens: list[int], language: str) -> tuple[list[str], list[list[int]]]:
    """openai-whisper's split into words, by the text's own language: the tokenizer's language is
    the engine's ("en" where each input's is detected), which put a Japanese sentence in one word."""
    if language in UNSPACED_LANGUAGES:
        return tokenizer.split_tokens_on_unicode(tokens)
    return tokenizer.split_tokens_on_spaces(tokens)


def _word_timings(path, text_probs: list[float], row: AlignmentRow, tokenizer) -> list[WordTiming]:
    """The rest of openai-whisper's find_alignment: words from the path's jumps."""
    from whisper.audio import TOKENS_PER_SECOND

    text = row.text_tokens
    if not text:
        return []
    text_indices, time_indices = path
    words, word_tokens = split_words(tokenizer, text + [tokenizer.eot], row.language)
    if len(word_tokens) <= 1:
        return []
    boundaries = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    jumps = np.pad(np.diff(text_indices), (1, 0), constant_values=1).astype(bool)
    jump_times = time_indices[jumps] / TOKENS_PER_SECOND
    timings = []
    for word, tokens, i, j in zip(words[:-1], word_tokens[:-1], boundaries[:-1], boundaries[1:]):
        probability = float(np.mean(text_probs[i:j])) if row.scored else None
        timings.append(WordTiming(word, tokens, float(jump_times[i]), float(jump_times[j]), probability))
    return timings


def place_words(segments: list[Segment], alignment: list[WordTiming], offset: float, last_speech: float) -> float:
    """Give a window's segments their words, as openai-whisper's add_word_timestamps does: long
    words at sentence and segment boundaries cut to twice the median, punctuation merged into
    its word, segment bounds moved to their words. offset: the window's start in its input,
    seconds. Returns the end of the last segment with words, for the window after."""
    from whisper.timing import merge_punctuations

    durations = np.array([t.end - t.start for t in alignment])
    durations = durations[durations.nonzero()]
    median = min(0.7, float(np.median(durations))) if len(durations) else 0.0
    longest = median * 2
    if len(durations):
        for i in range(1, len(alignment)):
            if alignment[i].end - alignment[i].start > longest:
                if alignment[i].word in SENTENCE_END_MARKS:
                    alignment[i].end = alignment[i].start + longest
                elif alignment[i - 1].word in SENTENCE_END_MARKS:
                    alignment[i].start = alignment[i].end - longest
    merge_punctuations(alignment, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS)
    timings = iter(alignment)
    for segment in segments:
        words, taken = [], 0
        while taken < len(segment.tokens) and (timing := next(timings, None)) is not None:
            if timing.word:
                words.append(
                    {
                        "word": timing.word,
                        "start": round(offset + timing.start, 2),
                        "end": round(offset + timing.end, 2),
                        "probability": timing.probability,
                        "tokens": tuple(timing.tokens),
                    }
                )
            taken += len(timing.tokens)
        if words:
            _fit_segment(segment, words, median, last_speech)
            segment.start, segment.end = min(segment.start, words[0]["start"]), max(segment.end, words[-1]["end"])
            last_speech = segment.end
        segment.words = words
    return last_speech


def _fit_segment(segment: Segment, words: list[dict], median: float, last_speech: float) -> None:
    """openai-whisper's boundary rules: a first word after a pause no longer than twice the
    median, and the segment's own times kept where its first or last word runs far past them."""
    longest = median * 2
    first_long = words[0]["end"] - words[0]["start"] > longest
    if words[0]["end"] - last_speech > median * 4 and (
        first_long or (len(words) > 1 and words[1]["end"] - words[0]["start"] > longest * 2)
    ):
        if len(words) > 1 and words[1]["end"] - words[1]["start"] > longest:
            boundary = max(words[1]["end"] / 2, words[1]["end"] - longest)
            words[0]["end"] = words[1]["start"] = boundary
        words[0]["start"] = max(0, words[0]["end"] - longest)
    if segment.start < words[0]["end"] and segment.start - 0.5 > words[0]["start"]:
        words[0]["start"] = max(0, min(words[0]["end"] - median, segment.start))
    else:
        segment.start = words[0]["start"]
    if segment.end > words[-1]["start"] and segment.end + 0.5 < words[-1]["end"]:
        words[-1]["end"] = max(words[-1]["start"] + median, segment.end)
    else:
        segment.end = words[-1]["end"]


def snap_to_speech(segments: list[Segment], regions: list[tuple[int, int]]) -> None:
    """A word, or a segment without words, that starts in silence starts where the next speech
    does: the alignment tends to stretch the first word of a stretch of speech back over the
    pause before it, and Whisper dates a segment after a pause from the end of the one before.
    regions: VAD's unpadded speech, in samples."""
    starts = [a / SAMPLE_RATE for a, _ in regions]
    ends = [b / SAMPLE_RATE for _, b in regions]

    def snapped(start: float, end: float) -> float:
        if any(a <= start < b for a, b in zip(starts, ends)):
            return start
        after = min((a for a in starts if a > start), default=end)
        return round(after, 3) if after < end else start

    for segment in segments:
        if segment.words is None:
            segment.start = snapped(segment.start, segment.end)
            continue
        for word in segment.words:
            word["start"] = snapped(word["start"], word["end"])
        if segment.words:
            segment.start = segment.words[0]["start"]


def typed_words(segments: list[Segment]) -> None:
    """The words the engine timed and fitted (dicts while it moves their bounds) as frozen Words,
    with plain floats: what every later stage and writer reads."""
    for segment in segments:
        if segment.words is not None:
            segment.words = [Word(**{k: _plain(v) for k, v in word.items()}) for word in segment.words]


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value
