"""`ferrum serve`: the real server in a subprocess on a loopback port, spoken to with the real
`openai` client and with plain HTTP."""

from __future__ import annotations

import json
import math
import signal
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from ferrum_cli.audio.ffmpeg import find_ffmpeg

from .helpers import (
    FERRUM,
    JFK,
    SAMPLE,
    RunningServer,
    clip_text,
    corpus,
    corpus_rows,
    errors_against,
    free_port,
    joined_clips,
    needs_corpus,
    run_ferrum,
    wav_bytes,
    words,
)

openai = pytest.importorskip("openai", reason="the openai client is a dev dependency (make install)")
KEY = "test-key-123"


@pytest.fixture(scope="module")
def server():
    running = RunningServer("--api-key", KEY)
    yield running
    running.stop_cleanly()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def cli_texts(tmp_path_factory) -> dict[str, str]:
    """The CLI's text for the 16 corpus clips the concurrency test sends: what the server must match."""
    rows = [r for r in corpus_rows()][:16]
    if not rows:
        pytest.skip("the shared corpus is absent; CI has it")
    out = tmp_path_factory.mktemp("cli")
    proc = run_ferrum("transcribe", *[r["path"] for r in rows], "-f", "json", "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    return {r["path"]: json.loads((out / (Path(r["file"]).stem + ".json")).read_text())["text"] for r in rows}


def post(server, path: str = "/v1/audio/transcriptions", key: str | None = KEY, **kwargs) -> httpx.Response:
    """A form as OpenAI's clients send it: with model=whisper-1 unless the test names another."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    kwargs["data"] = {"model": "whisper-1", **kwargs.get("data", {})}
    return httpx.post(server.url + path, headers=headers, timeout=300, **kwargs)


def assert_openai_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and "Traceback" not in error["message"]
    if param is not None:
        assert error["param"] == param
    return error


# -- what a client gets --------------------------------------------------------------------


@needs_corpus
def test_each_response_format_through_the_openai_client(client):
    import srt
    import webvtt

    with open(corpus(JFK), "rb") as fh:
        text = client.audio.transcriptions.create(model="whisper-1", file=fh).text
    assert words(text) == words("And so my fellow Americans, ask not what your country can do for you, "
                                "ask what you can do for your country.")  # fmt: skip

    with open(corpus(JFK), "rb") as fh:
        plain = client.audio.transcriptions.create(model="whisper-1", file=fh, response_format="text")
    assert plain.strip() == text

    with open(corpus(JFK), "rb") as fh:
        body = client.audio.transcriptions.create(model="whisper-1", file=fh, response_format="srt")
    cues = list(srt.parse(body))
    assert cues and " ".join(c.content for c in cues) == text
    assert all(c.start < c.end for c in cues)

    with open(corpus(JFK), "rb") as fh:
        body = client.audio.transcriptions.create(model="whisper-1", file=fh, response_format="vtt")
    captions = webvtt.from_string(body)
    assert " ".join(c.text for c in captions) == text

    with open(corpus(JFK), "rb") as fh:
        verbose = client.audio.transcriptions.create(model="whisper-1", file=fh, response_format="verbose_json")
    assert (verbose.language, verbose.text) == ("english", text)
    assert 10.5 < verbose.duration < 11.5
    assert verbose.words is None
    for segment in verbose.segments:
        assert 0 <= segment.start < segment.end <= verbose.duration + 0.1
        assert segment.tokens and segment.avg_logprob < 0 and 0 <= segment.no_speech_prob <= 1
        assert segment.temperature == 0.0 and segment.compression_ratio > 0


@needs_corpus
def test_word_timestamps_in_verbose_json(client):
    with open(corpus(JFK), "rb") as fh:
        verbose = client.audio.transcriptions.create(
            model="whisper-1", file=fh, response_format="verbose_json", timestamp_granularities=["word", "segment"]
        )
    said = [w.word for w in verbose.words]
    assert " ".join(said) == verbose.text
    starts = [w.start for w in verbose.words]
    assert starts == sorted(starts) and all(w.start <= w.end for w in verbose.words)
    assert verbose.words[-1].end <= verbose.duration and verbose.segments

    with open(corpus(JFK), "rb") as fh:
        only_words = client.audio.transcriptions.create(
            model="whisper-1", file=fh, response_format="verbose_json", timestamp_granularities=["word"]
        )
    assert only_words.segments is None and [w.word for w in only_words.words] == said


@needs_corpus
@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")  # the client marks translations so
def test_translation_gives_english(client):
    german = corpus("de_picovoice_test_de.wav")
    with open(german, "rb") as fh:
        original = client.audio.transcriptions.create(model="whisper-1", file=fh, response_format="verbose_json")
    with open(german, "rb") as fh:
        english = client.audio.translations.create(model="whisper-1", file=fh, response_format="verbose_json")
    assert original.language == "german"
    assert english.text.isascii() and words(english.text) != words(original.text)
    assert len(english.text.split()) >= 4


def test_streaming_gives_each_segment_then_the_text(client):
    with open(SAMPLE, "rb") as fh:
        whole = client.audio.transcriptions.create(model="whisper-1", file=fh).text
    with open(SAMPLE, "rb") as fh:
        events = list(client.audio.transcriptions.create(model="whisper-1", file=fh, stream=True))
    kinds = [e.type for e in events]
    assert kinds[-1] == "transcript.text.done" and set(kinds[:-1]) == {"transcript.text.delta"}
    assert "".join(e.delta for e in events[:-1]).strip() == events[-1].text == whole


def test_include_logprobs_gives_each_tokens_log_probability_in_json_and_its_events(client):
    """include[]=logprobs (OpenAI's, for gpt-4o-transcribe): OpenAI's Logprob for every token of
    the text, whose bytes spell the text; in the stream, each delta's tokens and then all of them."""
    with open(SAMPLE, "rb") as fh:
        whole = client.audio.transcriptions.create(model="whisper-1", file=fh, include=["logprobs"])
    assert whole.logprobs and len(whole.logprobs) >= len(whole.text.split())
    assert bytes(int(b) for lp in whole.logprobs for b in lp.bytes).decode().strip() == whole.text  # typed floats
    assert all(-30 < lp.logprob <= 0 for lp in whole.logprobs)
    assert sum(math.exp(lp.logprob) for lp in whole.logprobs) / len(whole.logprobs) > 0.7  # a clear reading
    with open(SAMPLE, "rb") as fh:
        events = list(client.audio.transcriptions.create(model="whisper-1", file=fh, stream=True, include=["logprobs"]))
    deltas, done = events[:-1], events[-1]
    each_delta = [lp.model_dump() for e in deltas for lp in e.logprobs]  # the events' Logprob types differ
    assert each_delta == [lp.model_dump() for lp in done.logprobs] == [lp.model_dump() for lp in whole.logprobs]
    with open(SAMPLE, "rb") as fh:
        assert client.audio.transcriptions.create(model="whisper-1", file=fh).logprobs is None  # only when asked
    for fmt in ("text", "verbose_json"):
        with open(SAMPLE, "rb") as fh, pytest.raises(openai.BadRequestError, match="needs response_format=json"):
            client.audio.transcriptions.create(model="whisper-1", file=fh, include=["logprobs"], response_format=fmt)


@needs_corpus
def test_diarized_json_and_its_segment_events_through_the_openai_client(client):
    """OpenAI's diarized shape (TranscriptionDiarized): speakers A, B in order of first appearance;
    streamed, a transcript.text.segment event per segment once its speaker is known."""
    two = corpus("diarization/pyannote_sample.wav")
    with open(two, "rb") as fh:
        diarized = client.audio.transcriptions.create(model="whisper-1", file=fh, response_format="diarized_json")
    assert type(diarized).__name__ == "TranscriptionDiarized" and diarized.task == "transcribe"
    speakers = [s.speaker for s in diarized.segments]
    assert speakers[0] == "A" and set(speakers) == {"A", "B"}
    assert all(s.type == "transcript.text.segment" and s.start <= s.end for s in diarized.segments)
    assert " ".join(s.text for s in diarized.segments) == diarized.text and 29 < diarized.duration < 31
    with open(two, "rb") as fh:
        events = list(client.audio.transcriptions.create(
            model="whisper-1", file=fh, response_format="diarized_json", stream=True
        ))  # fmt: skip
    assert [e.type for e in events] == ["transcript.text.segment"] * len(speakers) + ["transcript.text.done"]
    assert [e.speaker for e in events[:-1]] == speakers and events[-1].text == diarized.text


@needs_corpus
def test_known_speakers_are_named_where_their_voice_is_heard(server, client):
    """known_speaker_names[] with known_speaker_references[] (data URLs): a voice like a sample's
    takes its name; a sample of someone who does not speak (JFK) names no one."""
    import base64

    from ferrum_cli.audio.ffmpeg import decode_file

    two = corpus("diarization/pyannote_sample.wav")
    samples = decode_file(two).samples

    def reference(start: float, end: float, audio=samples) -> str:
        clip = wav_bytes(audio[int(start * 16000) : int(end * 16000)])
        return "data:audio/wav;base64," + base64.b64encode(clip).decode()

    first, second = reference(22.0, 27.5), reference(18.6, 21.5)  # each speaker alone, from the reference turns
    with open(two, "rb") as fh:
        named = client.audio.transcriptions.create(
            model="whisper-1", file=fh, response_format="diarized_json",
            known_speaker_names=["Carol", "Dora"], known_speaker_references=[first, second],
        )  # fmt: skip
    speakers = [s.speaker for s in named.segments]
    assert speakers[0] == "Carol" and set(speakers) == {"Carol", "Dora"}, speakers
    # a 48 kHz stereo WAV, as recorders write them: its data URL (2.0 MB) is past Starlette's 1 MB for a field
    recorded = wav_bytes(np.repeat(decode_file(corpus(JFK)).samples[: 8 * 16000], 3), 48000, channels=2)
    jfk = "data:audio/wav;base64," + base64.b64encode(recorded).decode()
    assert len(jfk) > 2_000_000
    with open(two, "rb") as fh:
        unnamed = client.audio.transcriptions.create(
            model="whisper-1", file=fh, response_format="diarized_json",
            known_speaker_names=["John"], known_speaker_references=[jfk],
        )  # fmt: skip
    assert {s.speaker for s in unnamed.segments} == {"A", "B"}
    for fields, says in (
        ({"known_speaker_names[]": "Carol", "known_speaker_references[]": "not a data url"}, "data URL"),
        ({"known_speaker_names[]": "Carol"}, "for each"),
    ):
        response = post(server, data={"model": "whisper-1", "response_format": "diarized_json", **fields},
                        files={"file": ("a.wav", two.read_bytes())})  # fmt: skip
        assert says in assert_openai_error(response, 400, "known_speaker_names" if says == "for each" else
                                           "known_speaker_references")["message"]  # fmt: skip


def test_models_and_health(server, client):
    ids = [m.id for m in client.models.list()]
    assert ids == ["base", "whisper-1"]  # each one a request may name
    assert [client.models.retrieve(name).id for name in ids] == ids
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("whisper-2")
    assert missing.value.body["code"] == "model_not_found" and "whisper-2" in missing.value.body["message"]
    for name in ids:
        with open(SAMPLE, "rb") as fh:
            assert client.audio.transcriptions.create(model=name, file=fh).text
    health = httpx.get(server.url + "/health", timeout=10)  # no key needed: a load balancer's probe
    assert health.json() == {"status": "ready", "model": "base"}


def test_metrics_in_prometheus_text(server, client):
    from prometheus_client.parser import text_string_to_metric_families

    with open(SAMPLE, "rb") as fh:
        client.audio.transcriptions.create(model="whisper-1", file=fh)
    response = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    ok = [
        s.value for s in families["ferrum_requests"].samples
        if s.labels == {"endpoint": "/v1/audio/transcriptions", "status": "200"} and s.name.endswith("_total")
    ]  # fmt: skip
    assert ok and ok[0] >= 1
    assert next(s.value for s in families["ferrum_audio_seconds"].samples) >= 7
    assert {"ferrum_queue_requests", "ferrum_queue_audio_seconds", "ferrum_batch_fill"} <= set(families)
    assert "ferrum_request_latency_seconds" in families


# -- bad input -----------------------------------------------------------------------------


def test_each_error_in_openai_shape(server, client, tmp_path):
    audio = SAMPLE.read_bytes()
    not_audio = bytes(range(256)) * 200
    assert_openai_error(post(server, files={"file": ("x.mp3", not_audio)}), 400, "file")
    assert_openai_error(post(server, files={"file": ("x.wav", b"")}), 400, "file")
    assert_openai_error(post(server, data={"model": "whisper-1"}), 400, "file")
    assert_openai_error(post(server, files={"file": ("a.wav", audio)}, data={"model": "large-v9"}), 404, "model")
    assert_openai_error(post(server, files={"file": ("a.wav", audio)}, data={"language": "xx"}), 400, "language")
    bad_format = post(server, files={"file": ("a.wav", audio)}, data={"response_format": "xml"})
    assert_openai_error(bad_format, 400, "response_format")
    assert_openai_error(post(server, files={"file": ("a.wav", audio)}, data={"temperature": "hot"}), 400)
    assert_openai_error(post(server, key=None, files={"file": ("a.wav", audio)}), 401)
    assert_openai_error(post(server, key="wrong", files={"file": ("a.wav", audio)}), 401)
    assert_openai_error(httpx.get(server.url + "/v1/nothing", headers={"Authorization": f"Bearer {KEY}"}), 404)
    no_model = httpx.post(server.url + "/v1/audio/transcriptions", headers={"Authorization": f"Bearer {KEY}"},
                          files={"file": ("a.wav", audio)}, timeout=60)  # fmt: skip
    assert_openai_error(no_model, 400, "model")  # as OpenAI: model is required

    with pytest.raises(openai.NotFoundError):
        client.audio.transcriptions.create(model="large-v9", file=("a.wav", audio))
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.BadRequestError, match="not audio"):
        client.audio.transcriptions.create(model="whisper-1", file=("x.mp3", not_audio))


def test_a_prompt_that_spells_special_tokens_is_text_and_the_server_goes_on(server, client):
    """'<|endoftext|>' in a prompt raised in the tokenizer on the engine's thread, which died: every
    later request hung while /health said ready."""
    with open(SAMPLE, "rb") as fh:
        plain = client.audio.transcriptions.create(model="whisper-1", file=fh).text
    for prompt in ("<|endoftext|>", "<|startoftranscript|><|en|> Hello", "<|notimestamps|>"):
        with open(SAMPLE, "rb") as fh:
            assert client.audio.transcriptions.create(model="whisper-1", file=fh, prompt=prompt).text
    with open(SAMPLE, "rb") as fh:
        assert client.audio.transcriptions.create(model="whisper-1", file=fh).text == plain
    assert httpx.get(server.url + "/health", timeout=10).json()["status"] == "ready"


@pytest.fixture(scope="module")
def small_server():
    """Limits small enough to reach: 1 MB uploads, 20 s of audio queued."""
    running = RunningServer("--model", "tiny.en", "--max-upload-mb", "1", "--max-queue-seconds", "20")
    yield running
    assert running.stop() == 0
    assert "Traceback" not in running.output()


def test_upload_over_the_limit_is_413(small_server):
    response = post(small_server, key=None, files={"file": ("big.wav", b"\0" * 1_500_000)})
    assert_openai_error(response, 413)


def test_audio_longer_than_the_queue_is_413_and_a_full_queue_429(small_server, tmp_path):
    import numpy as np

    from ferrum_cli.audio.ffmpeg import find_ffmpeg

    from .helpers import wav_bytes

    tone = 0.1 * np.sin(np.arange(16000 * 25) * 0.05)  # 25 s: more than the 20 s the queue takes
    assert_openai_error(post(small_server, key=None, files={"file": ("long.wav", wav_bytes(tone))}), 413, "file")
    bomb = tmp_path / "hour.flac"  # an hour of silence in a few kilobytes: decoding stops at the limit
    ffmpeg = find_ffmpeg().path
    subprocess.run([ffmpeg, "-v", "error", "-f", "lavfi", "-i", "anullsrc=r=8000:cl=mono", "-t", "3600",
                    "-c:a", "flac", str(bomb)], check=True)  # fmt: skip
    assert bomb.stat().st_size < 1_000_000
    assert_openai_error(post(small_server, key=None, files={"file": ("hour.flac", bomb.read_bytes())}), 413, "file")

    speech = SAMPLE.read_bytes()  # 7 s each: three fit, the fourth does not while they are queued
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda _: post(small_server, key=None, files={"file": ("a.wav", speech)}), range(12)))
    statuses = sorted(r.status_code for r in answers)
    assert statuses[0] == 200 and statuses[-1] == 429, statuses
    busy = next(r for r in answers if r.status_code == 429)
    assert_openai_error(busy, 429)
    # the time until a 7 s clip fits, from the throughput measured: the whole burst took seconds
    assert 1 <= int(busy.headers["Retry-After"]) <= 10, busy.headers["Retry-After"]
    assert post(small_server, key=None, files={"file": ("a.wav", speech)}).status_code == 200  # the queue drained


