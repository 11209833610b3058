"""Accuracy behaviours on the corpus with the real base model: language, silence, VAD, words, translation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ferrum_cli.audio.constants import SAMPLE_RATE
from ferrum_cli.audio.ffmpeg import decode_file
from ferrum_cli.audio.vad import speech_regions
from ferrum_cli.engine.fallback import repetition_loop
from ferrum_cli.options import TranscribeOptions, VadOptions

from .helpers import JFK, corpus, corpus_rows, english_rows, errors_against, needs_corpus, run_ferrum, wav_bytes, words

pytestmark = needs_corpus


def test_language_is_detected_right_on_every_corpus_clip(executor):
    rows = corpus_rows()
    assert len(rows) == 25
    wrong = []
    for row in rows:
        language, probability = executor.detect_language(row["path"])
        if language not in row["language"].split("+"):
            wrong.append((row["file"], language, probability))
    assert not wrong


def _noises() -> dict[str, np.ndarray]:
    n = 60 * SAMPLE_RATE
    rng = np.random.default_rng(7)
    spectrum = np.fft.rfft(rng.normal(size=n))
    spectrum /= np.sqrt(np.arange(1, len(spectrum) + 1))  # 1/f power: pink
    pink = np.fft.irfft(spectrum, n)
    return {
        "silence": np.zeros(n, np.float32),
        "pink noise": (0.1 * pink / pink.std()).astype(np.float32),
        "tone": (0.3 * np.sin(2 * np.pi * 440 * np.arange(n) / SAMPLE_RATE)).astype(np.float32),
    }


@pytest.mark.parametrize("kind", ["silence", "pink noise", "tone"])
@pytest.mark.parametrize("sequential", [False, True])
def test_no_text_and_no_language_where_there_is_no_speech(executor, kind, sequential):
    result = executor.transcribe(wav_bytes(_noises()[kind]), TranscribeOptions(sequential=sequential))
    assert result.text == "" and result.segments == []
    assert result.language == "und"
    assert result.duration == pytest.approx(60.0, abs=0.01)


def test_silence_through_the_cli_prints_nothing(tmp_path):
    path = tmp_path / "silence.wav"
    path.write_bytes(wav_bytes(_noises()["silence"]))
    proc = run_ferrum("transcribe", str(path), "-f", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["text"] == "" and doc["language"] == "und"


def _lcs(a: str, b: str) -> int:
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b, 1):
            cur.append(prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1]))
        prev = cur
    return prev[-1]


def _sentence_survives(reference: str, segments, start: float, end: float) -> bool:
    """The segments around the clip's place in the file hold most of its reference, letter by letter.

    Letters rather than words, so that a misheard word ("dark suit" as "jadak su") or digits
    written as numbers still count as the sentence being there; a dropped sentence leaves nothing.
    """
    near = " ".join(s.text for s in segments if s.end > start - 1 and s.start < end + 1)
    ref, hyp = words(reference).replace(" ", ""), words(near).replace(" ", "")
    return _lcs(ref, hyp) >= 0.6 * len(ref)


def _wer(reference: str, hypothesis: str) -> float:
    return errors_against(reference, hypothesis, "en") / len(words(reference).split())


def test_clips_joined_with_silences_keep_every_sentence_with_vad(executor):
    rows = english_rows()
    rng = np.random.default_rng(3)
    parts, spans, at = [], [], 0.0
    for row in rows:
        clip = decode_file(row["path"]).samples
        gap = np.zeros(int(rng.uniform(1, 5) * SAMPLE_RATE), np.float32)
        parts += [clip, gap]
        spans.append((at, at + len(clip) / SAMPLE_RATE))
        at += (len(clip) + len(gap)) / SAMPLE_RATE
    audio = wav_bytes(np.concatenate(parts))
    result = executor.transcribe(audio, TranscribeOptions(language="en"))
    with_vad = result.text
    without = executor.transcribe(audio, TranscribeOptions(language="en", vad=False)).text
    lost = [
        r["file"]
        for r, (start, end) in zip(rows, spans)
        if not _sentence_survives(r["reference_transcript"], result.segments, start, end)
    ]
    assert not lost
    # tails of windows are decoded in a later batch; segments still come in time order
    assert [s.start for s in result.segments] == sorted(s.start for s in result.segments)
    assert [s.id for s in result.segments] == list(range(len(result.segments)))
    reference = " ".join(r["reference_transcript"] for r in rows)
    assert _wer(reference, with_vad) <= _wer(reference, without)


def test_the_last_word_before_an_early_end_is_not_read_twice(executor):
    """Whisper closes 'ask what you can do for your country' at 17.2 s, inside 'country', and
    ends the window; the rest of it, decoded again, reads 'country.' once more."""
    question = decode_file(corpus("en_librispeech_4507-16021-0012.wav")).samples
    jfk = decode_file(corpus(JFK)).samples
    audio = np.concatenate([question, np.zeros(int(4.5 * SAMPLE_RATE), np.float32), jfk])
    result = executor.transcribe(wav_bytes(audio), TranscribeOptions(language="en"))
    assert words(result.text).split().count("country") == 2
    assert words(result.text).endswith("ask what you can do for your country")


def test_word_timestamps_on_jfk(executor):
    """Asking for words is enough: the batched engine aligns them (tests/test_words.py compares openai-whisper's)."""
    path = corpus(JFK)
    result = executor.transcribe(path, TranscribeOptions(language="en", word_timestamps=True))
    found = [w for s in result.segments for w in s.words]
    assert len(found) >= 20
    assert all(w.start < w.end for w in found)
    assert all(a.start <= b.start and a.end <= b.end for a, b in zip(found, found[1:]))
    assert all(0 <= w.start and w.end <= result.duration for w in found)
    assert all(0 <= w.probability <= 1 for w in found)
    assert all(type(getattr(w, key)) is float for w in found for key in ("start", "end", "probability"))
    onset = speech_regions(decode_file(path).samples, VadOptions(speech_pad_ms=0))[0][0] / SAMPLE_RATE
    assert abs(found[0].start - onset) <= 0.3


def test_srt_line_limits_hold(tmp_path):
    proc = run_ferrum(
        "transcribe", str(corpus(JFK)), "--language", "en", "--word-timestamps", "-f", "srt", "-f", "json",
        "--max-line-width", "24", "--max-line-count", "1", "-o", str(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    srt = (tmp_path / "en_jfk_inaugural_1961.srt").read_text()
    text_lines = [ln for ln in srt.splitlines() if ln and "-->" not in ln and not ln.isdigit()]
    assert text_lines and all(len(ln) <= 24 for ln in text_lines)
    cues = srt.strip().split("\n\n")
    assert all(len(c.splitlines()) == 3 for c in cues)  # number, times, one line of text
    doc = json.loads((tmp_path / "en_jfk_inaugural_1961.json").read_text())
    assert all({"word", "start", "end", "probability"} <= w.keys() for s in doc["segments"] for w in s["words"])


@pytest.mark.parametrize(
    "name, expected",
    [
        ("es_fleurs_000.ogg", ("travelers", "travellers")),
        ("it_picovoice_test_it.wav", ("radio",)),
        ("es_mls_13697_11991_000000.opus", ("surprise",)),
    ],
)
def test_translation_to_english(executor, name, expected):
    text = executor.transcribe(corpus(name), TranscribeOptions(task="translate")).text.lower()
    assert any(word in text for word in expected), text


def test_multilingual_mode_tags_english_and_german_segments(executor):
    path = corpus("en_de_mixed_faster_whisper_multilingual.mp3")
    result = executor.transcribe(path, TranscribeOptions(multilingual=True))
    tagged = {s.language for s in result.segments}
    assert tagged == {"en", "de"}
    english = " ".join(s.text for s in result.segments if s.language == "en").lower()
    german = " ".join(s.text for s in result.segments if s.language == "de").lower()
    assert "permission" in english and "software" in german


def test_detection_among_given_languages_takes_the_likeliest_of_them(executor):
    """languages (--languages, OpenAI's languages[]), for speech known to be in one of a few: the
    likeliest of those, its probability taken among them; a file's language and, with
    multilingual, each window's."""
    spanish = corpus("es_fleurs_000.ogg")
    _, anywhere = executor.detect_language(spanish)
    language, among = executor.detect_language(spanish, among=("pt", "es"))
    assert language == "es" and anywhere <= among <= 1
    assert executor.detect_language(spanish, among=("pt", "it"))[0] in ("pt", "it")
    result = executor.transcribe(spanish, TranscribeOptions(languages=("pt", "it")))
    assert result.language in ("pt", "it") and 0.5 <= result.language_probability <= 1  # the likelier of two
    mixed = corpus("en_de_mixed_faster_whisper_multilingual.mp3")
    result = executor.transcribe(mixed, TranscribeOptions(multilingual=True, languages=("de", "nl")))
    tagged = {s.language for s in result.segments}
    assert "de" in tagged and tagged <= {"de", "nl"}, tagged  # its English windows are neither, yet one of them


def test_initial_prompt_and_hotwords_reach_the_decoder(executor):
    path = corpus("en_librivox_pocketsphinx_0920.wav")
    plain = executor.transcribe(path, TranscribeOptions(language="en")).segments[0].tokens
    primed = executor.transcribe(path, TranscribeOptions(language="en", hotwords="Marianne Dashwood")).text
    assert primed and plain  # both decode; the prompt changes what the decoder is conditioned on
    assert executor.transcribe(path, TranscribeOptions(language="en", initial_prompt="Sense and Sensibility.")).text


def test_repetition_loops_are_found():
    assert repetition_loop([1, 2, 3, 7, 8, 7, 8, 7, 8, 7, 8, 7, 8, 9]) == (3, 2)
    assert repetition_loop([5] * 6) == (0, 1)
    assert repetition_loop(list(range(40))) is None
    assert repetition_loop([1, 2, 1, 2, 1, 2, 1, 2]) is None  # four times is still speech ("no, no, no, no")
