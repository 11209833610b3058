"""Property tests and fuzzing: input expansion, output naming, the CTranslate2 reader, audio bytes."""

from __future__ import annotations

import os
import struct
from pathlib import Path, PurePosixPath

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ferrum_cli.batch.inputs import _safe_relative, expand
from ferrum_cli.errors import AudioDecodeError, FerrumError, ModelIntegrityError, OutputError, UsageError
from ferrum_cli.weights.ct2 import read_model_bin
from ferrum_cli.writers import check_inside, output_paths

names = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00"), min_size=1, max_size=24
).filter(lambda n: n not in (".", ".."))


@given(st.lists(st.one_of(names, st.sampled_from(["..", ".", "", "/", "~"])), min_size=1, max_size=6))
def test_output_names_never_climb_out(parts):
    rel = _safe_relative(Path("/".join(parts)))
    assert not rel.is_absolute() and ".." not in rel.parts and rel.parts
    assert all("\n" not in p for p in rel.parts)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.lists(names, max_size=2), names), min_size=1, max_size=8, unique_by=lambda t: t[1]))
def test_expansion_gives_one_distinct_output_per_file_inside_the_folder(tmp_path_factory, tree):
    root = tmp_path_factory.mktemp("tree")
    made = set()
    for folders, name in tree:
        folder = root.joinpath(*folders)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{name}.wav"
            path.write_bytes(b"RIFF")
        except OSError:  # a name this filesystem refuses (too long, a folder named like a file)
            continue
        if not any(part.startswith(".") for part in [*folders, name]):  # hidden names are left out, as by *
            made.add(os.path.realpath(path))
    if not made:
        return
    jobs = expand([str(root)])
    assert {os.path.realpath(j.source) for j in jobs} == made
    out = root / "out"
    outputs = [str(output_paths(out, j.relative, ["txt"])["txt"]).lower() for j in jobs]
    assert len(set(outputs)) == len(outputs)
    for j in jobs:
        check_inside(out, output_paths(out, j.relative, ["txt"])["txt"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(alphabet="ab*?[]/.", min_size=1, max_size=8), min_size=1, max_size=3))
def test_patterns_either_match_or_are_a_usage_error(tmp_path_factory, patterns):
    """Relative patterns: one from / would walk the whole machine (162,953 files, 15 s, here)."""
    assume(not any(p.startswith("/") for p in patterns))
    root = tmp_path_factory.mktemp("glob")
    (root / "a").mkdir()
    (root / "a" / "b.wav").write_bytes(b"x")
    old = os.getcwd()
    os.chdir(root)
    try:
        jobs = expand(patterns)
    except UsageError:
        return
    finally:
        os.chdir(old)
    assert len({j.relative for j in jobs}) == len(jobs)