def test_a_hostile_upload_fails_only_itself(server):
    import numpy as np

    from .helpers import wav_bytes

    header = b"RIFF" + b"\xff" * 4 + b"WAVEfmt " + b"\xff" * 200  # a header that claims everything
    silence_hours = wav_bytes(np.zeros(16000, np.float32))[:40] + b"\xff\xff\xff\x7f"  # data size: 2 GB declared
    with ThreadPoolExecutor(3) as pool:
        good = pool.submit(post, server, files={"file": ("a.wav", SAMPLE.read_bytes())})
        bad = [pool.submit(post, server, files={"file": ("h.wav", data)}) for data in (header, silence_hours)]
        assert good.result().status_code == 200
        for answer in bad:
            assert answer.result().status_code in (200, 400), answer.result().text


@needs_corpus
def test_what_a_file_would_warn_of_goes_to_the_servers_log(server, tmp_path):
    """OpenAI's formats have no field for warnings: the operator reads them in the log."""
    tracks = tmp_path / "tracks.mka"
    subprocess.run(
        [find_ffmpeg().path, "-nostdin", "-v", "error", "-i", str(corpus(JFK)), "-i", str(SAMPLE),
         "-map", "0:a", "-map", "1:a", str(tracks)], check=True,
    )  # fmt: skip
    answer = post(server, files={"file": ("tracks.mka", tracks.read_bytes())}, data={"language": "en"})
    assert answer.status_code == 200 and "ask not what your country" in words(answer.json()["text"])
    assert "'tracks.mka': read audio stream 0 of 2 (0, 1)" in server.output()


