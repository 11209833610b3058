"""WhisperModelExecutor: real base weights from the installed pack, real corpus audio."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from ferrum_cli.audio.constants import SAMPLE_RATE
from ferrum_cli.audio.ffmpeg import decode_file
from ferrum_cli.audio.windows import BLOCK
from ferrum_cli.errors import AudioDecodeError, ExecutorStateError, InputError, UsageError
from ferrum_cli.options import KnownSpeaker, TranscribeOptions, VadOptions

from .helpers import JFK, SAMPLE, corpus, corpus_rows, english_rows, joined_clips, needs_corpus, wav_bytes, words


@needs_corpus
def test_jfk_through_the_default_pack(executor):
    text = executor.transcribe_file(corpus(JFK), language="en")
    assert "ask not what your country can do for you" in words(text)


@needs_corpus
@pytest.mark.parametrize(
    "name",
    [
        "en_jfk_inaugural_1961.flac",
        "de_librivox_simplicissimus_aeneas.mp3",
        "es_fleurs_000.ogg",
        "es_mls_13697_11991_000000.opus",
    ],
)
def test_bytes_give_the_same_text_as_the_file(executor, name):
    path = corpus(name)
    assert executor.transcribe_bytes(path.read_bytes()) == executor.transcribe_file(path)


@needs_corpus
def test_an_open_file_and_a_path_in_bytes_read_as_the_file(executor, tmp_path):
    """An open binary file (a web framework's upload, io.BytesIO), read from where it stands, and
    a path in bytes (os.listdir(b".")'s, for names that are not UTF-8) give the file's text; a
    file opened as text, a path given as bytes of audio, or a language that is no string fail in one line."""
    import io
    import os

    path = corpus("en_jfk_inaugural_1961.flac")
    text = executor.transcribe_file(path)
    with open(path, "rb") as opened:
        assert executor.transcribe(opened).text == text
    after_junk = io.BytesIO(b"junk" + path.read_bytes())
    after_junk.seek(4)
    assert executor.transcribe(after_junk).text == text
    named = tmp_path / "caf\udce9.flac"  # the latin-1 bytes of café, as Python names them
    named.write_bytes(path.read_bytes())
    assert executor.transcribe_file(os.fsencode(named)) == text

    with open(path, errors="replace") as as_text, pytest.raises(InputError, match="binary mode"):
        executor.transcribe(as_text)
    with pytest.raises(InputError, match="transcribe_file takes its path"):
        executor.transcribe_bytes(str(path))
    with pytest.raises(UsageError, match="not dict"):
        executor.transcribe_file(path, {"language": "en"})


@needs_corpus
def test_bytes_of_a_recording_longer_than_a_planning_block_give_the_file_text(executor, tmp_path):
    """Windows are planned 4 minutes at a time. Bytes (stdin, an upload) are decoded whole, and
    were planned as one block: 20 minutes piped in read differently from the same file."""
    rows = english_rows()
    samples, _ = joined_clips([row["file"] for row in rows] * 3, gap_seconds=1.0)  # 5 minutes
    assert len(samples) > BLOCK
    path = tmp_path / "long.wav"
    path.write_bytes(wav_bytes(samples))
    assert executor.transcribe_bytes(path.read_bytes()) == executor.transcribe_file(path)


def test_random_bytes_are_a_typed_error(executor):
    data = np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    with pytest.raises(AudioDecodeError):
        executor.transcribe_bytes(data)


def test_an_unknown_compute_is_a_typed_error(executor):
    with pytest.raises(UsageError, match="unknown compute 'fp8'"):
        executor.transcribe(str(SAMPLE), TranscribeOptions(compute="fp8"))


@pytest.mark.parametrize(
    "bad, named",
    [
        (dict(batch_size=0), "batch_size"),
        (dict(task="summarize"), "task"),
        (dict(language="english"), "language"),
        (dict(language="xx"), "language"),
        (dict(temperature=(0.0, 1.5)), "temperature"),
        (dict(temperature=()), "temperature"),
        (dict(beam_size=0), "beam_size"),
        (dict(no_speech_threshold=float("nan")), "no_speech_threshold"),
        (dict(vad_options=VadOptions(threshold=2.0)), "vad threshold"),
        (dict(vad_options=VadOptions(speech_pad_ms=-1)), "speech_pad_ms"),
        (dict(beam_size=2.5), "beam_size must be a whole number"),
        (dict(batch_size="12"), "batch_size must be a whole number"),
        (dict(word_timestamps="yes"), "word_timestamps must be True or False"),
        (dict(initial_prompt=5), "initial_prompt must be text"),
        (dict(vad_options=0.5), "vad_options must be a VadOptions"),
    ],
)
def test_an_option_out_of_range_is_a_usage_error_naming_it(executor, bad, named):
    """The library checks every option, as the CLI and the server do (options.check, once for all)."""
    with pytest.raises(UsageError, match=named):
        executor.transcribe(str(SAMPLE), TranscribeOptions(**bad))


def test_a_bad_thread_count_or_an_empty_model_is_a_usage_error_before_anything_loads():
    from ferrum_cli.executor import WhisperModelExecutor

    for kwargs, says in (
        (dict(threads=-1), "threads must be a whole number of at least 1, not -1"),
        (dict(threads=2.5), "not 2.5"),
        (dict(model_path=""), "no model given"),
    ):
        with pytest.raises(UsageError, match=says):
            WhisperModelExecutor.from_path(**{"model_path": "tiny.en", **kwargs})


def test_options_take_the_forms_callers_write_by_hand():
    """As openai-whisper and faster-whisper take them. A string of speaker names was read letter
    by letter (speakers "A", "n", "n", ...), a float temperature and a dict of VAD settings failed
    with a TypeError and an AttributeError."""
    options = TranscribeOptions(
        temperature=0.2, languages="en, de", diarize=True, speaker_names="Ann,Bob", vad_options={"threshold": 0.3}
    )
    options.check()
    assert options.temperature == (0.2,) and options.languages == ("en", "de")
    assert options.speaker_names == ("Ann", "Bob") and options.vad_options == VadOptions(threshold=0.3)
    assert TranscribeOptions(languages=["en", "fr"]) == TranscribeOptions(languages=("en", "fr"))
    from_numpy = TranscribeOptions(beam_size=np.int64(3), patience=np.float32(1.0), temperature=[np.float64(0.0)])
    from_numpy.check()
    assert json.loads(json.dumps(from_numpy.record()))["beam_size"] == 3  # a result's json records its options
    with pytest.raises(UsageError, match=r"vad_options takes threshold, .*not \['thresh'\]"):
        TranscribeOptions(vad_options={"thresh": 0.3})

    # known speakers: one, or a dict of name to sample; anything else a UsageError, not an AttributeError
    ann = KnownSpeaker("Ann", b"sample")
    assert TranscribeOptions(diarize=True, known_speakers=ann).known_speakers == (ann,)
    assert TranscribeOptions(diarize=True, known_speakers={"Ann": b"sample"}).known_speakers == (ann,)
    for wrong, said in (
        ({"speaker_names": ("Ann", 5)}, "speaker_names must be text, not int"),
        ({"known_speakers": [("Ann", b"sample")]}, r"known_speakers holds KnownSpeaker\(name, sample\), not tuple"),
        ({"known_speakers": [KnownSpeaker("Ann", "ann.wav")]}, r"sample is its audio's bytes .*, not str"),
    ):
        with pytest.raises(UsageError, match=said):
            TranscribeOptions(diarize=True, **wrong).check()


def test_a_language_by_name_is_taken_by_the_plain_calls(executor):
    assert "Dashwood" in executor.transcribe_file(str(SAMPLE), language="English")
    assert "Dashwood" in executor.transcribe_file(str(SAMPLE), language="en-GB")


def test_an_input_of_a_few_samples_is_read_not_an_engine_failure(executor):
    """A damaged file can decode to a few milliseconds (the server's fuzzing found 63 samples of a
    WAV): the STFT's padding needs more than 200, and the engine failed the input with 503."""
    loud = np.random.default_rng(0).uniform(-1, 1, 63).astype(np.float32)
    for vad in (True, False):
        assert isinstance(executor.transcribe(loud, TranscribeOptions(vad=vad)).text, str)


def test_a_language_tag_with_a_region_or_script_is_its_language():
    """Tags as browsers and locales write them; Whisper has no regional variants."""
    from ferrum_cli.languages import language_code

    assert [language_code(t) for t in ("pt-BR", "en_US", "zh-Hans", "DE-de", "Chinese")] == [
        "pt",
        "en",
        "zh",
        "de",
        "zh",
    ]
    with pytest.raises(UsageError, match="unknown language 'xx-YY'"):
        language_code("xx-YY")


@needs_corpus
def test_rich_result_has_segments_language_and_duration(executor):
    result = executor.transcribe(corpus(JFK), TranscribeOptions())
    assert result.language == "en" and result.language_probability > 0.5
    assert result.duration == pytest.approx(11.0, abs=0.1)
    assert result.segments and all(s.start < s.end <= result.duration for s in result.segments)
    first = result.segments[0]
    assert first.tokens and first.avg_logprob < 0 and 0 <= first.no_speech_prob <= 1 and first.compression_ratio > 0
    assert result.options["language"] == "en"
    import srt

    from ferrum_cli import render

    cues = list(srt.parse(render(result, "srt")))  # what -f srt writes, for a library caller
    assert [c.content for c in cues] == [s.text.strip() for s in result.segments]
    with pytest.raises(UsageError, match="unknown output format 'docx'; choose txt, srt"):
        render(result, "docx")


@needs_corpus
@pytest.mark.parametrize("sequential", [False, True], ids=["batched", "sequential"])
def test_sampling_is_seeded_so_the_same_input_gives_the_same_text(executor, sequential):
    """At temperature 1 the text is a draw. The draw is seeded, in both engines, and the
    caller's own random state is left as it was."""
    import torch

    options = TranscribeOptions(language="en", temperature=(1.0,), sequential=sequential)
    torch.manual_seed(123)
    untouched = torch.rand(3)
    torch.manual_seed(123)
    first = executor.transcribe(corpus(JFK), options).text
    assert torch.equal(torch.rand(3), untouched)
    assert executor.transcribe(corpus(JFK), options).text == first


def test_info_capabilities_status(executor):
    info = executor.info()
    assert info["name"] == "base" and info["multilingual"] is True
    assert info["dims"]["n_audio_layer"] == 6 and info["vocabulary"] == 51865
    assert info["parameters"] > 70_000_000 and len(info["sha256"]) == 64
    assert info["alignment_heads_known"] is True and info["device"] == "cpu"
    caps = executor.capabilities()
    assert caps["tasks"] == ["transcribe", "translate"] and "cpu" in caps["devices"]
    assert caps["memory"]["parameter_bytes"] > 0 and caps["memory"]["activation_bytes_per_window"] > 0
    status = executor.status()
    assert status["state"] == "ready" and status["memory"]["rss_bytes"] > 0


def test_warmup_runs_a_forward_pass_and_is_counted(executor):
    before = executor.status()["counters"]["windows_encoded"]
    assert executor.warmup() > 0
    assert executor.status()["counters"]["windows_encoded"] > before


def test_shutdown_makes_later_calls_fail_clearly():
    from ferrum_cli import WhisperModelExecutor

    ex = WhisperModelExecutor.from_path("base", device="cpu")
    ex.shutdown()
    assert ex.status()["state"] == "shutdown"
    with pytest.raises(ExecutorStateError, match="shut down"):
        ex.transcribe_bytes(b"RIFF")


@needs_corpus
def test_sequential_mode_matches_openai_whisper_on_english_clips(executor):
    """Same weights, same options: our sequential engine gives openai-whisper's own text, on every
    other English clip of the manifest (all 12 took 34 s of the suite, on the same code path)."""
    import torch
    import whisper
    from whisper.model import Whisper

    from ferrum_cli.audio.ffmpeg import decode_file
    from ferrum_cli.weights.resolve import resolve

    weights = resolve("base")
    reference = Whisper(whisper.model.ModelDimensions(**weights.dims))
    reference.load_state_dict({k: v.float() for k, v in weights.state_dict.items()}, strict=False)
    reference.eval()
    rows = english_rows()
    assert len(rows) == 12
    options = TranscribeOptions(language="en", sequential=True, vad=False)
    for row in rows[::2]:
        ours = executor.transcribe(row["path"], options).text
        with torch.no_grad():
            theirs = reference.transcribe(decode_file(row["path"]).samples, language="en", fp16=False)["text"]
        assert words(ours) == words(theirs), row["file"]


def test_cached_non_speech_tokens_equal_openai_whispers():
    from whisper.tokenizer import Tokenizer, get_encoding

    from ferrum_cli.engine.tokenizer import get_tokenizer

    ours = get_tokenizer(True, num_languages=99, language="en", task="transcribe").non_speech_tokens
    fresh = Tokenizer(get_encoding("multilingual", 99), num_languages=99, language="en", task="transcribe")
    assert ours == fresh.non_speech_tokens


def test_voice_activity_detection_leaves_torch_on_every_core():
    """silero_vad's import sets torch to one thread for the whole process; on two cores that
    halved the speed of the encoder and the decoder."""
    script = (
        "import numpy as np, torch; torch.set_num_threads(2); "
        "from ferrum_cli.audio.vad import speech_regions; speech_regions(np.zeros(16000, np.float32)); "
        "print(torch.get_num_threads())"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "2"


def test_numba_is_imported_only_when_the_sequential_engine_aligns_words():
    """openai-whisper imports numba (a tenth of a cold start) only for its word timestamps' DTW: a
    plain transcription does without it, and so do the batched engine's word times (dtw_batch);
    the sequential engine's word timestamps still get numba's compiled DTW."""
    script = textwrap.dedent(
        f"""
        import sys
        from ferrum_cli import WhisperModelExecutor
        from ferrum_cli.options import TranscribeOptions, VadOptions
        executor = WhisperModelExecutor.from_path("base", device="cpu")
        executor.transcribe({str(SAMPLE)!r}, TranscribeOptions(language="en"))
        result = executor.transcribe({str(SAMPLE)!r}, TranscribeOptions(language="en", word_timestamps=True))
        print("numba" in sys.modules, sum(len(segment.words) for segment in result.segments))
        options = TranscribeOptions(language="en", word_timestamps=True, sequential=True)
        result = executor.transcribe({str(SAMPLE)!r}, options)
        print(sum(len(segment.words) for segment in result.segments))
        import whisper.timing
        print(type(whisper.timing.dtw_cpu).__name__, type(whisper.timing.backtrace).__name__)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    batched, sequential_words, compiled = proc.stdout.splitlines()
    imported, batched_words = batched.split()
    assert imported == "False" and int(batched_words) >= 15
    assert int(sequential_words) >= 15
    assert compiled == "CPUDispatcher CPUDispatcher"


@needs_corpus
def test_many_inputs_each_get_their_own_text_in_their_place(executor, tmp_path):
    """Short inputs are read whole and their VAD runs in one batch; a long input, a broken one
    and silence in between keep their places, and each input gets its own words."""
    rows = english_rows()[:5]
    clips = [r["path"] for r in rows]
    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk")
    silence = tmp_path / "silence.wav"
    silence.write_bytes(wav_bytes(np.zeros(3 * SAMPLE_RATE, np.float32)))
    long = tmp_path / "long.wav"  # over 30 s: planned as it streams
    long.write_bytes(wav_bytes(np.concatenate([decode_file(c).samples for c in clips] * 2)))
    assert decode_file(long).samples.size > 40 * SAMPLE_RATE
    inputs = [clips[0], clips[1], str(broken), clips[2], str(long), clips[3], str(silence), clips[4]]
    references = {c: r["reference_transcript"] for c, r in zip(clips, rows)}
    references[str(long)] = " ".join([r["reference_transcript"] for r in rows] * 2)
    together = list(executor.transcribe_many([(i, i) for i in inputs], TranscribeOptions(language="en")))
    assert [key for key, _ in together] == inputs
    assert isinstance(together[2][1], AudioDecodeError)
    assert together[6][1].text == ""
    for key, result in together:
        if key in references:
            expected, got = words(references[key]).split(), set(words(result.text).split())
            assert sum(w in got for w in expected) >= 0.5 * len(expected), (key, result.text)  # not another input's


@needs_corpus
def test_many_inputs_may_be_sources_alone_and_a_failing_iterable_keeps_what_came_before(executor):
    """`transcribe_many(paths)`: a source that is not a (key, source) pair is its own key (it was
    `ValueError: too many values to unpack`). Items that raise part way (a generator over a
    folder whose disk goes away) hand back the inputs they gave, then raise: those were lost."""
    clip = str(corpus(JFK))
    options = TranscribeOptions(language="en")
    results = list(executor.transcribe_many([clip, ("named", clip), 5], options))
    assert [key for key, _ in results] == [clip, "named", 5]
    assert all("ask not what your country" in words(r.text) for _, r in results[:2])
    assert isinstance(results[2][1], InputError)

    def listing():
        yield "first", clip
        yield "second", clip
        raise OSError("the disk went away")

    handed_back = []
    with pytest.raises(OSError, match="the disk went away"):
        for key, result in executor.transcribe_many(listing(), options):
            handed_back.append((key, "ask not what your country" in words(result.text)))
    assert handed_back == [("first", True), ("second", True)]


@needs_corpus
def test_which_short_inputs_share_a_window_does_not_depend_on_how_fast_they_are_listed(executor):
    """Short inputs of one language are read side by side in 30 s windows, and a neighbour's
    text is context: "1-0-0-0-1 902-1-0" packed, "1,001 90210" alone. The engine took whatever the
    caller had listed when it opened them, so a listing slower than the engine (a folder on a
    network disk) gave other text than a fast one. A row of short inputs now waits for the
    caller's next ones, or for the end of its list."""
    clips = [row["path"] for row in english_rows()]
    options = TranscribeOptions(language="en")

    def listed_slowly():
        for clip in clips:
            yield clip
            time.sleep(0.2)

    at_once = {key: result.text for key, result in executor.transcribe_many(clips, options)}
    slowly = {key: result.text for key, result in executor.transcribe_many(listed_slowly(), options)}
    assert slowly == at_once


@needs_corpus
def test_a_list_that_pauses_lets_the_short_inputs_before_it_go_on(executor, monkeypatch):
    """A short input waits for the caller's next ones to share its window, but not for a list
    that pauses (a folder being watched, a slow disk): past LISTING_PAUSE the inputs listed so far
    are decoded while the caller waits for its next."""
    from ferrum_cli.engine.batched import BatchedEngine
    from ferrum_cli.engine.service import LISTING_PAUSE

    decoded_at, decode = [], BatchedEngine._decode_next_batch

    def timed(engine):
        decoded_at.append(time.monotonic())
        return decode(engine)

    monkeypatch.setattr(BatchedEngine, "_decode_next_batch", timed)
    paused = []

    def watched():
        yield "first", str(corpus(JFK))
        paused.append(time.monotonic())
        time.sleep(LISTING_PAUSE + 2.0)
        paused.append(time.monotonic())
        yield "second", str(corpus(JFK))

    results = dict(executor.transcribe_many(watched(), TranscribeOptions(language="en")))
    assert all("ask not what your country" in words(results[key].text) for key in ("first", "second"))
    assert any(paused[0] < at < paused[1] for at in decoded_at), (paused, decoded_at)


def test_vad_of_many_clips_at_once_finds_what_each_alone_finds():
    from ferrum_cli.audio.vad import speech_regions, speech_regions_and_core_many
    from ferrum_cli.options import VadOptions

    clips = [decode_file(r["path"]).samples for r in corpus_rows()[:8]] or pytest.skip("no corpus")
    clips.append(np.zeros(0, np.float32))
    alone = [(speech_regions(c), speech_regions(c, VadOptions(speech_pad_ms=0))) for c in clips]
    assert speech_regions_and_core_many(clips) == alone


@needs_corpus
def test_the_engine_service_gives_each_ticket_what_transcribe_gives(executor):
    """serve(): tickets from another thread share the engine's batches, each with its own language,
    and get the text transcribe() gives alone; the executor is `serving` until the service closes."""
    import threading

    from ferrum_cli.engine.service import Ticket

    clips = [str(corpus(JFK)), str(corpus("en_timit_LDC93S1.wav")), str(corpus("de_picovoice_test_de.wav"))]
    alone = {c: executor.transcribe(c, TranscribeOptions()).text for c in clips}
    results, segments, finished = {}, {}, threading.Event()

    def ticket(clip: str) -> Ticket:
        def done(result) -> None:
            results[clip] = result
            if len(results) == len(clips):
                finished.set()

        return Ticket(
            lambda: iter(decode_file(clip)), TranscribeOptions(), lambda s, lang: segments.setdefault(clip, lang), done
        )

    service = executor.serve()
    try:
        assert executor.status()["state"] == "serving"
        for clip in clips:
            service.submit(ticket(clip))
        assert finished.wait(300)
    finally:
        service.close()
    assert executor.status()["state"] == "ready"
    assert {c: r.text for c, r in results.items()} == alone
    assert segments[clips[2]] == "de" and segments[clips[0]] == "en"


@needs_corpus
def test_many_inputs_call_back_on_the_callers_thread_input_by_input(executor):
    """transcribe_many runs the engine service's thread, and brings what it tells to the caller:
    every callback on the caller's thread, each input's segments in time order, the inputs one
    after another (a batch of files finishes file by file), results in input order."""
    import threading

    clips = [str(corpus(JFK)), str(corpus("en_timit_LDC93S1.wav")), str(corpus("en_harvard_speechbrain_example1.wav"))]
    told = []

    def on_segment(key, segment) -> None:
        told.append(("segment", key, segment.start, threading.current_thread()))

    def on_progress(key, seconds) -> None:
        told.append(("progress", key, seconds, threading.current_thread()))

    results = list(executor.transcribe_many([(c, c) for c in clips], TranscribeOptions(), on_segment, on_progress))
    assert [key for key, _ in results] == clips
    assert {thread for *_, thread in told} == {threading.main_thread()}
    segments = [(key, start) for kind, key, start, _ in told if kind == "segment"]
    assert [key for key, _ in segments] == sorted((key for key, _ in segments), key=clips.index)
    for clip, result in results:
        assert [start for key, start in segments if key == clip] == [s.start for s in result.segments]
    progress = [(key, seconds) for kind, key, seconds, _ in told if kind == "progress"]
    assert progress and all(0 < seconds <= dict(results)[key].duration for key, seconds in progress)


@needs_corpus
def test_samples_in_memory_read_as_their_file(executor):
    path = corpus(JFK)
    assert executor.transcribe(decode_file(path).samples).text == executor.transcribe(path).text


@needs_corpus
def test_samples_as_callers_hold_them_read_as_their_file_and_others_fail_alone(executor):
    """int16 as scipy.io.wavfile gives it, those values cast to float, a column, torch tensors as
    openai-whisper takes them and torchaudio.load gives them (a channel's row): the file's text,
    where int16 read as floats was thousands of times full scale and gave other words. Several
    channels, NaN, a list: that input's InputError, and the next input goes on."""
    import torch

    path = corpus(JFK)
    text = executor.transcribe(path).text
    samples = decode_file(path).samples
    pcm = np.round(samples * 32767).astype(np.int16)
    tensors = (torch.from_numpy(samples.copy()), torch.from_numpy(samples.copy())[None], torch.from_numpy(pcm))
    for held in (pcm, pcm.astype(np.float32), samples[:, None], samples.astype(np.float64), *tensors):
        assert words(executor.transcribe(held).text) == words(text), (held.dtype, held.shape)
    assert executor.detect_language(pcm)[0] == "en"  # what transcribe takes, detect_language takes
    assert executor.detect_language(tensors[0])[0] == "en"
    with pytest.raises(InputError, match="not list"):
        executor.detect_language(samples.tolist())

    bad = {
        "stereo": (np.stack([samples, samples], axis=1), "must be one channel"),
        "nan": (np.where(np.arange(samples.size) == 99, np.nan, samples), "must be finite"),
        "list": (samples[:16000].tolist(), "not list"),
    }
    items = [(name, audio) for name, (audio, _) in bad.items()] + [("file", str(path))]
    results = dict(executor.transcribe_many(items))
    for name, (_, reason) in bad.items():
        assert isinstance(results[name], InputError) and reason in results[name].message, results[name]
    assert results["file"].text == text


@needs_corpus
@pytest.mark.skipif(sys.platform != "linux", reason="fork is multiprocessing's default on Linux")
def test_an_executor_that_has_worked_transcribes_in_processes_forked_from_it():
    """A model loaded once and shared by forking (multiprocessing.Pool's default on Linux): the
    children transcribe, where before they waited for ever on the VAD's pool of threads, which a
    forked process inherits without its threads."""
    script = textwrap.dedent(
        f"""
        import multiprocessing
        from ferrum_cli import WhisperModelExecutor

        executor = WhisperModelExecutor.from_path("base")
        print(executor.transcribe_file({str(corpus(JFK))!r}, language="en"))

        def child(path):
            return executor.transcribe_file(path, language="en")

        with multiprocessing.get_context("fork").Pool(2) as pool:
            for text in pool.map_async(child, [{str(corpus(JFK))!r}] * 2).get(timeout=120):
                print(text)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    parent, *children = proc.stdout.splitlines()
    assert children == [parent, parent] and "ask not what your country" in words(parent)


@needs_corpus
@pytest.mark.parametrize("ending", ["right after a call", "while a daemon thread transcribes"])
def test_a_script_that_ends_while_ferrum_works_exits_cleanly(ending):
    """A script that ends while the decoder's weights are still being packed (right after a short
    call), or while a thread of its own is inside transcribe: torch, torn down under a thread in
    one of its ops, aborted the process ("terminate called without an active exception", 134)."""
    script = textwrap.dedent(
        f"""
        import threading, time
        import numpy as np
        from ferrum_cli import WhisperModelExecutor
        from ferrum_cli.audio.ffmpeg import decode_file

        executor = WhisperModelExecutor.from_path("tiny.en")
        if {ending!r} == "right after a call":
            print(repr(executor.transcribe(np.zeros(16000, np.float32)).text))
        else:  # 5.5 minutes, the same words over: Whisper's loops, and fallbacks, make long batches
            executor.transcribe({str(corpus(JFK))!r})
            over_and_over = np.tile(decode_file({str(corpus(JFK))!r}).samples, 30)
            threading.Thread(target=executor.transcribe, args=(over_and_over,), daemon=True).start()
            time.sleep(2)
        print("ending")
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "terminate called" not in proc.stderr, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.splitlines()[-1] == "ending"


@needs_corpus
def test_a_call_left_early_stops_at_its_decodings_next_token_and_the_executor_goes_on():
    """Ctrl-C in a notebook, or any signal whose handler raises, while the engine decodes a batch:
    the call ends once the decoding in hand has taken its next token. It waited for the whole
    batch (the CLI's Ctrl-C took 1.8-3.5 s on an hour's file). The model is left as it was."""
    import signal

    from ferrum_cli import TranscribeOptions, WhisperModelExecutor
    from ferrum_cli.audio.ffmpeg import decode_file

    class Interrupted(Exception):
        pass

    def interrupted(signum, frame):
        raise Interrupted

    own = WhisperModelExecutor.from_path("tiny.en")
    jfk = decode_file(corpus(JFK)).samples
    steps = []  # a decoding step each: the decoder's last layer norm runs once a step

    def step(*_):
        steps.append(1)
        if len(steps) == 30:  # well inside the first batch: two windows of speech, hundreds of steps
            os.kill(os.getpid(), signal.SIGUSR1)

    own._model.decoder.ln.register_forward_hook(step)
    previous = signal.signal(signal.SIGUSR1, interrupted)
    options = TranscribeOptions(language="en", batch_size=2)
    try:
        with pytest.raises(Interrupted):
            for _ in own.transcribe_many([("over and over", np.tile(jfk, 30))], options):
                pass
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert len(steps) <= 33, f"{len(steps) - 30} decoding steps after the signal"
    assert "ask not what your country can do for you" in words(own.transcribe(jfk, options).text)
    own.shutdown()


@needs_corpus
def test_a_call_from_inside_a_call_on_the_same_thread_is_refused_not_a_hang():
    """A callback, or the body of a loop over transcribe_many, that calls the executor again would
    wait for the call it is inside of for ever: it is an ExecutorStateError, and the executor goes
    on. (An executor of its own, on a thread of its own: a regression hangs only them.)"""
    import threading

    from ferrum_cli import WhisperModelExecutor

    own = WhisperModelExecutor.from_path("tiny.en")
    clip = str(corpus(JFK))
    refused, texts = [], []

    def calls_from_inside():
        with pytest.raises(ExecutorStateError, match="already transcribing on this thread") as inside_callback:
            own.transcribe(clip, on_segment=lambda segment: own.transcribe(clip))
        with pytest.raises(ExecutorStateError, match="already transcribing on this thread") as inside_loop:
            for _ in own.transcribe_many([(0, clip), (1, clip)]):
                own.detect_language(clip)
        refused.extend((inside_callback, inside_loop))
        texts.append(own.transcribe(clip).text)

    caller = threading.Thread(target=calls_from_inside, daemon=True)
    caller.start()
    caller.join(timeout=180)
    assert not caller.is_alive(), "a call from inside a call waits for itself"
    assert len(refused) == 2 and "ask not" in words(texts[0])


@needs_corpus
def test_while_its_service_runs_the_executors_own_calls_are_refused():
    """serve()'s EngineService owns the model until it is closed: a transcribe, a warm-up or a
    second service meanwhile is an ExecutorStateError (before, a transcribe ran a second engine
    on the model beside it and left the executor "ready" while the service still ran)."""
    from ferrum_cli import Ticket, WhisperModelExecutor, audio_opener

    own = WhisperModelExecutor.from_path("tiny.en")
    clip = str(corpus(JFK))
    service = own.serve()
    try:
        for call in (lambda: own.transcribe(clip), own.warmup, own.serve, lambda: own.detect_language(clip)):
            with pytest.raises(ExecutorStateError, match="the executor is serving"):
                call()
        assert own.status()["state"] == "serving"
        done = []
        service.submit(Ticket(audio_opener(clip), TranscribeOptions(), lambda *_: None, done.append))
        while not done:
            time.sleep(0.05)
        assert "ask not" in words(done[0].text)
    finally:
        service.close()
    assert own.status()["state"] == "ready"
    assert "ask not" in words(own.transcribe(clip).text)


@needs_corpus
def test_leaving_many_inputs_early_stops_the_rest_and_frees_the_executor(executor):
    """A caller that stops reading (an error, Ctrl-C) cancels the inputs not yet handed back; the
    engine's thread ends and the executor takes the next call."""
    import threading

    clip = str(corpus(JFK))
    for _ in executor.transcribe_many([(i, clip) for i in range(12)], TranscribeOptions(batch_size=2)):
        break
    assert executor.status()["state"] == "ready"
    assert not [t for t in threading.enumerate() if t.name == "ferrum-engine"]
    assert "ask not" in words(executor.transcribe(clip).text)
