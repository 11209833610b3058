"""Live input: text while the speaker talks, from a pipe, a URL, or a capture device (ffmpeg's
lavfi source standing in for a microphone: these machines have no sound card)."""

from __future__ import annotations

import functools
import http.server
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from .helpers import (
    FERRUM,
    JFK,
    PACER,
    SAMPLE,
    as_from_a_terminal,
    clip_text,
    corpus,
    errors_against,
    free_port,
    joined_clips,
    needs_corpus,
    run_ferrum,
    wav_bytes,
    words,
)

CLIPS = [JFK, "en_harvard_speechbrain_example1.wav", "en_librispeech_61-70968-0000.flac", "en_ljspeech_LJ001-0001.flac"]
GAP_SECONDS = 2.0


def decoded(path: Path) -> np.ndarray:
    from ferrum_cli.audio.ffmpeg import decode_file

    return decode_file(path).samples


@pytest.fixture(scope="module")
def joined(tmp_path_factory) -> tuple[Path, list[tuple[float, float]]]:
    """The clips one after another with pauses between them, as 16-bit WAV: (file, each clip's span)."""
    samples, spans = joined_clips(CLIPS, GAP_SECONDS)
    path = tmp_path_factory.mktemp("live") / "joined.wav"
    path.write_bytes(wav_bytes(samples))
    return path, spans


def paced(
    path: Path, speed: float, *args: str, by_name: bool = False
) -> tuple[list[tuple[float, dict]], float, subprocess.Popen]:
    """`ferrum transcribe - --live -f jsonl` fed at `speed` times real time: each line with the
    second it arrived, and the second the pacer wrote its last byte. by_name: the pipe is given
    as /dev/fd/N, as the shell's <(...) gives it, rather than on stdin."""
    pacer = subprocess.Popen([sys.executable, "-c", PACER, str(path), str(speed)], stdout=subprocess.PIPE)
    pipe = pacer.stdout.fileno()
    ferrum = subprocess.Popen(
        [FERRUM, "transcribe", f"/dev/fd/{pipe}" if by_name else "-", "--live", "-f", "jsonl", "-q", *args],
        stdin=subprocess.DEVNULL if by_name else pacer.stdout, pass_fds=(pipe,) if by_name else (),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    pacer.stdout.close()
    start = time.monotonic()
    lines = [(time.monotonic() - start, json.loads(line)) for line in ferrum.stdout]
    pacer.wait(10)
    ferrum.wait(60)
    return lines, start, ferrum


@needs_corpus
def test_live_lines_come_while_the_speaker_talks_and_read_as_offline(joined):
    path, spans = joined
    offline = json.loads(run_ferrum("transcribe", str(path), "-f", "json", "-q").stdout)["segments"]
    pacer_started = time.monotonic()
    lines, start, ferrum = paced(path, 2.0)
    pacer_seconds = spans[-1][1] / 2.0  # the stream's speech is over by then, at twice real time
    assert ferrum.returncode == 0, ferrum.stderr.read()
    assert start - pacer_started < 1.0

    for span in spans:  # every sentence comes out, as the offline run reads it
        heard = clip_text([line for _, line in lines], span)
        assert heard, span
        assert errors_against(clip_text(offline, span), heard, "en") <= 1, (heard, clip_text(offline, span))
    for arrived, line in lines:  # all but the last stretch are out before the stream is
        if line["end"] < spans[-1][0]:
            assert arrived < pacer_seconds, (arrived, line)
    starts = [line["start"] for _, line in lines]
    assert starts == sorted(starts) and starts[0] < 1.0  # timestamps from the start of the stream


@needs_corpus
@pytest.mark.skipif(not Path("/dev/fd").is_dir(), reason="names pipes as /dev/fd/N, as Linux and macOS do")
def test_a_pipe_given_by_name_is_live_too(joined):
    """`ferrum transcribe --live <(arecord ...)`, or a FIFO: text while it is written, as from stdin."""
    path, spans = joined
    lines, start, ferrum = paced(path, 2.0, "--language", "en", by_name=True)
    assert ferrum.returncode == 0, ferrum.stderr.read()
    assert all(clip_text([line for _, line in lines], span) for span in spans)
    early = [arrived for arrived, line in lines if line["end"] < spans[-1][0]]
    assert early and max(early) < spans[-1][1] / 2.0  # out before the pacer is done


@needs_corpus
def test_ctrl_c_keeps_every_segment_printed_in_whole_files(joined, tmp_path):
    path, _ = joined
    out = tmp_path / "out"
    pacer = subprocess.Popen([sys.executable, "-c", PACER, str(path), "2"], stdout=subprocess.PIPE)
    ferrum = subprocess.Popen(
        [FERRUM, "transcribe", "-", "--live", "-o", str(out), "-f", "txt", "-f", "json", "--stdin-name", "talk"],
        stdin=pacer.stdout, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=as_from_a_terminal,
    )  # fmt: skip
    pacer.stdout.close()
    deadline = time.monotonic() + 60
    while not (out / "talk.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (out / "talk.txt").exists(), "no segment written while the stream went on"
    ferrum.send_signal(signal.SIGINT)
    assert ferrum.wait(60) == 130
    pacer.kill()
    doc = json.loads((out / "talk.json").read_text())
    lines = (out / "talk.txt").read_text().splitlines()
    assert doc["segments"] and [s["text"].strip() for s in doc["segments"]] == lines
    assert not list(out.glob(".*.tmp"))  # no half-written file left behind


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def http_corpus():
    """The corpus folder over HTTP on a loopback port, for as long as the test runs."""
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(corpus(JFK).parent))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_url_transcribes_like_the_file(http_corpus, tmp_path):
    url = f"{http_corpus}/{JFK}?download=1"
    proc = run_ferrum("transcribe", url, "-f", "json", "-o", str(tmp_path), "-q")
    assert proc.returncode == 0, proc.stderr
    from_file = json.loads(run_ferrum("transcribe", str(corpus(JFK)), "-f", "json", "-q").stdout)
    assert json.loads((tmp_path / "en_jfk_inaugural_1961.json").read_text())["text"] == from_file["text"]


def test_an_unreachable_or_wrong_url_is_one_error_line(http_corpus):
    dead = free_port()
    for url in (f"http://127.0.0.1:{dead}/talk.mp3", f"{http_corpus}/manifest.tsv", f"{http_corpus}/missing.mp3"):
        proc = run_ferrum("transcribe", url, "-q", timeout=60)
        assert proc.returncode == 1, (url, proc.stderr)
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"error: {url}: "), proc.stderr


