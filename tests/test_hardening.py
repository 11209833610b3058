"""Inputs a new user or an attacker gives the CLI, each of which once failed: special tokens in a
prompt, strict JSON readers, pipes, a stereo file whose channels cancel, unspaced scripts, help at
80 columns. Every test runs the real `ferrum` in a subprocess."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading

import pytest

from ferrum_cli.audio.ffmpeg import find_ffmpeg

from .helpers import FERRUM, JFK, SAMPLE, corpus, run_ferrum, words

SPECIAL = "<|endoftext|><|startoftranscript|><|en|>"


def strict_json(text: str):
    """json.loads as JSON.parse reads it: Infinity and NaN are not JSON."""

    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("engine", [[], ["--sequential"]], ids=["batched", "sequential"])
def test_a_prompt_or_hotwords_that_spell_special_tokens_are_read_as_text(engine):
    for option in ("--initial-prompt", "--hotwords"):
        proc = run_ferrum("transcribe", str(SAMPLE), option, SPECIAL, "-q", *engine)
        assert proc.returncode == 0, proc.stderr
        assert "dashwood" in words(proc.stdout), proc.stdout


def test_every_json_output_parses_with_a_strict_parser(tmp_path):
    proc = run_ferrum("transcribe", str(SAMPLE), str(corpus(JFK)), "-f", "json", "-f", "jsonl", "-o", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    documents = sorted(tmp_path.glob("*.json"))
    assert len(documents) == 2
    for path in documents:
        doc = strict_json(path.read_text())
        assert doc["options"]["vad_options"]["max_speech_duration_s"] is None  # infinite: no limit
    for path in tmp_path.glob("*.jsonl"):
        assert [strict_json(line) for line in path.read_text().splitlines()]
    for command in (["info", "--json"], ["status", "--json"]):
        strict_json(run_ferrum(*command).stdout)


def test_process_substitution_and_a_named_pipe_are_read_not_refused_as_empty(tmp_path):
    """<(cat a.mp3) is /dev/fd/N, which only ferrum's process holds: it was 'empty file', and the
    writer into it was left blocked."""
    script = f'exec "{FERRUM}" transcribe <(cat "{SAMPLE}") -q'
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "dashwood" in words(proc.stdout)

    fifo = tmp_path / "talk.wav"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(SAMPLE.read_bytes()))
    writer.start()
    proc = run_ferrum("transcribe", str(fifo), "-o", str(tmp_path / "out"), "-q")
    writer.join(60)
    assert not writer.is_alive(), "the writer into the FIFO was left blocked"
    assert proc.returncode == 0, proc.stderr
    assert "dashwood" in words((tmp_path / "out" / "talk.txt").read_text())


def test_a_stereo_file_with_one_channel_inverted_gives_its_speech(tmp_path):
    """The downmix of L and -L is silence: the louder channel is read instead, and a file with
    nothing to hear reports its real level."""
    inverted = tmp_path / "inverted.flac"
    pan = "pan=stereo|c0=c0|c1=-1*c0"
    subprocess.run([find_ffmpeg().path, "-v", "error", "-i", str(SAMPLE), "-af", pan, str(inverted)], check=True)
    proc = run_ferrum("transcribe", str(inverted), "-q")
    assert proc.returncode == 0 and "dashwood" in words(proc.stdout), proc.stderr
    piped = run_ferrum("transcribe", "-", "-q", stdin=inverted.read_bytes())
    assert piped.stdout == proc.stdout

    quiet_noise = tmp_path / "noise.wav"  # inverted noise at -40 dBFS, no speech
    noise = "anoisesrc=a=0.01:d=3:r=16000,pan=stereo|c0=c0|c1=-1*c0"
    subprocess.run([find_ffmpeg().path, "-v", "error", "-f", "lavfi", "-i", noise, str(quiet_noise)], check=True)
    proc = run_ferrum("transcribe", str(quiet_noise))
    level = re.search(r"no speech found \(peak (\S+) dBFS\)", proc.stderr)
    assert level and level.group(1) != "-inf" and -45 < float(level.group(1)) < -30, proc.stderr


@pytest.mark.parametrize("engine", [[], ["--sequential"]], ids=["batched", "sequential"])
def test_japanese_words_are_timed_one_by_one_in_both_engines(engine, tmp_path):
    """The batched engine split by spaces in the engine's language ("en"): one word a sentence."""
    clip = corpus("ja_jsut_basic5000_0001.wav")
    proc = run_ferrum("transcribe", str(clip), "--word-timestamps", "-f", "json", "-f", "srt",
                      "--max-line-width", "10", "-o", str(tmp_path), *engine)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "ja_jsut_basic5000_0001.json").read_text())
    timed = [w for s in doc["segments"] for w in s["words"]]
    assert len(timed) >= 10 and all(len(w["word"].strip()) <= 4 for w in timed)
    lines = [ln for ln in (tmp_path / "ja_jsut_basic5000_0001.srt").read_text().splitlines() if ln and "-->" not in ln]
    text_lines = [ln for ln in lines if not ln.isdigit()]
    assert len(text_lines) >= 2 and all(len(ln) <= 12 for ln in text_lines), text_lines


@pytest.mark.parametrize("command", ["transcribe", "serve", "info", "status", "warmup"])
def test_help_at_80_columns_cuts_no_option_name(command):
    proc = run_ferrum(command, "--help", env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"})
    assert proc.returncode == 0
    assert "…" not in proc.stdout, [ln for ln in proc.stdout.splitlines() if "…" in ln]
    for name in (
        "--temperature-increment-on-fallback",
        "--compression-ratio-threshold",
        "--no-condition-on-previous-text",
    ):
        assert command != "transcribe" or name in proc.stdout


def test_an_error_the_event_loop_logs_with_its_exception_is_one_line(caplog):
    """asyncio logs "socket.accept() out of system resource" with a traceback when files run out;
    the server's log folds it into one line."""
    import logging

    from ferrum_cli.server.guard import OneLineLog

    logger = logging.getLogger("ferrum.test.loop")
    logger.addFilter(OneLineLog())
    try:
        raise OSError(24, "Too many open files")
    except OSError:
        logger.error("socket.accept() out of system resource\nsocket: <asyncio.TransportSocket fd=6>", exc_info=True)
    record = caplog.records[-1]
    assert record.exc_info is None
    assert record.getMessage() == "socket.accept() out of system resource: OSError: [Errno 24] Too many open files"
