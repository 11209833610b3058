"""Gain never decides whether speech is transcribed: quiet, clipped, and alternating levels read
as at full scale; silence, noise and tones give no text at any level, and say so."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from ferrum_cli.audio.constants import SAMPLE_RATE
from ferrum_cli.audio.ffmpeg import decode_file
from ferrum_cli.audio.level import NORMAL_LEVEL, frame_levels, raised_for_vad, raised_spans
from ferrum_cli.options import TranscribeOptions

from .helpers import (
    JFK,
    corpus,
    corpus_rows,
    english_rows,
    errors_against,
    float_wav_bytes,
    needs_corpus,
    run_ferrum,
    wav_bytes,
)
from .test_accuracy import _sentence_survives

pytestmark = needs_corpus

# one clip a language: (file, language)
CLIPS = {
    "en": JFK,
    "de": "de_picovoice_test_de.wav",
    "es": "es_fleurs_000.ogg",
    "pt": "pt_picovoice_test_pt.wav",
    "ru": "ru_deepspeech_ru.wav",
}
ATTENUATIONS_DB = (30, 45, 60)
NO_SPEECH = re.compile(r"^warning: (?P<name>.+): no speech found \(peak (?P<peak>-\d+|-inf) dBFS\)$", re.M)


def _reference(name: str) -> str:
    return next(r["reference_transcript"] for r in corpus_rows() if r["file"] == name)


@pytest.fixture(scope="module")
def level_files(tmp_path_factory) -> dict[str, tuple[str, str]]:
    """stem -> (clip, language): each clip at full scale and attenuated, and JFK clipped 12 dB over full scale."""
    folder = tmp_path_factory.mktemp("levels")
    files = {}
    for language, name in CLIPS.items():
        samples = decode_file(corpus(name)).samples
        for db in (0, *ATTENUATIONS_DB):
            (folder / f"{language}_minus{db}.wav").write_bytes(float_wav_bytes(samples * 10 ** (-db / 20)))
            files[f"{language}_minus{db}"] = (name, language)
    jfk = decode_file(corpus(JFK)).samples
    (folder / "en_clipped.wav").write_bytes(float_wav_bytes(np.clip(jfk * 10 ** (12 / 20) / np.abs(jfk).max(), -1, 1)))
    files["en_clipped"] = (JFK, "en")
    return {"folder": folder, "files": files}


@pytest.mark.parametrize(
    "engine, levels", [([], ATTENUATIONS_DB), (["--sequential"], (60,))], ids=["batched", "sequential"]
)
def test_quiet_and_clipped_speech_reads_as_at_full_scale(level_files, tmp_path, engine, levels):
    """Through the CLI, language detected: at -30, -45 and -60 dB (and clipped), at most one word
    error more than the same clip at full scale, and the same language. The sequential engine,
    slower, is read at the lowest level alone: it raises quiet audio the same way."""
    stems = [s for s in level_files["files"] if s == "en_clipped" or int(s.rsplit("minus", 1)[1]) in (0, *levels)]
    paths = [str(level_files["folder"] / f"{stem}.wav") for stem in stems]
    proc = run_ferrum("transcribe", *paths, "-f", "json", "-o", str(tmp_path), "-q", *engine)
    assert proc.returncode == 0, proc.stderr
    assert not NO_SPEECH.search(proc.stderr), proc.stderr
    docs = {stem: json.loads((tmp_path / f"{stem}.json").read_text()) for stem in stems}
    worse = []
    for stem, (name, language) in ((s, level_files["files"][s]) for s in stems):
        full = docs[f"{language}_minus0"]
        assert docs[stem]["speech"] and docs[stem]["language"] == full["language"] == language, stem
        errors, baseline = (
            errors_against(_reference(name), docs[s]["text"], language) for s in (stem, f"{language}_minus0")
        )
        if errors > baseline + 1:
            worse.append((stem, baseline, errors, docs[stem]["text"]))
    assert not worse


@pytest.mark.parametrize("sequential", [False, True], ids=["batched", "sequential"])
def test_loud_and_quiet_speech_alternating_loses_no_sentence(executor, sequential):
    """English clips joined with pauses, every other one 60 dB down: every sentence is in the text."""
    rows = english_rows()
    rng = np.random.default_rng(5)
    parts, spans, at = [], [], 0.0
    for i, row in enumerate(rows):
        clip = decode_file(row["path"]).samples * (10 ** (-60 / 20) if i % 2 else 1.0)
        gap = np.zeros(int(rng.uniform(2.5, 5) * SAMPLE_RATE), np.float32)
        parts += [clip, gap]
        spans.append((at, at + len(clip) / SAMPLE_RATE))
        at += (len(clip) + len(gap)) / SAMPLE_RATE
    audio = float_wav_bytes(np.concatenate(parts))
    result = executor.transcribe(audio, TranscribeOptions(sequential=sequential))
    assert result.language == "en"
    lost = [
        (r["file"], "quiet" if i % 2 else "loud")
        for i, (r, (start, end)) in enumerate(zip(rows, spans))
        if not _sentence_survives(r["reference_transcript"], result.segments, start, end)
    ]
    assert not lost


def _no_speech_matrix(seconds: float = 10.0) -> dict[str, np.ndarray]:
    """Digital silence, 1-LSB dither, and pink and white noise, mains hum and a tone at -20, -40 and -60 dBFS RMS."""
    n = int(seconds * SAMPLE_RATE)
    rng = np.random.default_rng(11)
    t = np.arange(n) / SAMPLE_RATE
    spectrum = np.fft.rfft(rng.normal(size=n)) / np.sqrt(np.arange(1, n // 2 + 2))  # 1/f power: pink
    kinds = {
        "pink": np.fft.irfft(spectrum, n),
        "white": rng.normal(size=n),
        "hum": np.sin(2 * np.pi * 50 * t) + 0.5 * np.sin(2 * np.pi * 100 * t) + 0.3 * np.sin(2 * np.pi * 150 * t),
        "tone": np.sin(2 * np.pi * 1000 * t),
    }
    out = {"silence": np.zeros(n), "dither": rng.integers(-1, 2, size=n) / 32767}
    for kind, signal in kinds.items():
        for db in (20, 40, 60):
            out[f"{kind}_minus{db}"] = signal / signal.std() * 10 ** (-db / 20)
    return out


@pytest.mark.parametrize("engine", [[], ["--sequential"]], ids=["batched", "sequential"])
def test_silence_noise_and_tones_give_no_text_at_any_level_and_say_so(tmp_path, engine):
    """Even with -q: one warning line each, with the peak level; the json says "speech": false."""
    folder = tmp_path / "in"
    folder.mkdir()
    matrix = _no_speech_matrix()
    for stem, samples in matrix.items():
        (folder / f"{stem}.wav").write_bytes(wav_bytes(samples))
    proc = run_ferrum("transcribe", str(folder), "-f", "json", "-f", "txt", "-o", str(tmp_path / "out"), "-q", *engine)
    assert proc.returncode == 0, proc.stderr
    warned = {m["name"]: m["peak"] for m in NO_SPEECH.finditer(proc.stderr)}
    assert {name.rsplit("/", 1)[-1] for name in warned} == {f"{stem}.wav" for stem in matrix}
    assert next(peak for name, peak in warned.items() if name.endswith("/silence.wav")) == "-inf"
    assert next(peak for name, peak in warned.items() if name.endswith("/dither.wav")) == "-90"
    for stem in matrix:
        doc = json.loads((tmp_path / "out" / f"{stem}.json").read_text())
        assert (doc["text"], doc["segments"], doc["speech"], doc["language"]) == ("", [], False, "und"), stem
        assert (tmp_path / "out" / f"{stem}.txt").read_text() == ""


def test_quiet_speech_on_stdin_and_in_language_detection(executor):
    quiet = decode_file(corpus(CLIPS["de"])).samples * 10 ** (-60 / 20)
    assert executor.detect_language(float_wav_bytes(quiet))[0] == "de"
    proc = run_ferrum("transcribe", "-", "-f", "json", stdin=float_wav_bytes(quiet))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["speech"] and doc["language"] == "de"
    assert errors_against(_reference(CLIPS["de"]), doc["text"], "de") <= 5
    silent = run_ferrum("transcribe", "-", "-q", stdin=wav_bytes(np.zeros(3 * SAMPLE_RATE)))
    assert silent.returncode == 0 and silent.stdout == ""
    assert silent.stderr.strip() == "warning: <stdin>: no speech found (peak -inf dBFS)"


def test_multilingual_mode_hears_quiet_speech(executor):
    samples = decode_file(corpus("en_de_mixed_faster_whisper_multilingual.mp3")).samples * 10 ** (-45 / 20)
    result = executor.transcribe(float_wav_bytes(samples), TranscribeOptions(multilingual=True))
    assert {s.language for s in result.segments} == {"en", "de"}


def test_audio_at_a_normal_level_is_read_as_recorded():
    """Only what lies under the normal level is raised: the corpus as recorded reaches the VAD and Whisper unchanged."""
    for row in corpus_rows():
        samples = decode_file(row["path"]).samples
        if frame_levels(samples).max() >= NORMAL_LEVEL:
            assert raised_spans(samples, [(0, len(samples))]) is samples, row["file"]
    tone = (0.5 * np.sin(2 * np.pi * 440 * np.arange(32 * 512) / SAMPLE_RATE)).astype(np.float32)  # whole frames
    assert raised_for_vad(tone) is tone
    quiet = tone * 1e-4
    assert frame_levels(raised_for_vad(quiet)).min() == pytest.approx(NORMAL_LEVEL, rel=0.01)
    assert frame_levels(raised_spans(quiet, [(0, len(quiet))])).max() == pytest.approx(NORMAL_LEVEL, rel=0.01)
    silence = np.zeros(SAMPLE_RATE, np.float32)
    assert not raised_for_vad(silence).any() and not raised_spans(silence, [(0, len(silence))]).any()