def test_the_microphone_path_with_lavfi_standing_in_for_the_device(tmp_path):
    tone = run_ferrum("transcribe", "--mic", "lavfi:sine=frequency=1000:duration=5", "-q", timeout=60)
    assert tone.returncode == 0 and tone.stdout == ""
    assert "no speech found" in tone.stderr
    speech = run_ferrum("transcribe", "--mic", f"lavfi:amovie={SAMPLE}", "-f", "jsonl", "-q", timeout=60)
    assert speech.returncode == 0, speech.stderr
    assert "Dashwood" in " ".join(json.loads(line)["text"] for line in speech.stdout.splitlines())


def test_a_microphone_that_does_not_open_is_one_line_that_says_where_they_are_listed():
    proc = run_ferrum("transcribe", "--mic", "alsa:no-such-card", "-q", timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: <mic alsa:no-such-card>: "), proc.stderr
    assert "`ferrum status` lists the microphones ffmpeg sees here" in proc.stderr


def test_live_refuses_files_and_what_it_cannot_do():
    for args, says in (
        ([str(SAMPLE), "--live"], "not a file"),
        (["-", "--live", "--no-vad"], "needs the VAD"),
        (["-", "--live", "--sequential"], "batched engine"),
    ):
        proc = run_ferrum("transcribe", *args)
        assert proc.returncode == 2 and says in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


@needs_corpus
def test_live_takes_beam_search():
    """Beam search runs in the batched engine, which --live runs in; it was refused."""
    proc = run_ferrum("transcribe", "-", "--live", "--beam-size", "3", "-m", "tiny.en", stdin=corpus(JFK).read_bytes())
    assert proc.returncode == 0, proc.stderr
    assert "ask not what your country can do for you" in words(proc.stdout)


def test_live_stdin_with_nothing_or_no_audio_on_it_says_so():
    """ffmpeg, reading the pipe itself, says the same of both: "Error opening input files:
    Invalid data found when processing input" was all the user read."""
    for stdin in (b"", b"hello"):
        proc = run_ferrum("transcribe", "-", "--live", "-m", "tiny.en", "-q", stdin=stdin)
        assert proc.returncode == 1
        assert proc.stderr == (
            "error: <stdin>: not audio or video that ffmpeg reads, or nothing came"
            " (Invalid data found when processing input)\n"
        )


def rss_over_time(cmd: list[str], stdin: Path) -> list[int]:
    """The resident memory (KiB) of a process, read from /proc twice a second until it exits."""
    samples = []
    with stdin.open("rb") as audio:
        proc = subprocess.Popen(cmd, stdin=audio, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        while proc.poll() is None:
            try:
                status = Path(f"/proc/{proc.pid}/status").read_text()
                samples += [int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS")]
            except (FileNotFoundError, ProcessLookupError):
                break
            time.sleep(0.5)
        assert proc.wait() == 0, proc.stderr.read()
    return samples


@needs_corpus
@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads memory from Linux's /proc")
def test_memory_stays_flat_on_two_hours_of_live_audio(tmp_path):
    """Two hours fed as fast as they go (a 2 s sentence every two minutes): what the process holds
    late in the stream is what it held early on.

    Medians, not peaks: each batch of windows raises the memory for a moment, by as much as
    100 MB here. The allocator settles over the first hour or so, by up to about 40 MB, so an
    hour is too short to tell that from a leak; keeping the stream's audio even as 16-bit
    samples shows as about 125 MB between the two stretches compared, when tried."""
    unit = np.zeros(120 * 16000, np.float32)
    sentence = decoded(corpus("en_librispeech_2830-3980-0043.wav"))
    unit[: len(sentence)] = sentence
    path = tmp_path / "two_hours.wav"
    path.write_bytes(wav_bytes(np.tile(unit, 60)))
    cmd = [FERRUM, "transcribe", "-", "--live", "-m", "tiny.en", "-f", "jsonl", "-q", "--batch-size", "4"]
    rss = rss_over_time(cmd, path)
    n = len(rss)
    early, late = np.median(rss[n // 5 : 2 * n // 5]), np.median(rss[3 * n // 5 :])
    assert late - early <= 60 * 1024, (early, late)


@needs_corpus
def test_a_live_window_opens_on_the_pause_before_its_speech():
    """Whisper reads a window that opens where the speech does worse than one that opens on a
    moment of the pause before it, so a live window takes in up to 2 s of that pause: never audio
    an earlier window had, and never more than Whisper's 30 s."""
    from ferrum_cli.audio.live import LEAD_SECONDS, LiveWindows
    from ferrum_cli.options import VadOptions

    samples, _ = joined_clips(CLIPS, GAP_SECONDS)
    samples = np.concatenate([np.zeros(3 * 16000, np.float32), samples])  # the speaker starts 3 s in
    speech: list[tuple[int, int]] = []
    chunks = (samples[i : i + 1600] for i in range(0, len(samples), 1600))
    windows = [(offset, len(heard) / 16000) for offset, heard in LiveWindows(chunks, VadOptions(), speech)]
    assert len(windows) >= len(CLIPS)

    previous_end = 0.0
    for offset, duration in windows:
        first_speech = min(a for a, b in speech if offset * 16000 <= a < (offset + duration) * 16000) / 16000
        assert offset >= previous_end - 1e-6  # no audio twice
        opens = max(first_speech - LEAD_SECONDS, previous_end)
        assert offset == pytest.approx(opens, abs=0.001), (offset, first_speech)
        assert duration <= 30.0
        previous_end = offset + duration
    assert windows[0][0] < 3.0 - LEAD_SECONDS + 0.5  # the first opens about 2 s before its speech


@needs_corpus
def test_live_text_is_the_same_at_any_pace(tmp_path):
    """Where a stream is cut, and so its text, does not depend on how fast it arrives: speech
    with short pauses inside it, paced at 4x real time and written into the pipe all at once."""
    samples, _ = joined_clips(["en_spontaneous_mfa_acoustic_corpus.wav", "en_digits_10001-90210-01803.wav"], 1.0)
    path = tmp_path / "pauses.wav"
    path.write_bytes(wav_bytes(samples))
    lines, _, ferrum = paced(path, 4.0, "--language", "en")
    assert ferrum.returncode == 0, ferrum.stderr.read()
    at_once = run_ferrum("transcribe", "-", "--live", "-f", "jsonl", "-q", "--language", "en", stdin=path.read_bytes())
    assert at_once.returncode == 0, at_once.stderr
    paced_segments = [(line["start"], line["end"], line["text"]) for _, line in lines]
    assert len(paced_segments) > 2  # cut at the pauses inside the clips
    assert [(s["start"], s["end"], s["text"]) for s in map(json.loads, at_once.stdout.splitlines())] == paced_segments
