"""Window planning on real speech: where long audio is cut, and how full the windows are."""

from __future__ import annotations

import numpy as np

from ferrum_cli.audio.constants import SAMPLE_RATE, WINDOW_SAMPLES
from ferrum_cli.audio.ffmpeg import decode_file
from ferrum_cli.audio.windows import plan_whole, plan_windows
from ferrum_cli.options import VadOptions

from .helpers import JFK, corpus, needs_corpus


@needs_corpus
def test_of_equally_deep_pauses_the_last_is_cut_so_windows_come_out_full():
    """JFK (11 s) ten times over with a second of silence between: every pause is as deep as the
    next, and cutting at the first one after 10 s would give 12 s windows."""
    speech = decode_file(corpus(JFK)).samples
    gap = np.zeros(SAMPLE_RATE, np.float32)
    period = len(speech) + len(gap)
    audio = np.concatenate([speech, gap] * 10)
    windows = list(plan_windows([audio], True, VadOptions()))
    lengths = [len(samples) for _, samples in windows]
    assert all(n <= WINDOW_SAMPLES for n in lengths)
    assert all(n >= 20 * SAMPLE_RATE for n in lengths[:-1]), [n / SAMPLE_RATE for n in lengths]
    for offset, _ in windows[1:]:  # every cut falls in a pause
        assert int(offset * SAMPLE_RATE) % period >= len(speech) - SAMPLE_RATE // 10


@needs_corpus
def test_an_input_that_fits_one_window_is_read_whole_as_openai_whisper_reads_it():
    """Trimming the silence of an input under 30 s saves no encoder work, and the speech read
    from its first sample matches openai-whisper's reading; but where the speech begins more
    than 2 s in, the window begins with it, as a long input's does."""
    speech = decode_file(corpus(JFK)).samples[: 5 * SAMPLE_RATE]
    quiet = np.zeros(2 * SAMPLE_RATE, np.float32)
    apart = np.zeros(12 * SAMPLE_RATE, np.float32)  # more than the 5 s that joins two regions
    short = np.concatenate([quiet, speech, apart, speech, quiet])
    longer = np.concatenate([quiet, speech, apart, speech, apart])
    silent = np.zeros(20 * SAMPLE_RATE, np.float32)
    late = np.concatenate([quiet, quiet, quiet, speech, quiet])
    planned = plan_whole([short, longer, silent, late], True, VadOptions())
    (whole, core, _), (split, _, _), (nothing, _, _), (from_speech, late_core, _) = planned
    assert [(offset, len(samples)) for offset, samples in whole] == [(0.0, len(short))]
    ((offset, samples),) = from_speech  # from the padded speech (0.4 s before it) to the end
    assert 5.5 <= offset <= late_core[0][0] / SAMPLE_RATE and offset * SAMPLE_RATE + len(samples) == len(late)
    assert core[0][0] >= 1.5 * SAMPLE_RATE  # the speech regions stay where the speech is
    assert len(longer) > WINDOW_SAMPLES and len(split) == 2 and split[0][0] > 1.0  # over 30 s: windows of speech
    assert nothing == []  # no speech, no window
    ((per_stretch, _, _),) = plan_whole([short], True, VadOptions(), merge=False)
    assert len(per_stretch) == 2  # multilingual mode reads each stretch of speech apart


@needs_corpus
def test_planning_records_the_speech_that_tails_are_checked_against():
    """The engine asks whether the rest of a window holds speech from the regions VAD found
    while planning, instead of running VAD again: those regions must be the speech itself."""
    from ferrum_cli.audio.vad import speech_regions, speech_within

    speech = decode_file(corpus(JFK)).samples
    silence = np.zeros(3 * SAMPLE_RATE, np.float32)
    audio = np.concatenate([silence, speech, silence])
    found: list[tuple[int, int]] = []
    list(plan_windows([audio], True, VadOptions(), speech=found))
    assert found == speech_regions(audio, VadOptions(speech_pad_ms=0))
    assert speech_within(found, 0, 3 * SAMPLE_RATE) == 0  # the leading silence
    assert speech_within(found, len(audio) - 2 * SAMPLE_RATE, len(audio)) == 0
    assert speech_within(found, 3 * SAMPLE_RATE, 3 * SAMPLE_RATE + len(speech)) >= 9 * SAMPLE_RATE


def test_speech_within_counts_overlapping_regions_once():
    from ferrum_cli.audio.vad import speech_within

    overlapping = [(0, 100), (50, 150), (300, 400)]  # blocks are planned with overlap
    assert speech_within(overlapping, 0, 1000) == 250
    assert speech_within(overlapping, 120, 350) == 30 + 50
    assert speech_within([], 0, 1000) == 0


