"""The real `ferrum` executable, in a subprocess, on corpus audio."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ferrum_cli.audio.ffmpeg import find_ffmpeg
from ferrum_cli.batch.inputs import expand
from ferrum_cli.platform.cpu import int8_available, usable_cpus

from .helpers import (
    FERRUM,
    JFK,
    SAMPLE,
    corpus,
    needs_corpus,
    run_ferrum,
    run_ferrum_on_a_terminal,
    summary_counts,
    words,
)

pytestmark = needs_corpus

TIMESTAMP = {
    "srt": re.compile(r"^(\d\d):(\d\d):(\d\d),(\d\d\d) --> (\d\d):(\d\d):(\d\d),(\d\d\d)$"),
    "vtt": re.compile(r"^(?:(\d\d):)?(\d\d):(\d\d)\.(\d\d\d) --> (?:(\d\d):)?(\d\d):(\d\d)\.(\d\d\d)$"),
}


def _seconds(h, m, s, ms) -> float:
    return int(h or 0) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000


def cue_times(text: str, fmt: str) -> list[tuple[float, float]]:
    out = []
    for line in text.splitlines():
        if m := TIMESTAMP[fmt].match(line.strip()):
            g = m.groups()
            out.append((_seconds(*g[:4]), _seconds(*g[4:])))
    return out


def test_single_file_prints_its_text():
    proc = run_ferrum("transcribe", str(corpus(JFK)))
    assert proc.returncode == 0, proc.stderr
    assert "ask not what your country can do for you" in words(proc.stdout)
    assert "language en" in proc.stderr  # detected and reported, on stderr only
    assert "language" not in proc.stdout


@pytest.mark.parametrize(
    "options",
    [
        ["--temperature", "0.4", "--best-of", "3"],
        ["--temperature", "0.4", "--best-of", "3", "--sequential"],
        ["--beam-size", "2"],
        ["--beam-size", "3", "--patience", "2"],
        ["--dtype", "bfloat16"],
        ["--dtype", "float16"],
        ["--compute", "bfloat16"],
        pytest.param(["--compute", "int8"], marks=pytest.mark.skipif(not int8_available(), reason="x86 only")),
    ],
    ids=" ".join,
)
def test_decoding_options_that_take_paths_of_their_own(options):
    """Best-of-n sampling, beam search, weights in half precision and the encoder's computes on the
    CPU; no warning of the libraries' own housekeeping (a file openai-whisper's tokenizer leaves
    open) reaches the user as one of the input's."""
    proc = run_ferrum("transcribe", str(corpus(JFK)), "--language", "en", *options)
    assert proc.returncode == 0, proc.stderr
    assert "ask not what your country can do for you" in words(proc.stdout)
    assert "warning" not in proc.stderr, proc.stderr


def test_an_english_only_model_transcribes_english_and_refuses_other_languages():
    for engine in ([], ["--sequential"], ["--language", "en", "--multilingual"]):
        proc = run_ferrum("transcribe", str(corpus(JFK)), "--model", "tiny.en", *engine)
        assert proc.returncode == 0, proc.stderr
        assert "ask not what your country can do for you" in words(proc.stdout)
    for refused, reason in ((["--language", "de"], "transcribe language 'de'"), (["--task", "translate"], "translate")):
        proc = run_ferrum("transcribe", str(corpus(JFK)), "--model", "tiny.en", *refused)
        assert proc.returncode == 2
        assert proc.stderr.strip() == f"error: model tiny.en is English-only; it cannot {reason}"


