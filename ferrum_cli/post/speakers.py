"""Speakers onto a transcription: each word gets the speaker whose turn overlaps it most, a
segment that spans a change of speaker is split at the word where it changes, and labels are
numbered in order of first appearance."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..results import Segment, SpeakerTurn, Transcription, Word
from .diarizer import Turn


def label(index: int, names: tuple[str, ...]) -> str:
    """The name of the index-th speaker to appear: the caller's, else SPEAKER_00, SPEAKER_01, ..."""
    return names[index] if index < len(names) else f"SPEAKER_{index:02d}"


def speaker_at(start: float, end: float, turns: list[Turn]) -> int:
    """The turn's speaker that overlaps [start, end] most; with no overlap, the nearest turn's."""
    best, best_overlap = None, 0.0
    for turn in turns:
        overlap = min(end, turn.end) - max(start, turn.start)
        if overlap > best_overlap:
            best, best_overlap = turn.speaker, overlap
    if best is not None:
        return best
    middle = (start + end) / 2
    return min(turns, key=lambda t: max(t.start - middle, middle - t.end, 0.0)).speaker


def assign_speakers(
    result: Transcription, turns: list[Turn], names: tuple[str, ...] = (), known: dict[int, str] | None = None
) -> Transcription:
    """The result with a speaker on every segment and word, split at speaker changes, and its
    turns. known: the diarizer's speakers already named (match_known); the others are labelled
    in order of first appearance."""
    pieces: list[Segment] = []
    for segment in result.segments:
        pieces.extend(_split_at_changes(segment, turns))
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


def _split_at_changes(segment: Segment, turns: list[Turn]) -> list[Segment]:
    """The segment as one piece per run of words with the same speaker (its words' speakers are
    the diarizer's numbers here, labelled by the caller). Without words, one piece, by its span."""
    if not segment.words:
        return [replace(segment, speaker=speaker_at(segment.start, segment.end, turns))]
    words = [replace(w, speaker=speaker_at(w.start, w.end, turns)) for w in segment.words]
    runs: list[list[Word]] = []
    for word in words:
        if runs and runs[-1][-1].speaker == word.speaker:
            runs[-1].append(word)
        else:
            runs.append([word])
    if len(runs) == 1:
        return [replace(segment, words=words, speaker=words[0].speaker)]
    every_word_has_tokens = all(w.tokens for w in words)
    pieces = []
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
            )
        )
    return pieces
