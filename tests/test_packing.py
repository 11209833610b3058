"""Short inputs of one given language share 30 s windows (the batched engine's _pack), and each
input still gets its own words, at its own times."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from ferrum_cli.audio.ffmpeg import decode_file
from ferrum_cli.options import TranscribeOptions

from .helpers import english_rows, errors_against, needs_corpus, run_ferrum, words

ENGLISH = english_rows()


def joined_digits(text: str) -> str:
    """Digits apart by only spaces, commas or dashes joined, as the bench scores them: "1-0-0-0-1"
    and "10001" are the same digits read aloud."""
    return re.sub(r"(?<=\d)[\s,\-]+(?=\d)", "", text)


def scored(text: str) -> list[str]:
    return words(joined_digits(text)).split()


@needs_corpus
def test_packed_clips_keep_their_own_words_and_read_no_worse_than_alone(executor):
    """Every English clip: packed with its neighbours, its text starts and ends with words of its
    own (no word moved in from the input before or after it), and the clips read no worse in
    total than each alone."""
    clips = [r["path"] for r in ENGLISH]
    alone = {c: executor.transcribe(c, TranscribeOptions(language="en")) for c in clips}
    packed = dict(executor.transcribe_many([(c, c) for c in clips], TranscribeOptions(language="en")))
    assert sum(1 for c in clips if packed[c].options.get("packed")) >= len(clips) // 2
    assert not any(result.options.get("packed") for result in alone.values())
    for row in ENGLISH:
        clip = row["path"]
        own = set(scored(row["reference_transcript"])) | set(scored(alone[clip].text))
        text = scored(packed[clip].text)
        assert text and text[0] in own and text[-1] in own, (clip, packed[clip].text, alone[clip].text)
        duration = len(decode_file(clip).samples) / 16000
        assert all(0 <= s.start <= s.end <= duration + 0.02 for s in packed[clip].segments), clip
    errors = {
        name: sum(
            errors_against(joined_digits(r["reference_transcript"]), joined_digits(texts[r["path"]].text), "en")
            for r in ENGLISH
        )
        for name, texts in (("alone", alone), ("packed", packed))
    }
    assert errors["packed"] <= errors["alone"], errors


def noisy(samples: np.ndarray, snr_db: float) -> np.ndarray:
    """The samples under white noise (a fixed seed) at snr_db below their mean power."""
    noise = np.random.default_rng(0).standard_normal(len(samples)).astype(np.float32)
    noise *= np.sqrt(np.mean(samples**2) / np.mean(noise**2) / 10 ** (snr_db / 10))
    return (samples + noise).astype(np.float32)


@needs_corpus
@pytest.mark.parametrize("beam_size", [None, 3])
def test_an_input_whisper_is_unsure_of_when_packed_is_read_alone_and_the_rest_stay_packed(executor, beam_size):
    """The inputs before a packed one are context its words are read in. Where Whisper is unsure
    of an input's own words (their mean log probability under -0.5), it is read again in a window
    of its own and gets the text it gets alone; the inputs it was packed with keep their windows,
    and each packed input's segments give its own tokens' mean log probability, not the window's.
    Beam search keeps each beam's token log probabilities for this (the window's mean judged all)."""
    paths = [
        next(r["path"] for r in ENGLISH if r["file"].startswith(name))
        for name in ("en_jfk", "en_harvard", "en_librispeech_4507")
    ]
    inputs = [decode_file(path).samples for path in paths]
    inputs[1] = noisy(inputs[1], snr_db=10)  # a quiet clip under hiss: Whisper guesses at its words
    options = TranscribeOptions(language="en", beam_size=beam_size)
    alone = executor.transcribe(inputs[1], options)
    results = dict(executor.transcribe_many(list(enumerate(inputs)), options))
    assert not results[1].options.get("packed")
    assert results[1].text == alone.text
    for i in (0, 2):
        assert results[i].options.get("packed"), i
        own = [value for segment in results[i].segments for value in segment.token_logprobs]
        mean = sum(own) / len(own)
        assert mean >= -0.5 and all(s.avg_logprob == pytest.approx(mean) for s in results[i].segments), i


@needs_corpus
def test_packed_words_are_timed_within_their_own_clip(executor):
    clips = [r["path"] for r in ENGLISH[:6]]
    options = TranscribeOptions(language="en", word_timestamps=True)
    alone = {c: executor.transcribe(c, options) for c in clips}
    packed = dict(executor.transcribe_many([(c, c) for c in clips], options))
    assert any(result.options.get("packed") for result in packed.values())
    for clip in clips:
        times = [(w.start, w.end) for s in packed[clip].segments for w in s.words]
        duration = len(decode_file(clip).samples) / 16000
        assert times and all(0 <= a <= b <= duration + 0.02 for a, b in times), clip
        assert all(a[0] <= b[0] for a, b in zip(times, times[1:])), clip  # in order
        first_alone = alone[clip].segments[0].words[0]
        first_packed = packed[clip].segments[0].words[0]
        if words(first_alone.word) == words(first_packed.word):  # the same first word starts at about the same time
            assert abs(first_alone.start - first_packed.start) <= 0.5, (clip, first_alone, first_packed)


@needs_corpus
@pytest.mark.parametrize("pack", [True, False])
def test_the_cli_packs_short_files_unless_told_not_to(tmp_path, pack):
    """--no-pack-short reads each file alone: its text is the one `ferrum transcribe` gives it by itself.
    The files are read by Whisper with confidence, so that packed they all stay packed."""
    rows = ENGLISH[2:5]
    clips = [r["path"] for r in rows]
    flag = [] if pack else ["--no-pack-short"]
    proc = run_ferrum("transcribe", *clips, "--language", "en", "-f", "json", "-o", str(tmp_path), *flag)
    assert proc.returncode == 0, proc.stderr
    docs = [json.loads((tmp_path / (r["file"].rsplit(".", 1)[0] + ".json")).read_text()) for r in rows]
    assert all(doc["options"].get("packed", False) is pack for doc in docs)
    if not pack:
        alone = run_ferrum("transcribe", clips[1], "--language", "en", "-f", "txt")
        assert alone.stdout.strip() == docs[1]["text"].strip()


@needs_corpus
def test_the_same_clip_many_times_is_packed_and_not_taken_for_a_loop(executor, tmp_path):
    """Inputs alike compress well together; a loop is judged input by input, so six copies of a
    clip share windows and each reads as the clip alone."""
    clip = next(r["path"] for r in ENGLISH if r["file"].startswith("en_jfk"))
    alone = executor.transcribe(clip, TranscribeOptions(language="en")).text
    results = dict(executor.transcribe_many([(i, clip) for i in range(6)], TranscribeOptions(language="en")))
    assert all(result.options.get("packed") for result in results.values())
    assert all(scored(result.text) == scored(alone) for result in results.values())