def test_openai_whisper_warnings_come_as_one_clean_line_of_the_input():
    proc = run_ferrum(
        "transcribe", str(corpus(JFK)), "--task", "translate", "--word-timestamps", "--dtype", "float16"
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    expected = f"warning: {corpus(JFK)}: Word-level timestamps on translations may not be reliable."
    assert expected in proc.stderr.splitlines()
    # words the user did not ask for, timed only to place speakers: the warning says what it is about
    proc = run_ferrum("transcribe", str(corpus(JFK)), "--task", "translate", "--diarize", "-q")
    assert proc.returncode == 0, proc.stderr
    said = (
        f"warning: {corpus(JFK)}: speaker changes are placed at word times, which may not be reliable on translations"
    )
    assert proc.stderr.splitlines() == [said]
    assert "UserWarning" not in proc.stderr and "FP16" not in proc.stderr  # float16 weights are ours to run


def test_stdin_pipe_prints_the_text():
    proc = run_ferrum("transcribe", "-", stdin=corpus("de_librivox_simplicissimus_aeneas.mp3").read_bytes())
    assert proc.returncode == 0, proc.stderr
    assert "abenteuerliche simplizissimus" in proc.stdout.lower()


def test_stdin_pipe_of_an_m4a_whose_index_comes_last_and_live_says_why_it_cannot(tmp_path):
    """ffmpeg writes mp4's index (moov) after the audio unless told otherwise, as many recorders
    do, and reading it needs a seek that a pipe does not allow."""
    m4a = tmp_path / "memo.m4a"
    subprocess.run(
        [find_ffmpeg().path, "-nostdin", "-v", "error", "-i", str(corpus(JFK)), "-c:a", "aac", str(m4a)], check=True
    )
    assert m4a.read_bytes().rfind(b"moov") > m4a.read_bytes().find(b"mdat")
    proc = run_ferrum("transcribe", "-", "--language", "en", stdin=m4a.read_bytes())
    assert proc.returncode == 0, proc.stderr
    assert "ask not what your country can do for you" in words(proc.stdout)
    live = run_ferrum("transcribe", "-", "--live", "--language", "en", stdin=m4a.read_bytes())  # read as it comes
    assert live.returncode == 1 and "Traceback" not in live.stderr
    assert "error: <stdin>: an mp4 or m4a whose index comes last cannot be read from a pipe" in live.stderr


def test_stdin_with_output_dir_writes_stdin_srt_or_the_given_name(tmp_path):
    data = corpus(JFK).read_bytes()
    proc = run_ferrum("transcribe", "-", "-f", "srt", "-o", str(tmp_path), stdin=data)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "stdin.srt").is_file() and proc.stdout == ""
    proc = run_ferrum("transcribe", "-", "-f", "srt", "-o", "-", "--model", "tiny.en", stdin=data, cwd=tmp_path)
    assert proc.returncode == 0 and "ask not what your country" in proc.stdout  # '-o -' is stdout, as elsewhere
    assert not (tmp_path / "-").exists()
    proc = run_ferrum("transcribe", "-", "-f", "txt", "-o", str(tmp_path), "--stdin-name", "kennedy.flac", stdin=data)
    assert proc.returncode == 0 and (tmp_path / "kennedy.txt").is_file()  # named as the file it would be
    assert [job.relative.name for job in expand(["-"], "call.2026-12")] == ["call.2026-12"]  # not a media suffix


def _make_tree(root: Path) -> None:
    (root / "a" / "b").mkdir(parents=True)
    shutil.copy(corpus(JFK), root / "jfk.flac")
    shutil.copy(corpus("en_librispeech_61-70968-0000.flac"), root / "a" / "wizard.flac")
    shutil.copy(corpus("en_librispeech_2830-3980-0043.wav"), root / "a" / "b" / "experience.wav")
    (root / "a" / "notes.txt").write_text("not audio")
    (root / "a" / "b" / "cover.jpg").write_bytes(b"\xff\xd8\xff")


def test_directory_tree_gives_one_output_per_audio_file_with_mirrored_folders(tmp_path):
    src, out = tmp_path / "talks", tmp_path / "out"
    _make_tree(src)
    proc = run_ferrum("transcribe", str(src), "-o", str(out), "-f", "txt")
    assert proc.returncode == 0, proc.stderr
    produced = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert produced == ["a/b/experience.txt", "a/wizard.txt", "jfk.txt"]
    assert "wizard" in (out / "a" / "wizard.txt").read_text()


def test_hidden_files_and_folders_are_left_out_of_a_folder_as_of_a_glob(tmp_path):
    """macOS leaves ._name copies of each file's metadata on USB drives and shares: not audio,
    they failed a whole folder's batch (exit 1), one error line each."""
    src, out = tmp_path / "talks", tmp_path / "out"
    _make_tree(src)
    (src / "._jfk.flac").write_bytes(b"\x00\x05\x16\x07" + bytes(4000))  # AppleDouble's magic
    (src / ".Trash" / "files").mkdir(parents=True)
    shutil.copy(corpus(JFK), src / ".Trash" / "files" / "deleted.flac")
    for given, cwd in ((str(src), None), ("**/*.flac", src)):
        proc = run_ferrum("transcribe", given, "-o", str(out), "-f", "txt", "-q", cwd=cwd)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        assert not list(out.rglob(".*")) and not list(out.rglob("deleted*"))
    proc = run_ferrum("transcribe", str(src / "._jfk.flac"), "-q")  # named: read, and it is not audio
    assert proc.returncode == 1 and proc.stderr.startswith("error:"), proc.stderr


