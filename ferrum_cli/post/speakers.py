"""Speakers onto a transcription: each word gets the speaker whose turn overlaps it most, a
segment that spans a change of speaker is split at the word where it changes, and labels are
numbered in order of first appearance."""

from __future__ import annotations

from dataclasses import replace

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


def assign_speakers(result: Transcription, turns: list[Turn], names: tuple[str, ...] = ()) -> Transcription:
    """The result with a speaker on every segment and word, split at speaker changes, and its turns."""
    pieces: list[Segment] = []
    for segment in result.segments:
        pieces.extend(_split_at_changes(segment, turns))
    order: dict[int, str] = {}  # diarizer's speaker -> label, in order of first appearance
    for piece in pieces:
        order.setdefault(piece.speaker, label(len(order), names))
    for turn in turns:  # speakers heard where no text was: numbered after those who spoke text
        order.setdefault(turn.speaker, label(len(order), names))
    segments = []
    for i, piece in enumerate(pieces):
        words = [replace(w, speaker=order[w.speaker]) for w in piece.words] if piece.words is not None else None
        segments.append(replace(piece, id=i, speaker=order[piece.speaker], words=words))
    result = replace(result, segments=segments)
    result.turns = [SpeakerTurn(round(t.start, 3), round(t.end, 3), order[t.speaker]) for t in turns]
    return result


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