def test_speech_after_each_timestamp_is_what_speech_within_counts_from_there():
    from ferrum_cli.audio.vad import speech_after, speech_within

    overlapping = [(0, 100), (50, 150), (300, 400)]
    for start, end in ((0, 1000), (120, 350), (0, 95), (500, 500)):
        after = speech_after(overlapping, start, end, 20)
        assert len(after) == -(-(end - start) // 20)
        assert after.tolist() == [speech_within(overlapping, t, end) for t in range(start, end, 20)]


def test_speech_regions_are_forgotten_in_place_once_no_window_can_ask_for_them():
    """An input's regions would grow with its length; the planner keeps adding to the same list."""
    from ferrum_cli.engine.batched import Source

    file = Source("input")
    planner_view = file.speech
    file.speech.extend([(0, 100), (90, 300), (500, 800)])
    file.forget_speech_before(250)
    assert planner_view is file.speech
    assert file.speech == [(90, 300), (500, 800)]


def test_a_tail_that_only_reads_the_last_words_again_is_recognised():
    from ferrum_cli.engine.segments import repeats_the_end

    before = " Ask what you can do for your country"
    assert repeats_the_end(" country.", before)
    assert repeats_the_end(" your Country!", before)
    assert not repeats_the_end(" 1455.", " the Gutenberg or 42 line Bible of about")
    assert not repeats_the_end(" country, and the world.", before)  # it goes on: new words
    assert not repeats_the_end(" can do for your country", before)  # more than the last few words
    assert not repeats_the_end(" ...", before)


@needs_corpus
def test_the_vad_read_on_several_threads_finds_the_speech_one_thread_finds_and_keeps_torchs_thread_count():
    """A file's VAD shares its streams out among threads, each with a Silero of its own: the
    speech found is the same, and torch's thread count, which threads started later begin
    with, is what it was."""
    import threading

    import torch

    from ferrum_cli.audio.vad import regions_from_probabilities, speech_probabilities_many

    clips = [decode_file(corpus(name)).samples for name in (JFK, "en_harvard_speechbrain_example1.wav")]
    audio = np.concatenate([clips[0], np.zeros(2 * SAMPLE_RATE, np.float32), clips[1]] * 4)  # 100 s
    inputs = [audio, *clips]
    before = torch.get_num_threads()
    alone = speech_probabilities_many(inputs, readers=1)
    shared = speech_probabilities_many(inputs, readers=3)
    for samples, one, three in zip(inputs, alone, shared):
        assert np.abs(one - three).max() < 1e-5
        regions = regions_from_probabilities(one.tolist(), len(samples), VadOptions())
        assert regions and regions == regions_from_probabilities(three.tolist(), len(samples), VadOptions())
    assert torch.get_num_threads() == before
    started_later: list[int] = []
    thread = threading.Thread(target=lambda: started_later.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    assert started_later == [before]


@needs_corpus
def test_digital_silence_costs_the_vad_nothing_and_the_speech_around_it_is_found_as_before(monkeypatch):
    """Streams of the VAD that read only zeros (a muted microphone, a padded recording) are not
    stepped through Silero and read as no speech; every other stream's probabilities, and so the
    speech found, are those of a pass that steps them all (which reads the zeros as under 0.01)."""
    import torch

    from ferrum_cli.audio import vad

    speech = decode_file(corpus(JFK)).samples
    silence = np.zeros(60 * SAMPLE_RATE, np.float32)
    audio = np.concatenate([silence, speech, silence, speech * 0.01, silence])
    stepped: list[int] = []
    step = vad._step_streams

    def counted(reader, frames, index, *rest):
        stepped.append(len(index))
        step(reader, frames, index, *rest)

    monkeypatch.setattr(vad, "_step_streams", counted)
    skipping = vad.speech_probabilities(audio)
    skipping_rows = sum(stepped)
    stepped.clear()
    monkeypatch.setattr(vad, "_streams_with_sound", lambda frames, index: torch.arange(index.shape[0]))
    every = vad.speech_probabilities(audio)
    assert 0 < skipping_rows < sum(stepped) / 4, (skipping_rows, sum(stepped))
    skipped = skipping == 0.0
    assert skipped.mean() > 0.75 and every[skipped].max() < 0.01
    assert np.abs(every[~skipped] - skipping[~skipped]).max() < 1e-4
    regions = vad.regions_from_probabilities(skipping.tolist(), len(audio), VadOptions())
    assert regions == vad.regions_from_probabilities(every.tolist(), len(audio), VadOptions())
    assert len(regions) == 2 and regions[0][0] >= len(silence) - SAMPLE_RATE // 2


@needs_corpus
def test_speech_that_begins_seconds_into_a_short_input_is_dated_where_it_begins_and_read_as_without(executor):
    """1.5 s and 6 s of silence before each English clip under 24 s. Read from its first sample,
    Whisper dated every clip's first words to 0.0, and after 6 s read some sentences twice. Past
    2 s the window now begins with the speech, and a segment without word times that starts in
    silence starts where the speech does; the words read as well as without the silence."""
    from ferrum_cli.options import TranscribeOptions

    from .helpers import english_rows, errors_against

    rows = english_rows()
    rows = [r for r in rows if float(r["duration_seconds"]) < 24]
    clips = {r["file"]: decode_file(r["path"]).samples for r in rows}
    options = TranscribeOptions(language="en")
    results = {}
    for lead in (0.0, 1.5, 6.0):
        silence = np.zeros(int(lead * SAMPLE_RATE), np.float32)
        items = [(name, np.concatenate([silence, samples])) for name, samples in clips.items()]
        results[lead] = dict(executor.transcribe_many(items, options))
        for name, result in results[lead].items():
            assert result.segments and result.segments[0].start >= lead - 0.05, (lead, name, result.segments[:1])
    errors = {
        lead: sum(errors_against(r["reference_transcript"], texts[r["file"]].text, "en") for r in rows)
        for lead, texts in results.items()
    }
    assert errors[6.0] <= errors[0.0] + 2, errors  # TIMIT's clip reads differently from any start


@needs_corpus
def test_openai_whispers_loop_too_starts_where_speech_begins_seconds_in(executor):
    """openai-whisper's own loop (here with beam search) read these from 0.0 as well: it now
    starts at the speech when it begins past 2 s, and a segment that starts in silence starts
    where the speech does."""
    from ferrum_cli.options import TranscribeOptions

    from .helpers import corpus_rows

    rows = [r for r in corpus_rows() if r["file"].startswith(("en_harvard", "en_librispeech_4507"))]
    options = TranscribeOptions(language="en", beam_size=2, sequential=True)
    for lead in (1.5, 6.0):
        silence = np.zeros(int(lead * SAMPLE_RATE), np.float32)
        items = [(r["file"], np.concatenate([silence, decode_file(r["path"]).samples])) for r in rows]
        for name, result in executor.transcribe_many(items, options):
            assert result.options["engine"] == "sequential"
            assert result.segments and result.segments[0].start >= lead - 0.05, (lead, name, result.segments)
            assert len(result.segments) == 1, (lead, name, result.segments)  # each sentence read once


@needs_corpus
def test_a_long_input_planned_in_blocks_keeps_vad_frames_for_all_of_it():
    """Nine minutes of meetings read in four-minute blocks: every block starts on a frame of the
    input, so the planner's VAD frames cover all of it, and diarization, reading them with its
    own thresholds, finds the speech its own pass over the audio finds."""
    from ferrum_cli.audio.constants import VAD_FRAME
    from ferrum_cli.audio.vad import SpeechFrames, regions_from_probabilities, speech_regions_blockwise
    from ferrum_cli.post.diarizer import SPEECH

    meetings = [decode_file(corpus(f"diarization/ami_{name}.wav")).samples for name in ("trn00", "dev01", "tst00")]
    audio = np.concatenate(meetings * 6)  # 9 minutes
    frames = SpeechFrames()
    stream = (audio[at : at + 7 * SAMPLE_RATE + 123] for at in range(0, len(audio), 7 * SAMPLE_RATE + 123))
    list(plan_windows(stream, True, VadOptions(), frames=frames))
    probabilities = frames.covering(len(audio))
    assert probabilities is not None and len(probabilities) == -(-len(audio) // VAD_FRAME)

    def seconds(regions):
        return sum(b - a for a, b in regions) / SAMPLE_RATE

    engines = seconds(regions_from_probabilities(probabilities.tolist(), len(audio), SPEECH, padded=True))
    own = seconds(speech_regions_blockwise(audio, SPEECH))
    assert abs(engines - own) <= 0.03 * own, (engines, own)

    missing = SpeechFrames()
    missing.add(0, probabilities[:100])
    assert missing.covering(len(audio)) is None  # a reader then runs VAD itself
    between = SpeechFrames()
    between.add(0, probabilities[:100])
    between.add(50 * VAD_FRAME + 7, probabilities[50:])
    assert between.covering(len(audio)) is None