def test_quoted_recursive_glob_is_expanded_by_ferrum(tmp_path):
    """As the shell would have: '**' any folders deep, and '~' (which quotes keep from the shell) home."""
    src, out = tmp_path / "talks", tmp_path / "out"
    _make_tree(src)
    proc = run_ferrum("transcribe", "**/*.flac", "-o", str(out), cwd=src)
    assert proc.returncode == 0, proc.stderr
    produced = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.txt"))
    assert produced == ["a/wizard.txt", "jfk.txt"]

    home_out = tmp_path / "from-home"
    proc = run_ferrum("transcribe", "~/talks/**/*.flac", "-o", str(home_out), env={"HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.relative_to(home_out).as_posix() for p in home_out.rglob("*.txt")) == produced


def test_several_inputs_on_stdout_each_get_a_header():
    proc = run_ferrum("transcribe", str(corpus(JFK)), str(corpus("en_librispeech_2830-3980-0043.wav")))
    assert proc.returncode == 0, proc.stderr
    headers = [ln for ln in proc.stdout.splitlines() if ln.startswith("==> ")]
    assert len(headers) == 2 and JFK in headers[0]


def test_several_inputs_in_json_on_stdout_are_one_stream_a_json_reader_takes():
    """No "==>" header lines, which no JSON reader takes: each json document and jsonl line names
    its input instead, as it was given."""
    clips = [str(corpus(JFK)), str(corpus("en_librispeech_2830-3980-0043.wav"))]
    proc = run_ferrum("transcribe", *clips, "-f", "jsonl", "-f", "json", "-q")
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    documents = [r for r in records if "segments" in r]
    lines = [r for r in records if "segments" not in r]
    assert [d["input"] for d in documents] == clips and "ask not" in words(documents[0]["text"])
    assert {r["input"] for r in lines} == set(clips) and all(r["language"] == "en" for r in lines)
    assert " ".join(r["text"] for r in lines if r["input"] == clips[1]).strip() == documents[1]["text"]


@needs_corpus
def test_a_reader_that_closes_stdout_ends_the_batch_quietly():
    """As `ferrum transcribe talks/ | head -1`: once nothing reads the results, the rest of the
    batch is not transcribed for nobody, and no error is reported for it."""
    clips = [str(corpus(name)) for name in (JFK, "en_librispeech_2830-3980-0043.wav", "en_timit_LDC93S1.wav")]
    proc = subprocess.Popen([FERRUM, "transcribe", *clips, "--batch-size", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert JFK in proc.stdout.readline()
    proc.stdout.close()
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert "error" not in stderr and "done" not in stderr  # no failures, and no summary of a run that went on


def test_every_format_is_written_and_parses_back(tmp_path):
    proc = run_ferrum("transcribe", str(corpus(JFK)), "-f", "all", "-o", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    stem = Path(JFK).stem
    for fmt in ("srt", "vtt"):
        times = cue_times((tmp_path / f"{stem}.{fmt}").read_text(), fmt)
        assert times, fmt
        assert all(start < end for start, end in times)
        assert all(a[1] <= b[0] + 1e-3 for a, b in zip(times, times[1:])), "cues overlap or go back"
        assert times[-1][1] <= 11.01
    assert (tmp_path / f"{stem}.vtt").read_text().startswith("WEBVTT")
    doc = json.loads((tmp_path / f"{stem}.json").read_text())
    assert doc["language"] == "en" and doc["duration"] == pytest.approx(11.0, abs=0.1) and doc["segments"]
    lines = (tmp_path / f"{stem}.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert records and all({"start", "end", "text"} <= r.keys() for r in records)
    tsv = (tmp_path / f"{stem}.tsv").read_text().splitlines()
    assert tsv[0].split("\t") == ["start", "end", "text"]
    assert "ask not what your country" in words((tmp_path / f"{stem}.txt").read_text())


def test_jsonl_on_stdout_is_one_object_per_line():
    proc = run_ferrum("transcribe", str(corpus(JFK)), "-f", "jsonl")
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert records and all(r["end"] > r["start"] for r in records)


def test_skip_existing_skips_then_redoes_a_deleted_output(tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    shutil.copy(corpus("en_librispeech_2830-3980-0043.wav"), src / "one.wav")
    shutil.copy(corpus("en_librispeech_4507-16021-0012.wav"), src / "two.wav")
    assert run_ferrum("transcribe", str(src), "-o", str(out)).returncode == 0
    first = (out / "one.txt").stat().st_mtime_ns
    proc = run_ferrum("transcribe", str(src), "-o", str(out), "--skip-existing")
    assert proc.returncode == 0 and summary_counts(proc.stderr) == (0, 2, 0), proc.stderr
    (out / "two.txt").unlink()
    proc = run_ferrum("transcribe", str(src), "-o", str(out), "--skip-existing")
    assert proc.returncode == 0 and summary_counts(proc.stderr) == (1, 1, 0), proc.stderr
    assert (out / "two.txt").is_file() and (out / "one.txt").stat().st_mtime_ns == first


def test_a_corrupt_file_fails_alone_and_the_batch_exits_1(tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    shutil.copy(corpus("en_librispeech_2830-3980-0043.wav"), src / "good.wav")
    (src / "bad.mp3").write_bytes(b"this is not audio at all\n" * 40)
    proc = run_ferrum("transcribe", str(src), "-o", str(out))
    assert proc.returncode == 1
    assert (out / "good.txt").is_file() and not (out / "bad.txt").exists()
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "bad.mp3" in errors[0] and "Traceback" not in proc.stderr


def test_a_pattern_that_matches_nothing_exits_2(tmp_path):
    proc = run_ferrum("transcribe", "'nothing/**/*.flac'", cwd=tmp_path)
    assert proc.returncode == 2 and "no input matched" in proc.stderr
    proc = run_ferrum("transcribe", "nothing/**/*.flac", cwd=tmp_path)
    assert proc.returncode == 2


def test_more_threads_than_cpus_is_said_and_still_transcribes():
    """Threads past the CPUs only wait on each other (JFK: 3.5 s with 2 threads on 2 cores, 22 s with 500)."""
    too_many = usable_cpus() + 1
    proc = run_ferrum("transcribe", str(corpus(JFK)), "--threads", str(too_many), "-q", "--language", "en")
    assert proc.returncode == 0 and "ask not what your country" in words(proc.stdout), proc.stderr
    said = f"warning: --threads {too_many} is more than the {usable_cpus()} CPU"
    assert proc.stderr.startswith(said) and proc.stderr.count("\n") == 1, proc.stderr
    proc = run_ferrum("transcribe", str(corpus(JFK)), "--threads", "1", "-q", "--language", "en")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_bad_option_values_exit_2():
    assert run_ferrum("transcribe", str(SAMPLE), "-f", "docx").returncode == 2
    assert run_ferrum("transcribe", str(SAMPLE), "--task", "dance").returncode == 2
    assert run_ferrum("transcribe", str(SAMPLE), "--language", "klingon").returncode == 2
    for languages in (["--languages", "en,klingon"], ["--language", "en", "--languages", "de,fr"]):
        proc = run_ferrum("transcribe", str(SAMPLE), *languages)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert run_ferrum("transcribe", str(SAMPLE), "--compute", "fp8").returncode == 2
    proc = run_ferrum("transcribe", str(SAMPLE), "--device", "cuda:7")
    assert proc.returncode == 2 and "available: cpu" in proc.stderr
    for bad, said in (  # each was an internal error or a failed file, past click's range checks
        (["--temperature", "nan"], "temperature must be a number, not nan"),
        (["--patience", "2"], "--patience needs --beam-size"),
        (["--patience", "0.1", "--beam-size", "5"], "--patience must be above 0.1 with --beam-size 5, not 0.1"),
        (["-o", ""], "-o names no folder (an empty name); give a folder, or - for stdout"),  # -o "$UNSET": not cwd
        (["--skip-existing"], "--skip-existing needs -o: it skips inputs whose files there are whole"),
        (
            ["-f", "srt", "-f", "vtt"],
            "stdout takes one format, or json, jsonl and rttm (a record a line), not srt, vtt:"
            " -o DIR writes each to a file of its own",
        ),
        (
            ["-f", "all", "-o", "-"],
            "stdout takes one format, or json, jsonl and rttm (a record a line), not txt, srt, vtt, json, tsv, jsonl:"
            " -o DIR writes each to a file of its own",
        ),
    ):
        proc = run_ferrum("transcribe", str(SAMPLE), *bad)
        assert proc.returncode == 2 and proc.stderr == f"error: {said}\n", proc.stderr


def test_info_as_table_and_json():
    proc = run_ferrum("info")
    assert proc.returncode == 0 and "sha256" in proc.stdout and "base" in proc.stdout
    doc = json.loads(run_ferrum("info", "--json").stdout)
    assert doc["name"] == "base" and doc["dims"]["n_text_layer"] == 6 and doc["parameters"] > 7e7
    assert doc["multilingual"] is True and len(doc["languages"]) == 99


def test_status_as_table_and_json():
    proc = run_ferrum("status")
    assert proc.returncode == 0, proc.stderr
    assert "ffmpeg" in proc.stdout and "torch" in proc.stdout
    doc = json.loads(run_ferrum("status", "--json").stdout)
    assert doc["versions"]["ferrum"] and doc["versions"]["torch"] and doc["versions"]["openai-whisper"]
    assert doc["ffmpeg"]["source"] in ("PATH", "imageio-ffmpeg", "FERRUM_FFMPEG") and doc["ffmpeg"]["path"]
    assert doc["devices"][0]["device"] == "cpu" and doc["devices"][0]["memory_bytes"] > 0
    assert doc["default_device"] == "cpu" and doc["default_dtype"] == "float32"
    assert doc["cpu_compute"] in ("float32", "bfloat16", "int8")  # what `--compute auto` runs the encoder in here
    assert doc["cpu_compute"] != "bfloat16" or doc["cpu_bfloat16_instructions"] is True
    path = doc["cpu_path"]  # which path this CPU gets, and why
    assert path["encoder"] == doc["cpu_compute"] and path["instructions"] in path["why"]
    assert path["decoder_features"] == ("bfloat16" if path["encoder"] == "bfloat16" else "float16")  # x86: fbgemm
    assert doc["default_model_ready_offline"] is True
    assert any(p["model"] == "base" for p in doc["installed_packs"])


def test_status_fails_when_ffmpeg_is_unusable(tmp_path):
    proc = run_ferrum("status", env={"FERRUM_FFMPEG": str(tmp_path / "nope")})
    assert proc.returncode != 0 and "FERRUM_FFMPEG" in proc.stderr


def test_warmup_prints_each_step_and_json():
    proc = run_ferrum("warmup")
    assert proc.returncode == 0 and "forward_seconds" in proc.stdout
    doc = json.loads(run_ferrum("warmup", "--json", "--device", "cpu").stdout)
    assert doc["model"] == "base" and doc["device"] == "cpu"
    assert doc["resolve_seconds"] >= 0 and doc["load_seconds"] > 0 and doc["forward_seconds"] > 0


def test_warmup_diarize_compiles_the_clustering_into_the_cache():
    """The first recording past 20 minutes diarized would compile UMAP's numba code into the cache
    (about 20 s); `warmup --diarize` does it beforehand. The session's cache is new, and no test
    before this one clusters by density."""
    import os

    proc = run_ferrum("warmup", "--diarize", "--json", "--model", "tiny.en")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["diarizer_seconds"] > 0
    compiled = Path(os.environ["FERRUM_CACHE_DIR"], "diarization").rglob("*.nbi")
    assert any(path.parent.name.startswith("umap_") for path in compiled)


def test_version_and_help():
    proc = run_ferrum("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("ferrum ")
    for command in ("transcribe", "info", "status", "warmup"):
        proc = run_ferrum(command, "--help")
        assert proc.returncode == 0 and "Examples" in proc.stdout, command


def test_sample_that_ships_in_the_repo():
    proc = run_ferrum("transcribe", str(SAMPLE))
    assert proc.returncode == 0, proc.stderr
    said = "and mister john dashwood had then leisure to consider how much there might be"
    said += " prudently in his power to do for them"  # the transcript that ships with the recording
    assert words(proc.stdout) == words(said)


def test_no_input_with_a_pipe_reads_stdin():
    proc = run_ferrum("transcribe", stdin=corpus(JFK).read_bytes())
    assert proc.returncode == 0 and "ask not what your country" in words(proc.stdout)


def test_quiet_and_verbose():
    quiet = run_ferrum("transcribe", str(corpus(JFK)), "-q")
    assert quiet.returncode == 0 and quiet.stderr == "" and "ask not" in words(quiet.stdout)
    verbose = run_ferrum("transcribe", str(corpus(JFK)), "--verbose")
    assert re.search(r"\[\s*0\.\d+ → \s*\d+\.\d+\] And so my fellow Americans", verbose.stderr), verbose.stderr
    assert "→" not in verbose.stdout


def test_progress_bar_on_a_terminal():
    """stderr on a pseudo-terminal: rich draws the bar there; stdout, a pipe, holds only the text."""
    proc = run_ferrum_on_a_terminal("transcribe", str(corpus(JFK)), str(corpus("en_librispeech_2830-3980-0043.wav")))
    screen = proc.stderr
    assert proc.returncode == 0
    assert "transcribing" in screen and "2/2" in screen and "s audio" in screen
    assert "transcribing" not in proc.stdout and "ask not what your country" in proc.stdout.lower()