def test_a_symlink_loop_does_not_hang_the_walk(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.wav").write_bytes(b"RIFF")
    (tmp_path / "a" / "loop").symlink_to(tmp_path, target_is_directory=True)
    jobs = expand([str(tmp_path)])
    assert [j.relative for j in jobs] == [PurePosixPath("a/x")]


def test_a_glob_reads_each_real_file_once_and_never_follows_a_symlink_loop(tmp_path, monkeypatch):
    """Two '..' links made glob.glob's ** run forever; one made outputs 40 folders deep."""
    (tmp_path / "l" / "a").mkdir(parents=True)
    (tmp_path / "l" / "x.wav").write_bytes(b"RIFF")
    (tmp_path / "l" / "a" / "y.wav").write_bytes(b"RIFF")
    (tmp_path / "l" / "up").symlink_to("..", target_is_directory=True)
    (tmp_path / "l" / "a" / "up").symlink_to("..", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    jobs = expand(["l/**/*.wav"])
    assert sorted(str(j.relative) for j in jobs) == ["a/y", "x"]


folders = st.lists(st.sampled_from(["a", "b", ".h", "c d"]), max_size=3)
files_and_folders = st.lists(st.tuples(folders, st.sampled_from(["x.wav", ".y.wav", "z.mp3"])), min_size=1, max_size=8)
patterns = st.lists(
    st.sampled_from(["**", "*", "a", "b*", ".h", "*.wav", "?.mp3", "[ab]", ".*"]), min_size=1, max_size=4
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files_and_folders, patterns)
def test_a_glob_matches_what_glob_glob_matches_where_no_link_leads_back(tmp_path_factory, tree, parts):
    import glob

    from ferrum_cli.batch.inputs import glob_files

    root = tmp_path_factory.mktemp("glob")
    for folders, name in tree:
        root.joinpath(*folders).mkdir(parents=True, exist_ok=True)
        root.joinpath(*folders, name).write_bytes(b"x")
    pattern = str(root.joinpath(*parts))
    expected = sorted({m for m in glob.glob(pattern, recursive=True) if os.path.isfile(m)})  # each once
    assert glob_files(pattern) == expected


def test_output_outside_the_folder_is_refused(tmp_path):
    with pytest.raises(OutputError):
        check_inside(tmp_path / "out", tmp_path / "out" / ".." / "escape.txt")


def _tiny_model_bin() -> bytes:
    """A valid CTranslate2 model.bin of two variables and one alias, written by hand."""

    def text(s: str) -> bytes:
        raw = s.encode() + b"\0"
        return struct.pack("<H", len(raw)) + raw

    out = struct.pack("<I", 6) + text("WhisperSpec") + struct.pack("<I", 3) + struct.pack("<I", 2)
    for name, arr in (("a/weight", np.arange(6, dtype=np.float32).reshape(2, 3)), ("b", np.ones(4, np.float16))):
        dtype = {np.float32: 0, np.float16: 4}[arr.dtype.type]
        out += text(name) + struct.pack("<B", arr.ndim) + struct.pack(f"<{arr.ndim}I", *arr.shape)
        out += struct.pack("<BI", dtype, arr.nbytes) + arr.tobytes()
    return out + struct.pack("<I", 1) + text("c") + text("a/weight")


def test_the_hand_written_model_bin_reads_back():
    spec, variables = read_model_bin(_tiny_model_bin())
    assert spec == "WhisperSpec" and variables["c"] is variables["a/weight"]
    assert variables["a/weight"].tolist() == [[0, 1, 2], [3, 4, 5]]


def test_a_byte_count_that_splits_a_value_is_refused():
    """Found by the fuzz test below: a float32 variable declared as 25 bytes."""
    blob = _tiny_model_bin()
    at = blob.index(struct.pack("<BI", 0, 24))
    blob = blob[:at] + struct.pack("<BI", 0, 25) + blob[at + 5 :]
    with pytest.raises(ModelIntegrityError, match="not a whole number of values"):
        read_model_bin(blob)


@settings(max_examples=1000, deadline=None)
@given(st.data())
def test_mutated_model_bin_is_read_or_refused_with_a_typed_error(data):
    blob = bytearray(_tiny_model_bin())
    for _ in range(data.draw(st.integers(1, 8))):
        kind = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        at = data.draw(st.integers(0, len(blob) - 1)) if blob else 0
        if kind == "flip" and blob:
            blob[at] ^= data.draw(st.integers(1, 255))
        elif kind == "cut":
            del blob[at:]
        else:
            blob[at:at] = data.draw(st.binary(min_size=1, max_size=8))
    try:
        read_model_bin(bytes(blob))
    except ModelIntegrityError:
        pass


def test_an_empty_variable_with_a_shape_too_large_to_lay_out_is_refused_with_a_typed_error():
    """Found by the test above: a variable with no values, whose other dimensions multiply past
    what numpy can lay out, matched its size (0), and numpy's reshape raised a ValueError."""
    blob = (
        b"\x06\x00\x00\x00\x0c\x00\x00\x00\x00\x00WhisperSpec\x00\x03\x00"
        b"\x00\x00\x02\x00\x00\x00\t\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00a/wei"
        b"ght\x00\x02\x02\x00\x00\x00\x03\x00\x00\x00\x00\x18\x00\x00\x00\x00\x00\x00\x00\x00\x00"
    )
    with pytest.raises(ModelIntegrityError, match="size does not match its shape"):
        read_model_bin(blob)


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=2000))
def test_random_bytes_are_read_or_refused_by_the_model_reader(blob):
    try:
        read_model_bin(blob)
    except ModelIntegrityError:
        pass


def test_random_and_mutated_audio_bytes_end_in_a_typed_error_or_audio():
    """1,000 inputs through ffmpeg: random bytes, and a real WAV with bytes flipped or cut."""
    from ferrum_cli.audio.ffmpeg import decode_bytes

    rng = np.random.default_rng(11)
    tone = 0.2 * np.sin(np.arange(8000) / 5)
    import io
    import wave

    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes((tone * 32767).astype(np.int16).tobytes())
    good = buffer.getvalue()
    outcomes = {"audio": 0, "error": 0}
    for i in range(1000):
        if i % 2:
            data = rng.integers(0, 256, int(rng.integers(0, 3000)), dtype=np.uint8).tobytes()
        else:
            blob = bytearray(good)
            for _ in range(int(rng.integers(1, 20))):
                blob[int(rng.integers(0, len(blob)))] = int(rng.integers(0, 256))
            data = bytes(blob[: int(rng.integers(1, len(blob) + 1))])
        try:
            decoded = decode_bytes(data)
            assert decoded.samples.dtype == np.float32
            outcomes["audio"] += 1
        except FerrumError as exc:
            assert isinstance(exc, AudioDecodeError) and exc.message
            outcomes["error"] += 1
    assert outcomes["audio"] > 0 and outcomes["error"] > 0
