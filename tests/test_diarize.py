"""Who spoke when (--diarize): speakers in every format, scored against the reference turns of
../shared/corpus/diarization with pyannote.metrics, and the edge cases a user meets."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from ferrum_cli.errors import UsageError
from ferrum_cli.options import TranscribeOptions
from ferrum_cli.post.diarizer import Turn
from ferrum_cli.post.speakers import assign_speakers
from ferrum_cli.results import Segment, Transcription, Word

from .helpers import (
    FERRUM,
    JFK,
    PACER,
    corpus,
    diarization_error_rate,
    run_ferrum,
    run_ferrum_on_a_terminal,
    wav_bytes,
)

TWO_SPEAKERS = "diarization/pyannote_sample.wav"


class Diarized(NamedTuple):
    out: Path  # every format's file
    screen: str  # what the terminal showed meanwhile


@pytest.fixture(scope="module")
def two_speakers(tmp_path_factory) -> Diarized:
    out = tmp_path_factory.mktemp("diarized")
    proc = run_ferrum_on_a_terminal("transcribe", str(corpus(TWO_SPEAKERS)), "--diarize", "-f", "all", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    return Diarized(out, proc.stderr)


def test_two_speakers_are_told_apart_as_the_reference_has_them(two_speakers):
    rttm = (two_speakers.out / "pyannote_sample.rttm").read_text()
    assert {line.split()[7] for line in rttm.splitlines()} == {"SPEAKER_00", "SPEAKER_01"}
    assert diarization_error_rate(rttm, "pyannote_sample") <= 0.2  # senko's own figure on it is 9.7%


def test_the_progress_says_when_it_is_telling_the_speakers_apart(two_speakers):
    """After the last window is decoded the bar would stand still for the diarizer's while (most
    of a minute on an hour): it says what is going on, and goes back when the file is done."""
    screen = two_speakers.screen
    told = screen.rindex("telling speakers apart")
    assert screen.index("transcribing") < told < screen.rindex("1/1")


def test_every_format_carries_the_speaker(two_speakers):
    import srt
    import webvtt

    doc = json.loads((two_speakers.out / "pyannote_sample.json").read_text())
    speakers = [s["speaker"] for s in doc["segments"]]
    assert speakers[0] == "SPEAKER_00" and set(speakers) == {"SPEAKER_00", "SPEAKER_01"}
    assert all("words" not in s for s in doc["segments"])  # timed for the speakers, not asked for
    assert doc["options"]["diarize"] is True and doc["options"]["word_timestamps"] is False
    cues = list(srt.parse((two_speakers.out / "pyannote_sample.srt").read_text()))
    assert [c.content.split("]")[0] + "]" for c in cues] == [f"[{s}]" for s in speakers]
    captions = webvtt.from_string((two_speakers.out / "pyannote_sample.vtt").read_text()).captions
    assert [c.voice for c in captions] == speakers
    rows = (two_speakers.out / "pyannote_sample.tsv").read_text().splitlines()
    assert rows[0] == "start\tend\tspeaker\ttext" and [r.split("\t")[2] for r in rows[1:]] == speakers
    lines = (two_speakers.out / "pyannote_sample.txt").read_text().splitlines()
    turns = [s for i, s in enumerate(speakers) if i == 0 or speakers[i - 1] != s]  # one line per turn
    assert [line.split("]")[0][1:] for line in lines] == turns
    jsonl = [json.loads(line) for line in (two_speakers.out / "pyannote_sample.jsonl").read_text().splitlines()]
    assert [s["speaker"] for s in jsonl] == speakers


def test_names_count_and_words_carry_the_speaker(tmp_path):
    proc = run_ferrum(
        "transcribe", str(corpus(TWO_SPEAKERS)), "--diarize", "--speakers", "2", "--speaker-names", "Ann, Bob",
        "--word-timestamps", "-f", "json", "-f", "vtt", "-o", str(tmp_path), "-q",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "pyannote_sample.json").read_text())
    assert [s["speaker"] for s in doc["segments"]][0] == "Ann"
    assert {s["speaker"] for s in doc["segments"]} == {"Ann", "Bob"}
    for segment in doc["segments"]:
        assert segment["words"] and all(w["speaker"] == segment["speaker"] for w in segment["words"])
        assert "".join(w["word"] for w in segment["words"]).strip() == segment["text"].strip()
    assert "<v Ann>" in (tmp_path / "pyannote_sample.vtt").read_text()


def test_a_count_is_reached_where_the_speech_allows_and_a_warning_says_where_it_does_not(executor):
    """--min-speakers is honoured: senko gives each cluster of under 4 subsegments to its nearest
    voice, but no more of them than leaves the count; more speakers than there are stretches of
    1.5 s to tell apart gives as many as there are, and a one-line warning, not a failed input."""
    from ferrum_cli.audio.ffmpeg import decode_file
    from ferrum_cli.options import TranscribeOptions
    from ferrum_cli.post.diarizer import SpeakerCount, diarize

    two = str(corpus(TWO_SPEAKERS))
    assert len({t.speaker for t in diarize(decode_file(two).samples, SpeakerCount(at_least=6)).turns}) >= 6
    too_many = executor.transcribe(two, TranscribeOptions(language="en", diarize=True, speakers=40))
    told = len({t.speaker for t in too_many.turns})
    assert 2 <= told < 40
    assert too_many.warnings == [f"{told} speakers told apart where 40 were asked for: too little speech"]


def test_the_diarizer_reads_where_speech_is_from_the_engines_vad_pass(executor, monkeypatch):
    """Silero reads an input once: the engine hands its frame probabilities on, and the diarizer
    reads them with its own thresholds, finding the speech its own pass would find. Where the
    engine ran no VAD, the diarizer runs it itself."""
    from ferrum_cli.audio.ffmpeg import decode_file
    from ferrum_cli.post import diarizer

    handed, own_passes = [], []
    diarize, blockwise = diarizer.diarize, diarizer.speech_regions_blockwise
    monkeypatch.setattr(diarizer, "diarize", lambda *args: handed.append(args[3]) or diarize(*args))
    monkeypatch.setattr(diarizer, "speech_regions_blockwise", lambda *a: own_passes.append(1) or blockwise(*a))
    two = corpus(TWO_SPEAKERS)
    labelled = executor.transcribe(str(two), TranscribeOptions(language="en", diarize=True))
    assert own_passes == [] and len({t.speaker for t in labelled.turns}) == 2
    samples = decode_file(two).samples
    assert diarizer.speech_seconds(samples, handed[0]) == diarizer.speech_seconds(samples)

    own_passes.clear()
    unheard = executor.transcribe(str(two), TranscribeOptions(language="en", diarize=True, vad=False))
    assert handed[1] is None and own_passes == [1] and len({t.speaker for t in unheard.turns}) == 2


def test_one_speaker_from_stdin_gets_one_label():
    proc = run_ferrum("transcribe", "-", "--diarize", "-f", "txt", "-q", stdin=corpus(JFK).read_bytes())
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("[SPEAKER_00] ") and "country" in lines[0], proc.stdout


def test_silence_gives_no_labels_and_too_little_speech_one_speaker_and_a_warning(tmp_path):
    silence = tmp_path / "silence.wav"
    silence.write_bytes(wav_bytes(np.zeros(5 * 16000, np.float32)))
    proc = run_ferrum("transcribe", str(silence), "--diarize", "-f", "json", "-f", "rttm", "-o", str(tmp_path), "-q")
    assert proc.returncode == 0, proc.stderr
    assert "no speech found" in proc.stderr
    assert (tmp_path / "silence.rttm").read_text() == ""
    assert json.loads((tmp_path / "silence.json").read_text())["segments"] == []

    from ferrum_cli.audio.ffmpeg import decode_file

    short = tmp_path / "short.wav"
    short.write_bytes(wav_bytes(decode_file(corpus(JFK)).samples[: int(3.2 * 16000)]))
    proc = run_ferrum("transcribe", str(short), "--diarize", "-f", "txt")  # not -q: it keeps warnings back
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("[SPEAKER_00] ") and proc.stdout.count("\n") == 1  # transcribed, one speaker
    warning = [line for line in proc.stderr.splitlines() if "speakers apart" in line]
    assert len(warning) == 1, proc.stderr


def test_live_speakers_are_labelled_as_they_are_heard_and_keep_their_labels(two_speakers, tmp_path):
    """--live --diarize on pyannote's sample twice (from 6 s, where its speech starts), 8 s apart,
    at three times real time: the first copy's lines come with their speakers while the second is
    still streaming (before the pacer has written it all), the second copy's voices are the
    first's speakers again, the final turns (rttm) say what the lines said, and each copy scores
    at most 25% DER (20% from the whole recording, test above). After two_speakers, whose run
    compiled the diarizer's numba code."""
    from ferrum_cli.audio.ffmpeg import decode_file

    cut, gap, speed = 6.0, 8.0, 3
    sample = decode_file(corpus(TWO_SPEAKERS)).samples[int(cut * 16000) :]
    wav = tmp_path / "twice.wav"
    wav.write_bytes(wav_bytes(np.concatenate([sample, np.zeros(int(gap * 16000), np.float32), sample])))
    pacer = subprocess.Popen([sys.executable, "-c", PACER, str(wav), str(speed)], stdout=subprocess.PIPE)
    ferrum = subprocess.Popen(
        [FERRUM, "transcribe", "-", "--live", "--diarize", "--language", "en", "-f", "jsonl", "-f", "rttm", "-q"],
        stdin=pacer.stdout, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    pacer.stdout.close()
    start = time.monotonic()
    written: list[float] = []  # when the pacer had written the whole file (later where ferrum read slowly)
    waiter = threading.Thread(target=lambda: (pacer.wait(), written.append(time.monotonic() - start)), daemon=True)
    waiter.start()
    out = [(time.monotonic() - start, line) for line in ferrum.stdout]
    waiter.join(10)
    assert pacer.wait(10) == 0 and ferrum.wait(60) == 0, ferrum.stderr.read()
    lines = [(at, json.loads(line)) for at, line in out if line.startswith("{")]
    turns = [line.split() for _, line in out if line.startswith("SPEAKER ")]
    turns = [(float(f[3]), float(f[3]) + float(f[4]), f[7]) for f in turns]
    copy = len(sample) / 16000  # the second copy starts at copy + gap
    first = [(at, line["speaker"]) for at, line in lines if line["end"] <= copy + gap / 2]
    second = [(at, line["speaker"]) for at, line in lines if line["start"] > copy + gap / 2]
    assert first and second and all(speaker for _, speaker in first + second)
    assert {speaker for _, speaker in second} <= {speaker for _, speaker in first}  # heard before: the same labels
    assert len({speaker for _, speaker in first}) >= 2
    assert max(at for at, _ in first) < written[0]  # before the pacer had written it all
    for _, line in lines:  # each line's speaker is the final turns' over most of it: no label changed
        overlap: dict[str, float] = {}
        for a, b, who in turns:
            overlap[who] = overlap.get(who, 0.0) + max(0.0, min(b, line["end"]) - max(a, line["start"]))
        if max(overlap.values()) > 0:
            assert max(overlap, key=overlap.get) == line["speaker"], (line, turns)
    for shift in (0.0, copy + gap):
        rttm = "".join(
            f"SPEAKER pyannote_sample 1 {a - shift + cut:.3f} {b - a:.3f} <NA> <NA> {who} <NA> <NA>\n"
            for a, b, who in turns
            if shift <= a < shift + copy
        )
        assert diarization_error_rate(rttm, "pyannote_sample") <= 0.25, (shift, rttm)


def test_what_diarization_cannot_do_is_a_usage_error():
    for args, says in (
        (["-", "--live", "--diarize", "--min-speakers", "2"], "does not run with --live"),
        ([str(corpus(JFK)), "-f", "rttm"], "needs --diarize"),
        ([str(corpus(JFK)), "--speakers", "2", "--speaker-names", "A,B"], "--speakers, --speaker-names need --diarize"),
        ([str(corpus(JFK)), "--diarize", "--min-speakers", "3", "--max-speakers", "2"], "--min-speakers (3) is above"),
        ([str(corpus(JFK)), "--diarize", "--speakers", "2", "--max-speakers", "3"], "give --speakers, or --min-"),
    ):
        proc = run_ferrum("transcribe", *args)
        assert proc.returncode == 2 and says in proc.stderr and proc.stderr.count("\n") == 1, (args, proc.stderr)


def test_a_library_caller_reads_the_fields_it_set_where_options_disagree():
    with pytest.raises(UsageError, match=r"^speakers needs diarize$"):
        TranscribeOptions(speakers=2).check()
    with pytest.raises(UsageError, match=r"^min_speakers \(3\) is above max_speakers \(2\)$"):
        TranscribeOptions(diarize=True, min_speakers=3, max_speakers=2).check()


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1) to cut the network")
def test_diarization_runs_with_no_network(tmp_path):
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"unshare -n is not allowed here: {probe.stderr.decode().strip()}")
    cmd = ["unshare", "-n", FERRUM, "transcribe", str(corpus(TWO_SPEAKERS)), "--diarize", "-f", "rttm", "-q"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert {line.split()[7] for line in proc.stdout.splitlines()} == {"SPEAKER_00", "SPEAKER_01"}


def test_a_programs_own_output_goes_on_while_ferrum_tells_speakers_apart():
    """senko's clustering pointed sys.stdout and sys.stderr at /dev/null, for every thread of the
    process, while it ran: what a library caller's other threads printed meanwhile was lost (59
    lines of 15,821 over a minute of speech, 47 of 4,207 over this sample), and a write that met
    the closing could fail."""
    script = f"""
import sys, threading, time
import numpy as np
from ferrum_cli import TranscribeOptions, WhisperModelExecutor
from ferrum_cli.audio.ffmpeg import decode_file

executor = WhisperModelExecutor.from_path("tiny.en")
meeting = decode_file({str(corpus(TWO_SPEAKERS))!r}).samples
done, printed, failures = threading.Event(), [0], []

def chatter():
    while not done.is_set():
        try:
            print("out", printed[0], flush=True)
            sys.stderr.write("err\\n")
            printed[0] += 1
        except Exception as exc:
            failures.append(repr(exc))
        time.sleep(0.0005)

thread = threading.Thread(target=chatter)
thread.start()
result = executor.transcribe(meeting, TranscribeOptions(language="en", diarize=True))
done.set()
thread.join()
speakers = len({{s.speaker for s in result.segments}})
sys.__stderr__.write(f"printed {{printed[0]}} speakers {{speakers}} {{failures[:1]}}\\n")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = proc.stderr.splitlines()[-1].split()
    assert summary[:1] == ["printed"] and summary[3] == "2" and summary[4:] == ["[]"], proc.stderr[-2000:]
    printed = int(summary[1])
    assert printed > 1000  # the chatter ran throughout, clustering included
    lines = proc.stdout.splitlines()
    assert lines == [f"out {i}" for i in range(printed)], f"{printed - len(lines)} lines of stdout lost"
    assert proc.stderr.splitlines().count("err") == printed


def _segment(text_words: list[tuple[str, float, float, tuple[int, ...]]], tokens: list[int]) -> Segment:
    words = [Word(w, a, b, 0.9, tokens=t) for w, a, b, t in text_words]
    text = "".join(w for w, *_ in text_words)
    return Segment(0, text_words[0][1], text_words[-1][2], text, tokens, -0.2, 0.01, 1.2, 0.0, words)


def test_a_segment_is_split_at_the_word_where_the_speaker_changes():
    first = _segment([(" Hello", 0.0, 0.5, (1,)), (" there.", 0.5, 1.0, (2, 3)), (" Hi", 1.2, 1.5, (4,))], [1, 2, 3, 4])
    second = _segment([(" Bob", 1.6, 2.0, (5,))], [5])
    result = Transcription(" Hello there. Hi Bob", [first, second], "en", 1.0, 2.0)
    turns = [Turn(0.0, 1.1, 7), Turn(1.1, 2.0, 3), Turn(2.5, 3.0, 5)]  # the diarizer's numbers, in no order
    out = assign_speakers(result, turns)
    assert [(s.id, s.text, s.tokens, s.speaker) for s in out.segments] == [
        (0, " Hello there.", [1, 2, 3], "SPEAKER_00"),
        (1, " Hi", [4], "SPEAKER_01"),
        (2, " Bob", [5], "SPEAKER_01"),
    ]
    assert (out.segments[0].start, out.segments[0].end, out.segments[1].start) == (0.0, 1.0, 1.2)
    assert [w.speaker for s in out.segments for w in s.words] == ["SPEAKER_00"] * 2 + ["SPEAKER_01"] * 2
    assert [t.speaker for t in out.turns] == ["SPEAKER_00", "SPEAKER_01", "SPEAKER_02"]  # heard, no text: last
    assert out.text == result.text


def test_every_subtitle_cue_carries_its_speaker_and_any_text_as_it_is():
    """Whisper writes '&', '<' and '>' ("AT&T", "<3", "-->"), and a speaker may be named so: in a
    WebVTT cue they would be markup, and a reader would drop or cut the text. They are escaped.
    Each cue opens with its speaker, also where the line options cut a segment into several cues
    and where the first word is underlined."""
    import html

    import srt
    import webvtt

    from ferrum_cli.writers import WRITERS, SubtitleLayout

    ann = [(" AT&T", 0.0, 0.5, (1,)), (" <3", 0.5, 1.0, (2,)), (" -->", 1.0, 1.5, (3,)), (" a>b", 1.5, 2.0, (4,))]
    bob = [(" Yes", 2.5, 3.0, (5,)), (" no", 3.0, 3.5, (6,)), (" maybe", 3.5, 4.0, (7,))]
    segments = []
    for number, (speaker, text_words) in enumerate((("Ann & <Bob>", ann), ("Carl", bob))):
        segment = replace(_segment(text_words, [t for *_, ts in text_words for t in ts]), id=number, speaker=speaker)
        segments.append(replace(segment, words=[replace(w, speaker=speaker) for w in segment.words]))
    result = Transcription("".join(s.text for s in segments), segments, "en", 1.0, 4.0)
    layouts = (SubtitleLayout(), SubtitleLayout(highlight_words=True), SubtitleLayout(max_words_per_line=2))
    for layout in layouts:
        vtt = WRITERS["vtt"].write(result, layout)
        captions = webvtt.from_string(vtt).captions
        voices = [html.unescape(c.voice or "") for c in captions]
        assert voices == ["Ann & <Bob>"] * voices.count("Ann & <Bob>") + ["Carl"] * voices.count("Carl"), layout
        texts = [html.unescape(c.text) for c in captions]
        if layout.highlight_words:
            assert texts[0] == "AT&T <3 --> a>b" and "\n<v Ann &amp; &lt;Bob&gt;><u>AT&amp;T</u>" in vtt
        else:
            assert " ".join(texts) == "AT&T <3 --> a>b Yes no maybe", layout
        cues = list(srt.parse(WRITERS["srt"].write(result, layout)))
        assert all(c.content.startswith(("[Ann & <Bob>] ", "[Carl] ")) for c in cues), (layout, cues)
        assert "<u>[" not in "".join(c.content for c in cues)


def test_the_servers_letters_go_on_past_z():
    """OpenAI labels the speakers it does not know A, B, ...; a recording with more than 26 goes on
    AA, AB, ... rather than fall back to SPEAKER_26."""
    from ferrum_cli.server.openai_format import SPEAKER_LETTERS

    turns = [Turn(float(i), i + 0.9, i) for i in range(28)]
    result = Transcription("", [], "en", 1.0, 28.0)
    labels = [t.speaker for t in assign_speakers(result, turns, SPEAKER_LETTERS).turns]
    assert labels[:2] == ["A", "B"] and labels[25:] == ["Z", "AA", "AB"]
    assert len(set(SPEAKER_LETTERS)) == len(SPEAKER_LETTERS) == 26 * 27


def test_words_the_diarizer_did_not_hear_are_in_their_speakers_turns():
    """Where Whisper timed words the diarizer's VAD heard no speech in: each word's speaker (the
    turn nearest it, or the one over most of it) gets the uncovered part in its turns (rttm);
    a "word" with no letter or digit in it is not taken for speech."""
    words = [(" Yes", 0.2, 0.6, (1,)), (" we", 1.3, 1.5, (2,)), (" can.", 1.5, 2.4, (3, 4)), (" ♪", 3.2, 4.0, (5,))]
    segment = _segment(words, [1, 2, 3, 4, 5])
    result = Transcription(" Yes we can. ♪", [segment], "en", 1.0, 4.0)
    out = assign_speakers(result, [Turn(0.0, 1.0, 4), Turn(2.0, 3.0, 9)])
    assert [w.speaker for s in out.segments for w in s.words] == ["SPEAKER_00"] * 2 + ["SPEAKER_01"] * 2
    assert [(t.start, t.end, t.speaker) for t in out.turns] == [
        (0.0, 1.0, "SPEAKER_00"),
        (1.3, 1.5, "SPEAKER_00"),  # nearer the first turn than the second
        (1.5, 3.0, "SPEAKER_01"),  # " can." is mostly in the second turn: its start joins it
    ]  # a music note is not speech: no turn of its own


def test_cam_plus_plus_with_its_batch_norms_folded_gives_the_voices_it_gave():
    """A batch norm folded into the convolution before it is the same arithmetic, rounded once
    more: real speech's voices come out as senko's own model gives them, in float32."""
    import copy

    import torch
    from senko import config
    from senko.camplusplus import CAMPPlus
    from whisper.audio import log_mel_spectrogram

    from ferrum_cli.audio.ffmpeg import decode_file
    from ferrum_cli.platform.cpu import on_own_thread
    from ferrum_cli.post.diarizer import _batch_norms_folded

    def norms(model) -> int:
        return sum(isinstance(m, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)) for m in model.modules())

    def voices():
        paths = config.resolve_model_paths(None, required_fields=list(config.EMBEDDINGS_MODEL_FIELDS))
        model = CAMPPlus(feat_dim=80, embedding_size=192)
        model.load_state_dict(torch.load(str(paths.embeddings_pt_model_path), weights_only=True))
        model.eval()
        folded = _batch_norms_folded(copy.deepcopy(model))
        features = log_mel_spectrogram(torch.from_numpy(decode_file(corpus(TWO_SPEAKERS)).samples)).T  # [frames, 80]
        batch = torch.stack([features[at : at + 150] for at in range(0, 2400, 300)])  # 1.5 s every 3 s
        with torch.no_grad():
            return norms(model), norms(folded), model(batch), folded(batch)

    norms_before, norms_after, theirs, ours = on_own_thread(voices)
    assert norms_after < norms_before / 2  # those after a convolution: the front end's, each TDNN's
    assert torch.nn.functional.cosine_similarity(theirs, ours).min() > 0.99999
    assert torch.allclose(theirs, ours, atol=1e-3 * theirs.abs().max().item())


def test_what_density_clustering_leaves_as_noise_goes_to_the_speaker_it_sounds_like():
    """Past 20 minutes senko clusters by density, and HDBSCAN labels the subsegments it cannot
    place -1; senko kept those as one more speaker, a mixture of every voice. Each goes to the
    speaker whose mean voice is most like its own (real voices: 2 s pieces of two speakers)."""
    from ferrum_cli.audio.ffmpeg import decode_file
    from ferrum_cli.post.diarizer import _diarizer, noise_to_nearest_speaker, voice_of

    def pieces(name: str) -> list[np.ndarray]:
        samples = decode_file(corpus(name)).samples
        return [samples[at : at + 32000] for at in range(0, len(samples) - 32000, 16000)]

    first, second = pieces(JFK), pieces("en_ljspeech_LJ001-0001.flac") + pieces("en_ljspeech_LJ001-0007.wav")
    voices = np.stack([voice_of(piece) for piece in first + second])
    speakers = np.array([3] * len(first) + [7] * len(second))
    labels = speakers.copy()
    labels[::3] = -1  # a third of each speaker's pieces left as noise
    assert noise_to_nearest_speaker(labels, voices).tolist() == speakers.tolist()
    assert noise_to_nearest_speaker(np.full(len(voices), -1), voices).tolist() == [0] * len(voices)  # all noise: one
    assert _diarizer("cpu").umap_hdbscan_cluster.cluster.__qualname__.startswith("_with_noise_assigned")


@pytest.fixture(scope="module")
def meeting_voices() -> np.ndarray:
    """The CAM++ voices [n, 192] the diarizer clusters on 3 minutes of six AMI meetings."""
    from ferrum_cli.audio.ffmpeg import decode_file
    from ferrum_cli.post import diarizer

    meetings = ["ami_trn00", "ami_trn01", "ami_trn03", "ami_dev00", "ami_dev01", "ami_tst00"]
    audio = np.concatenate([decode_file(corpus(f"diarization/{name}.wav")).samples for name in meetings])
    loaded = diarizer._diarizer("cpu")
    ours, seen = loaded.spectral_cluster.cluster, []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loaded.spectral_cluster, "cluster", lambda voices: ours(seen.append(voices) or voices))
        diarizer.diarize(audio)  # under 20 minutes, no count: clustered spectrally
    (voices,) = seen
    return voices


def test_spectral_clustering_kept_sparse_finds_the_speakers_senkos_dense_one_finds(meeting_voices, monkeypatch):
    """With a speaker count senko clusters spectrally at any length, on dense N x N matrices:
    past SPARSE_SPECTRAL_FROM subsegments (15 minutes of continuous speech) the pruned affinity is
    kept sparse instead, in linear memory. On the voices of 3 minutes of six AMI meetings, with
    the threshold at 0, it finds the speakers senko's dense computation finds: as many as asked
    for, or as many as the largest gap among the Laplacian's smallest eigenvalues says."""
    from sklearn.metrics import adjusted_rand_score

    from ferrum_cli.post import diarizer

    voices = meeting_voices
    loaded = diarizer._diarizer("cpu")
    ours = loaded.spectral_cluster.cluster
    senkos = type(ours).__mro__[1].__call__  # senko's SpectralCluster, dense throughout
    monkeypatch.setattr(diarizer, "SPARSE_SPECTRAL_FROM", 0)
    for count in [diarizer.SpeakerCount(exactly=k) for k in (2, 3, 5)] + [diarizer.SpeakerCount(at_most=8)]:
        with diarizer._counted(loaded, count):
            sparse_labels, dense_labels = ours(voices), senkos(ours, voices)
        assert adjusted_rand_score(dense_labels, sparse_labels) == 1.0
        assert len(set(sparse_labels)) == (count.exactly or len(set(dense_labels)))


def test_density_clustering_is_given_each_voices_exact_neighbours(meeting_voices, monkeypatch):
    """Past 20 minutes senko clusters by density, and UMAP found each voice's 40 nearest itself:
    under 4,096 voices through scikit-learn with a Python call per pair, above approximately with
    pynndescent, compiled anew in each process. They are found exactly by matrix products (the
    same as scikit-learn's brute-force search) and handed to UMAP, which then searches for none."""
    import umap
    from sklearn.neighbors import NearestNeighbors

    from ferrum_cli.post import diarizer

    indices, distances = diarizer.cosine_neighbours(meeting_voices, 40)
    search = NearestNeighbors(n_neighbors=40, metric="cosine", algorithm="brute").fit(meeting_voices)
    their_distances, their_indices = search.kneighbors(meeting_voices)
    assert np.allclose(distances, their_distances, atol=1e-5)
    assert (indices == their_indices).mean() > 0.99  # the rest: ties to the last decimal, in another order

    def searched(*_, **__):
        raise AssertionError("UMAP searched for neighbours itself")

    fitting = umap.UMAP.fit.__globals__  # the names UMAP's fit reads (umap is imported on first use)
    monkeypatch.setitem(fitting, "pairwise_distances", searched)
    monkeypatch.setitem(fitting, "nearest_neighbors", searched)
    labels = diarizer._diarizer("cpu").umap_hdbscan_cluster.cluster(meeting_voices)
    assert len(labels) == len(meeting_voices) and labels.min() >= 0 and len(set(labels)) >= 2


def test_samples_past_full_scale_are_diarized():
    """ffmpeg gives float samples past ±1 for a clipped source; senko's own checks refused them."""
    from ferrum_cli.audio.ffmpeg import decode_file
    from ferrum_cli.post.diarizer import diarize

    loud = decode_file(corpus(JFK)).samples * 4
    assert np.abs(loud).max() > 1
    assert diarize(loud).turns


def test_known_speakers_samples_name_their_voices(tmp_path):
    """--speaker-sample NAME=FILE: a voice like a sample's takes its name; a wrong flag is one line."""
    from ferrum_cli.audio.ffmpeg import decode_file

    two = corpus(TWO_SPEAKERS)
    audio = decode_file(two).samples
    for name, start, end in (("Carol", 22.0, 27.5), ("Dora", 18.6, 21.5)):  # each alone, from the reference turns
        (tmp_path / f"{name}.wav").write_bytes(wav_bytes(audio[int(start * 16000) : int(end * 16000)]))
    # Dora's as zsh leaves NAME=~/file, unexpanded
    samples = ["--speaker-sample", f"Carol={tmp_path / 'Carol.wav'}", "--speaker-sample", "Dora=~/Dora.wav"]
    home = {"HOME": str(tmp_path)}
    proc = run_ferrum("transcribe", str(two), "--diarize", *samples, "-f", "json", "-o", str(tmp_path), "-q", env=home)
    assert proc.returncode == 0, proc.stderr
    speakers = [s["speaker"] for s in json.loads((tmp_path / "pyannote_sample.json").read_text())["segments"]]
    assert speakers[0] == "Carol" and set(speakers) == {"Carol", "Dora"}, speakers
    for args, says in (
        (["--diarize", "--speaker-sample", "Carol"], "takes NAME=FILE"),
        (["--diarize", "--speaker-sample", f"Carol={tmp_path / 'none.wav'}"], "cannot read the sample of 'Carol'"),
        (["--speaker-sample", f"Carol={tmp_path / 'Carol.wav'}"], "--speaker-sample needs --diarize"),
    ):
        proc = run_ferrum("transcribe", str(two), *args)
        assert proc.returncode == 2 and says in proc.stderr and proc.stderr.count("\n") == 1, (args, proc.stderr)


def test_live_voices_match_those_heard_before_but_a_stretchs_own_voices_stay_apart():
    """LiveSpeakers' matching on CAM++-sized voices: alike at 0.75 or more is the same speaker,
    except two voices the diarizer told apart in one stretch; a known voice keeps its name; past
    the count a new voice goes to the most alike."""
    from ferrum_cli.post.diarizer import SpeakerCount
    from ferrum_cli.post.live_speakers import LiveSpeakers

    rng = np.random.default_rng(0)
    ann, a, b = (rng.standard_normal(192) for _ in range(3))

    def near(voice, similarity):  # a voice at this cosine similarity to `voice`
        other = rng.standard_normal(192)
        other -= other @ voice / (voice @ voice) * voice
        return similarity * voice / np.linalg.norm(voice) + np.sqrt(1 - similarity**2) * other / np.linalg.norm(other)

    live = LiveSpeakers(SpeakerCount(), known={"Ann": ann})
    first = live._match({0: a, 1: near(a, 0.8)}, {0: 5.0, 1: 5.0})  # alike, but told apart in the stretch
    assert first == {0: 1, 1: 2} and [v.label for v in live.voices] == ["Ann", "SPEAKER_00", "SPEAKER_01"]
    assert live._match({0: near(a, 0.9)}, {0: 3.0}) == {0: 1}  # heard before
    assert live._match({0: near(ann, 0.85)}, {0: 3.0}) == {0: 0}  # the known speaker
    assert live._match({0: b}, {0: 3.0}) == {0: 3} and live.voices[3].label == "SPEAKER_02"
    capped = LiveSpeakers(SpeakerCount(at_most=1))
    assert capped._match({0: a}, {0: 2.0}) == {0: 0}
    assert capped._match({0: b, 1: near(a, 0.5)}, {0: 2.0, 1: 2.0}) == {0: 0, 1: 0} and len(capped.voices) == 1
