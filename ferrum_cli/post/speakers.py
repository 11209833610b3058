"""Speakers onto a transcription: each word gets the speaker whose turn overlaps it most, a
segment that spans a change of speaker is split at the word where it changes, words that no turn
covers extend their speaker's turns, and labels are numbered in order of first appearance."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import replace

import numpy as np

from ..results import Segment, SpeakerTurn, Transcription, Word
from .diarizer import Turn


def label(index: int, names: tuple[str, ...]) -> str:
    """The name of the index-th speaker to appear: the caller's, else SPEAKER_00, SPEAKER_01, ..."""
    return names[index] if index < len(names) else f"SPEAKER_{index:02d}"


class TurnIndex:
    """Turns sorted by start, to find the speaker of a stretch of time without reading them all:
    an hour has a thousand turns and ten thousand words."""

    def __init__(self, turns: list[Turn]) -> None:
        self.turns = sorted(turns, key=lambda t: t.start)
        self.starts = [t.start for t in self.turns]
        self.longest = max((t.end - t.start for t in self.turns), default=0.0)
        self.last_ending: list[int] = []  # [i]: of turns[: i + 1], the index of the one that ends last
        for i, turn in enumerate(self.turns):
            before = self.last_ending[-1] if self.last_ending else i
            self.last_ending.append(i if turn.end > self.turns[before].end else before)

    def speaker_at(self, start: float, end: float) -> int:
        """The speaker of the turn that overlaps [start, end] most; with no overlap, the nearest turn's."""
        best, best_overlap = None, 0.0
        first = bisect_left(self.starts, start - self.longest)  # no turn before it reaches start
        for turn in self.turns[first : bisect_left(self.starts, end)]:
            overlap = min(end, turn.end) - max(start, turn.start)
            if overlap > best_overlap:
                best, best_overlap = turn.speaker, overlap
        if best is not None:
            return best
        middle = (start + end) / 2
        after = bisect_right(self.starts, middle)  # turns[after] is the first to start past the middle
        nearest = [self.turns[self.last_ending[after - 1]]] if after else []
        nearest += self.turns[after : after + 1]
        return min(nearest, key=lambda t: max(t.start - middle, middle - t.end, 0.0)).speaker


def assign_speakers(
    result: Transcription, turns: list[Turn], names: tuple[str, ...] = (), known: dict[int, str] | None = None
) -> Transcription:
    """The result with a speaker on every segment and word, split at speaker changes, and its
    turns (heard_turns). known: the diarizer's speakers already named (match_known); the others
    are labelled in order of first appearance."""
    pieces: list[Segment] = []
    index = TurnIndex(turns)
    for segment in result.segments:
        pieces.extend(_split_at_changes(segment, index))
    turns = heard_turns(turns, pieces)
    order: dict[int, str] = dict(known or {})  # diarizer's speaker -> label
    unknown = 0
    for speaker in [piece.speaker for piece in pieces] + [turn.speaker for turn in turns]:
        if speaker not in order:  # those heard where no text was come after those who spoke text
            order[speaker], unknown = label(unknown, names), unknown + 1
    segments = []
    for i, piece in enumerate(pieces):
        words = [replace(w, speaker=order[w.speaker]) for w in piece.words] if piece.words is not None else None
        segments.append(replace(piece, id=i, speaker=order[piece.speaker], words=words))
    result = replace(result, segments=segments)
    result.turns = [SpeakerTurn(round(t.start, 3), round(t.end, 3), order[t.speaker]) for t in turns]
    return result


