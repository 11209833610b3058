"""Word timestamps in the batched engine: the alignment heads' cross-attention for a whole batch
at once, checked against openai-whisper's own (the sequential engine) on the same words."""

from __future__ import annotations

import difflib
import json
import math
import re
import statistics

import pytest

from ferrum_cli.options import TranscribeOptions

from .helpers import JFK, corpus, english_rows, needs_corpus, run_ferrum

pytestmark = needs_corpus


def _english_clips() -> list[str]:
    return [r["path"] for r in english_rows()]


def _key(word: str) -> str:
    return re.sub(r"\W", "", word.lower())


@pytest.fixture(scope="module")
def timed(executor) -> dict[str, tuple]:
    """Each English clip: (batched result, sequential result), words timed in both."""
    paths = _english_clips()
    options = TranscribeOptions(language="en", word_timestamps=True)
    batched = dict(executor.transcribe_many([(p, p) for p in paths], options))
    sequential = {p: executor.transcribe(p, TranscribeOptions(language="en", word_timestamps=True, sequential=True))
                  for p in paths}  # fmt: skip
    return {p: (batched[p], sequential[p]) for p in paths}


def test_every_word_of_the_text_has_a_time_inside_its_segment_and_in_order(timed):
    for path, (result, _) in timed.items():
        assert result.options["engine"] == "batched", path
        found = [w for s in result.segments for w in s.words]
        assert found, path
        for segment in result.segments:
            assert "".join(w.word for w in segment.words).strip() == segment.text.strip(), path
            assert all(segment.start <= w.start <= w.end <= segment.end for w in segment.words), path
        assert all(a.start <= b.start and a.end <= b.end for a, b in zip(found, found[1:])), path
        assert all(0 <= w.probability <= 1 for w in found)
        assert all(type(getattr(w, key)) is float for w in found for key in ("start", "end", "probability"))


def test_words_timed_only_for_their_speakers_have_the_times_of_words_asked_for(executor, timed):
    """Diarization times words that nobody asked for (for_engine): their alignment stops at the
    last alignment heads' scores and leaves out the text's probabilities, with the same times."""
    assert TranscribeOptions(diarize=True).for_engine().word_probabilities is False
    options = TranscribeOptions(language="en", word_timestamps=True, word_probabilities=False)
    times_only = dict(executor.transcribe_many([(p, p) for p in timed], options))
    for path, (scored, _) in timed.items():
        words = [w for s in times_only[path].segments for w in s.words]
        assert [(w.word, w.start, w.end) for w in words] == [
            (w.word, w.start, w.end) for s in scored.segments for w in s.words
        ], path
        assert words and all(w.probability is None for w in words), path


def test_word_times_are_within_a_fifth_of_a_second_of_openai_whisper(timed):
    """Median over every word both engines read alike, starts and ends."""
    gaps = []
    for batched, sequential in timed.values():
        ours = [w for s in batched.segments for w in s.words]
        theirs = [w for s in sequential.segments for w in s.words]
        matcher = difflib.SequenceMatcher(a=[_key(w.word) for w in ours], b=[_key(w.word) for w in theirs])
        for block in matcher.get_matching_blocks():
            for k in range(block.size):
                a, b = ours[block.a + k], theirs[block.b + k]
                gaps += [abs(a.start - b.start), abs(a.end - b.end)]
    assert len(gaps) >= 2 * 150  # most of the clips' 200-odd words are read alike
    assert statistics.median(gaps) <= 0.2, statistics.median(gaps)


def test_subtitle_lines_from_batched_word_times(tmp_path):
    proc = run_ferrum(
        "transcribe", str(corpus(JFK)), "--word-timestamps", "-f", "srt", "-f", "json", "--max-words-per-line", "3",
        "--highlight-words", "-o", str(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "en_jfk_inaugural_1961.json").read_text())
    assert doc["options"]["engine"] == "batched"
    srt = (tmp_path / "en_jfk_inaugural_1961.srt").read_text()
    cues = [c.splitlines() for c in srt.strip().split("\n\n")]
    assert len(cues) >= 20  # highlighting: a cue per word
    assert all(len(re.sub(r"</?u>", "", cue[2]).split()) <= 3 for cue in cues)
    assert all("<u>" in cue[2] for cue in cues)


def test_batched_dtw_is_openai_whispers_step_for_step():
    """dtw_batch replaces numba's compiled dtw_cpu (a second at the first call): same paths, ties included."""
    import numpy as np
    import torch
    from whisper.timing import dtw_cpu

    from ferrum_cli.engine.words import dtw_batch

    rng = np.random.default_rng(1)
    costs = [torch.from_numpy(rng.normal(size=(rng.integers(2, 60), rng.integers(30, 400)))).float() for _ in range(12)]
    costs += [torch.zeros(7, 50), torch.from_numpy(np.round(rng.normal(size=(20, 100)), 1)).float()]  # ties
    for cost, (text, time) in zip(costs, dtw_batch(costs)):
        expected = dtw_cpu(cost.double().numpy())
        assert np.array_equal(text, expected[0]) and np.array_equal(time, expected[1]), tuple(cost.shape)


def test_median_filter_is_openai_whispers_value_for_value():
    """The comparison network gives the median openai-whisper's sort gives, ties and edges included."""
    import torch
    from whisper.timing import median_filter as whisper_median_filter

    from ferrum_cli.engine.words import MEDIAN_FILTER_WIDTH, median_filter

    generator = torch.Generator().manual_seed(2)
    shapes = [(6, 40, 750), (2, 3, 5), (1, 1, 4), (3, 2, 3), (4, 9, 1500)]
    tensors = [torch.randn(shape, generator=generator) for shape in shapes]
    tensors += [torch.randint(-2, 3, (5, 20, 300), generator=generator).float()]  # many ties
    for x in tensors:
        assert torch.equal(median_filter(x), whisper_median_filter(x, MEDIAN_FILTER_WIDTH)), tuple(x.shape)


def test_each_tokens_log_probability_is_the_one_its_word_was_read_with(executor):
    """Segment.token_logprobs (what include[]=logprobs sends) belong to the tokens as decoded: the
    alignment pass reads each word's probability again in a pass of its own, and the two agree word
    by word; the same numbers one token off do not."""
    gaps, shifted = [], []
    for name in ("en_jfk_inaugural_1961.flac", "de_picovoice_test_de.wav", "fr_fleurs_003.ogg"):
        result = executor.transcribe(str(corpus(name)), TranscribeOptions(word_timestamps=True))
        for segment in result.segments:
            assert len(segment.token_logprobs) == len(segment.tokens)
            probabilities = [math.exp(lp) for lp in segment.token_logprobs]
            at = 0
            for word in segment.words:
                n = len(word.tokens)
                assert segment.tokens[at : at + n] == list(word.tokens)
                gaps.append(abs(statistics.mean(probabilities[at : at + n]) - word.probability))
                if at:
                    shifted.append(abs(statistics.mean(probabilities[at - 1 : at - 1 + n]) - word.probability))
                at += n
    assert len(gaps) > 50 and statistics.mean(gaps) < 0.06, statistics.mean(gaps)  # 0.02 here
    assert statistics.mean(shifted) > 3 * statistics.mean(gaps), (statistics.mean(shifted), statistics.mean(gaps))