# -- load ----------------------------------------------------------------------------------


@needs_corpus
def test_sixteen_concurrent_clients_get_the_cli_text(client, cli_texts):
    def ask(path: str) -> str:
        with open(path, "rb") as fh:
            return client.audio.transcriptions.create(model="whisper-1", file=fh).text

    with ThreadPoolExecutor(16) as pool:
        answers = dict(zip(cli_texts, pool.map(ask, cli_texts)))
    for path, text in cli_texts.items():
        assert answers[path] == text, path


def test_options_per_request_do_not_leak_into_others(client):
    """Requests with different languages and prompts at once each get their own."""
    with ThreadPoolExecutor(3) as pool:
        plain = pool.submit(lambda: client.audio.transcriptions.create(model="whisper-1", file=SAMPLE.open("rb")))
        english = pool.submit(
            lambda: client.audio.transcriptions.create(model="whisper-1", file=SAMPLE.open("rb"), language="en")
        )
        prompted = pool.submit(
            lambda: client.audio.transcriptions.create(
                model="whisper-1", file=SAMPLE.open("rb"), prompt="Mister Dashwood.", response_format="verbose_json"
            )
        )
        assert plain.result().text == english.result().text
        assert prompted.result().language == "english" and "Dashwood" in prompted.result().text


def test_languages_and_keywords_as_openais_newer_models_take_them(client):
    """languages[]: detection chooses among them; keywords[]: words to expect, read as hotwords
    (ahead of any prompt), so alone they read as that prompt would."""
    with SAMPLE.open("rb") as fh:
        among = client.audio.transcriptions.create(
            model="whisper-1", file=fh, languages=["de", "fr"], response_format="verbose_json"
        )
    assert among.language in ("german", "french")
    with SAMPLE.open("rb") as fh:
        keyed = client.audio.transcriptions.create(model="whisper-1", file=fh, keywords=["Mister Dashwood."]).text
    with SAMPLE.open("rb") as fh:
        prompted = client.audio.transcriptions.create(model="whisper-1", file=fh, prompt="Mister Dashwood.").text
    assert keyed == prompted and "Dashwood" in keyed
    with SAMPLE.open("rb") as fh, pytest.raises(openai.BadRequestError, match="not both"):
        client.audio.transcriptions.create(model="whisper-1", file=fh, language="en", languages=["de"])