def heard_turns(turns: list[Turn], pieces: list[Segment]) -> list[Turn]:
    """The diarizer's turns, and the stretches of words that no turn covers, each given to its
    word's speaker: where Whisper heard a word someone spoke, though the diarizer's VAD, strict so
    that its voice prints are clean, may have heard nothing there. pieces: segments whose words
    carry the diarizer's speaker numbers. Stretches of one speaker that touch are one turn."""
    covered = _union([(t.start, t.end) for t in turns])
    ends = [b for _, b in covered]
    spans: dict[int, list[tuple[float, float]]] = {}  # speaker -> their turns and uncovered words
    for turn in turns:
        spans.setdefault(turn.speaker, []).append((turn.start, turn.end))
    for piece in pieces:
        for word in piece.words or ():
            if any(c.isalnum() for c in word.word):  # a word, not a music note or a lone mark
                spans.setdefault(word.speaker, []).extend(_uncovered(word.start, word.end, covered, ends))
    merged = [Turn(a, b, speaker) for speaker, theirs in spans.items() for a, b in _union(theirs)]
    return sorted(merged, key=lambda t: (t.start, t.end, t.speaker))


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint spans covering the same time as `spans`."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _uncovered(
    start: float, end: float, covered: list[tuple[float, float]], ends: list[float]
) -> list[tuple[float, float]]:
    """The parts of [start, end] outside `covered` (sorted, disjoint; `ends` their ends)."""
    parts = []
    i = bisect_right(ends, start)  # the first span that ends after start
    while start < end and i < len(covered) and covered[i][0] < end:
        if covered[i][0] > start:
            parts.append((start, covered[i][0]))
        start = max(start, covered[i][1])
        i += 1
    if start < end:
        parts.append((start, end))
    return parts


def match_known(voices: dict[int, np.ndarray], known: dict[str, np.ndarray], threshold: float) -> dict[int, str]:
    """{diarizer's speaker: known name} for the voices like a known speaker's sample (cosine
    similarity at or above threshold), each name given once, best matches first."""
    from scipy.optimize import linear_sum_assignment

    speakers, names = list(voices), list(known)
    if not speakers or not names:
        return {}
    a = np.stack([voices[s] / np.linalg.norm(voices[s]) for s in speakers])
    b = np.stack([known[n] / np.linalg.norm(known[n]) for n in names])
    similarity = a @ b.T
    rows, cols = linear_sum_assignment(-similarity)
    return {speakers[r]: names[c] for r, c in zip(rows, cols) if similarity[r, c] >= threshold}


def _split_at_changes(segment: Segment, turns: TurnIndex) -> list[Segment]:
    """The segment as one piece per run of words with the same speaker (its words' speakers are
    the diarizer's numbers here, labelled by the caller). Without words, one piece, by its span."""
    if not segment.words:
        return [replace(segment, speaker=turns.speaker_at(segment.start, segment.end))]
    words = [replace(w, speaker=turns.speaker_at(w.start, w.end)) for w in segment.words]
    runs: list[list[Word]] = []
    for word in words:
        if runs and runs[-1][-1].speaker == word.speaker:
            runs[-1].append(word)
        else:
            runs.append([word])
    if len(runs) == 1:
        return [replace(segment, words=words, speaker=words[0].speaker)]
    every_word_has_tokens = all(w.tokens for w in words)
    logprobs = segment.token_logprobs
    if not every_word_has_tokens or [t for w in words for t in w.tokens] != list(segment.tokens):
        logprobs = None  # not split with the tokens: none rather than misplaced
    pieces, at = [], 0
    for i, run in enumerate(runs):
        if every_word_has_tokens:
            tokens = [t for w in run for t in w.tokens]
        else:  # openai-whisper's words (the sequential engine) do not say which tokens they are
            tokens = list(segment.tokens) if i == 0 else []
        pieces.append(
            replace(
                segment,
                start=segment.start if i == 0 else run[0].start,
                end=segment.end if i == len(runs) - 1 else run[-1].end,
                text="".join(w.word for w in run),
                tokens=tokens,
                words=run,
                speaker=run[0].speaker,
                token_logprobs=None if logprobs is None else logprobs[at : at + len(tokens)],
            )
        )
        at += len(tokens)
    return pieces