def test_clients_that_go_away_do_not_disturb_the_server(server, client):
    model = b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n'
    body = model + b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n' + SAMPLE.read_bytes()
    head = (
        f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: {len(body) + 8}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as mid_upload:  # half the body, then gone
        mid_upload.sendall(head + body[: len(body) // 2])
    for _ in range(3):  # the whole body, then gone while it is decoded
        with socket.create_connection(("127.0.0.1", server.port)) as mid_decode:
            mid_decode.sendall(head + body + b"\r\n--b--\r\n")
            time.sleep(0.3)
    with open(SAMPLE, "rb") as fh:
        assert "Dashwood" in client.audio.transcriptions.create(model="whisper-1", file=fh).text
    metrics = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    cancelled = [line for line in metrics.splitlines() if line.startswith("ferrum_requests_cancelled_total")]
    assert cancelled and float(cancelled[0].split()[-1]) >= 1


# -- live streams over a WebSocket ---------------------------------------------------------

STREAMS = {
    "pcm16": [JFK, "en_harvard_speechbrain_example1.wav"],
    "any": ["en_librispeech_61-70968-0000.flac", "en_ljspeech_LJ001-0001.flac"],
}
STREAM_SPEED = 2.0  # times real time


def stream_audio(server, payload: bytes, query: str, key: str | None = KEY) -> dict:
    """Send payload over WS /v1/audio/stream at STREAM_SPEED, 0.1 s of audio per message, as a
    recorder would; returns the events with the second each arrived and when sending ended."""
    from websockets.exceptions import ConnectionClosed, ConnectionClosedError
    from websockets.sync.client import connect

    url = server.url.replace("http", "ws") + "/v1/audio/stream?" + query
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    events, sent, close_code = [], {}, 1000
    with connect(url, additional_headers=headers, open_timeout=30) as ws:
        start = time.monotonic()

        def send() -> None:
            step = int(32000 * 0.1)  # bytes of 0.1 s of 16-bit 16 kHz mono
            try:
                for i in range(0, len(payload), step):
                    ws.send(payload[i : i + step])
                    time.sleep(max(0.0, start + (i + step) / (32000 * STREAM_SPEED) - time.monotonic()))
                ws.send(json.dumps({"type": "end"}))
            except ConnectionClosed:
                return  # the server closed first (an error it has sent)
            sent["at"] = time.monotonic() - start

        sender = threading.Thread(target=send)
        sender.start()
        try:
            for message in ws:
                events.append((time.monotonic() - start, json.loads(message)))
        except ConnectionClosedError as closed:
            close_code = closed.rcvd.code if closed.rcvd else 1006
        sender.join()
    return {"events": events, "sent_at": sent.get("at"), "close_code": close_code}


@needs_corpus
def test_two_live_streams_at_once_give_text_while_they_are_sent(server, tmp_path):
    """Two WebSocket streams share the engine: one of raw PCM16 frames, one of a WAV container
    (decoded by ffmpeg as it arrives). Segments come before the stream ends, and each clip reads
    as the CLI reads the same audio offline, to a word."""
    joined = {fmt: joined_clips(names) for fmt, names in STREAMS.items()}
    pcm = {fmt: (samples * 32767).astype("<i2").tobytes() for fmt, (samples, _) in joined.items()}
    payloads = {"pcm16": pcm["pcm16"], "any": wav_bytes(joined["any"][0])}
    with ThreadPoolExecutor(2) as pool:
        runs = {fmt: pool.submit(stream_audio, server, payloads[fmt], f"audio_format={fmt}") for fmt in STREAMS}
        results = {fmt: run.result(timeout=300) for fmt, run in runs.items()}
    for fmt, (samples, spans) in joined.items():
        assert results[fmt]["close_code"] == 1000
        events = results[fmt]["events"]
        kinds = [e["type"] for _, e in events]
        assert kinds[-1] == "done" and set(kinds[:-1]) == {"segment"}, events
        segments = [e for _, e in events[:-1]]
        assert all(e["language"] == "en" for e in segments)
        first_arrival = events[0][0]
        assert first_arrival < results[fmt]["sent_at"], "no segment came while the audio was being sent"
        offline_path = tmp_path / f"{fmt}.wav"
        offline_path.write_bytes(wav_bytes(samples))
        offline = json.loads(run_ferrum("transcribe", str(offline_path), "-f", "json", "-q").stdout)["segments"]
        for span in spans:
            heard = clip_text(segments, span)
            assert errors_against(clip_text(offline, span), heard, "en") <= 1, (fmt, heard, clip_text(offline, span))
        done = events[-1][1]
        assert done["text"] == "".join(e["text"] for e in segments).strip()
        assert abs(done["duration"] - len(samples) / 16000) < 0.1


def test_a_live_stream_refused_or_broken_gets_an_openai_error(server):
    from websockets.exceptions import InvalidStatus

    with pytest.raises(InvalidStatus) as refused:
        stream_audio(server, b"", "", key="wrong")
    assert refused.value.response.status_code == 401
    bad_format = stream_audio(server, b"", "audio_format=mp3")
    assert [e["type"] for _, e in bad_format["events"]] == ["error"] and bad_format["close_code"] == 1008
    assert bad_format["events"][0][1]["error"]["param"] == "audio_format"
    bad_language = stream_audio(server, bytes(32000), "language=xx")  # audio sent before the error is read
    assert [e["type"] for _, e in bad_language["events"]] == ["error"] and bad_language["close_code"] == 1008
    assert bad_language["events"][0][1]["error"]["param"] == "language"
    noise = stream_audio(server, bytes(range(256)) * 400, "audio_format=any")
    assert [e["type"] for _, e in noise["events"]] == ["error"] and noise["close_code"] == 1008
    assert noise["events"][0][1]["error"]["code"] == "invalid_audio"
    from websockets.sync.client import connect

    url = server.url.replace("http", "ws") + "/v1/audio/stream"
    with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:  # gone mid-stream
        speech = (joined_clips([JFK])[0] * 32767).astype("<i2").tobytes()
        for i in range(0, len(speech) // 2, 3200):
            ws.send(speech[i : i + 3200])
    with open(SAMPLE, "rb") as fh:  # and the server goes on
        assert post(server, files={"file": ("a.wav", fh)}).status_code == 200
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        metrics = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
        if "ferrum_live_streams 0.0" in metrics:
            break
        time.sleep(0.2)
    assert "ferrum_live_streams 0.0" in metrics


# -- the process -----------------------------------------------------------------------------


ENGINE_FAULT = """
import sys
from ferrum_cli.engine.batched import BatchedEngine
def broken(self, request):
    raise RuntimeError("injected fault in the engine's loop")
BatchedEngine.submit = broken
from ferrum_cli.cli import main
sys.argv[0] = "ferrum"
main()
"""


def test_an_engine_that_cannot_go_on_fails_the_request_then_health_and_exits_1():
    """Not a hang behind a /health that says ready: the request gets a 503 in OpenAI's shape,
    /health turns 503, and the process ends with exit 1."""
    import sys

    running = RunningServer("--model", "tiny.en", program=[sys.executable, "-c", ENGINE_FAULT])
    try:
        response = post(running, key=None, files={"file": ("a.wav", SAMPLE.read_bytes())})
        assert_openai_error(response, 503)
        try:
            health = httpx.get(running.url + "/health", timeout=5)
            assert health.status_code == 503 and health.json()["status"] == "failed"
        except httpx.TransportError:
            pass  # already gone
        assert running.proc.wait(60) == 1
    finally:
        running.stop()
    assert "the engine stopped: RuntimeError" in running.output() and "Traceback" not in running.output()


def test_a_flood_of_slow_clients_is_dropped_and_health_still_answers():
    """700 connections that send a header line now and then: each is answered 408 within the
    deadline, the oldest make room for new ones, /health answers throughout, and the log stays small
    (it grew by 660 MB in 80 s of 'socket.accept() out of system resource')."""
    few_files = ["bash", "-c", f'ulimit -n 256; exec "{FERRUM}" "$@"', "ferrum"]
    running = RunningServer("--model", "tiny.en", "--request-timeout", "2", program=few_files)
    slow: list[socket.socket] = []
    try:
        for _ in range(700):  # more than the 256 files the server may open
            try:
                conn = socket.create_connection(("127.0.0.1", running.port), timeout=5)
                conn.sendall(b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\n")
                slow.append(conn)
            except OSError:
                break  # the client's own limit of open files
        assert len(slow) >= 500
        for _ in range(4):  # the flood goes on: a header line each second
            for conn in slow:
                try:
                    conn.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    pass
            assert httpx.get(running.url + "/health", timeout=5).status_code == 200
            time.sleep(1)
        answered = 0
        for conn in slow[-50:]:
            conn.settimeout(5)
            try:
                answered += conn.recv(200).startswith(b"HTTP/1.1 408")
            except OSError:
                pass
        assert answered == 50
    finally:
        for conn in slow:
            conn.close()
        assert running.stop() == 0
    log = running.output()
    assert "Traceback" not in log and len(log.splitlines()) < 100, log[-3000:]


def test_a_port_in_use_a_host_or_a_model_that_is_not_there_is_one_line_before_the_server_starts():
    """uvicorn binds after the app starts: it would load the model, then log the bind error among
    its own lines and exit 3. The model loads once the server listens (/health says loading), so
    a name no model has would have been an error in the log of a server that had started."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = run_ferrum("serve", "--port", str(port), "--model", "tiny.en", timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"error: cannot listen on 127.0.0.1:{port}: Address already in use"]
    unknown = run_ferrum("serve", "--host", "no-such-host.invalid", "--no-auth", "--port", str(free_port()), timeout=60)
    assert unknown.returncode == 2
    assert len(unknown.stderr.splitlines()) == 1 and unknown.stderr.startswith("error: --host no-such-host.invalid: ")
    for model, message in (
        ("tiny.eng", "unknown model 'tiny.eng'; known names: "),
        ("/no/such/model.pt", "no such model file or directory: /no/such/model.pt"),
    ):
        proc = run_ferrum("serve", "--model", model, "--port", str(free_port()), timeout=60)
        assert proc.returncode == 4
        assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith(f"error: {message}")


def test_beyond_loopback_needs_a_key():
    proc = run_ferrum("serve", "--host", "0.0.0.0", "--port", str(free_port()), timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--api-key" in proc.stderr


def test_sigterm_finishes_the_request_in_flight_then_exits_0():
    running = RunningServer("--model", "tiny.en")
    answer = {}
    sender = threading.Thread(
        target=lambda: answer.update(r=post(running, key=None, files={"file": ("a.wav", SAMPLE.read_bytes())}))
    )
    sender.start()
    time.sleep(0.5)  # uploaded and queued
    code = running.stop(signal.SIGTERM)
    sender.join(60)
    assert code == 0, running.output()
    assert answer["r"].status_code == 200 and "Dashwood" in answer["r"].json()["text"]
    assert "Traceback" not in running.output()
