"""WS /v1/realtime: OpenAI's Realtime API in transcription mode, spoken to with the real openai
client's `client.realtime.connect(...)` against `ferrum serve` in a subprocess on loopback."""

from __future__ import annotations

import base64
import json
import subprocess
import threading
import time

import numpy as np
import pytest

from .helpers import JFK, RunningServer, errors_against, joined_clips, needs_corpus, run_ferrum, wav_bytes

openai = pytest.importorskip("openai", reason="the openai client is a dev dependency (make install)")
KEY = "realtime-key"
MAX_STREAMS = 8
COMPLETED = "conversation.item.input_audio_transcription.completed"
DELTA = "conversation.item.input_audio_transcription.delta"


@pytest.fixture(scope="module")
def server():
    running = RunningServer("--api-key", KEY, "--max-streams", str(MAX_STREAMS))
    yield running
    running.stop_cleanly()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


def connect(client):
    return client.realtime.connect(extra_query={"intent": "transcription"})


def pcm16(samples: np.ndarray, rate: int = 24000) -> bytes:
    import soxr

    resampled = soxr.resample(samples, 16000, rate) if rate != 16000 else samples
    return (np.clip(resampled, -1, 1) * 32767).astype("<i2").tobytes()


def g711(samples: np.ndarray, codec: str) -> bytes:
    """The samples as 8 kHz G.711 by ffmpeg's own encoder (codec: mulaw or alaw)."""
    from ferrum_cli.audio.ffmpeg import find_ffmpeg

    proc = subprocess.run(
        [find_ffmpeg().path, "-v", "error", "-i", "pipe:0", "-f", codec, "-ar", "8000", "-ac", "1", "pipe:1"],
        input=wav_bytes(samples), capture_output=True, check=True,
    )  # fmt: skip
    return proc.stdout


def append(conn, data: bytes, step: int = 1 << 20) -> None:
    for i in range(0, len(data), step):
        conn.input_audio_buffer.append(audio=base64.b64encode(data[i : i + step]).decode())


def events_until(conn, kind: str, limit: float = 120) -> list[dict]:
    """Server events up to and with the first of `kind`."""
    seen, deadline = [], time.monotonic() + limit
    for event in conn:
        seen.append(event.to_dict())
        if seen[-1]["type"] == kind:
            return seen
        assert time.monotonic() < deadline, seen
    raise AssertionError(f"the connection closed before {kind}: {seen}")


def cli_text(samples: np.ndarray, tmp_path) -> str:
    path = tmp_path / "offline.wav"
    path.write_bytes(wav_bytes(samples))
    proc = run_ferrum("transcribe", str(path), "-f", "json", "-q", "--language", "en")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["text"]


@needs_corpus
def test_a_paced_recording_gives_its_sentences_as_completed_events_while_it_plays(client, tmp_path):
    """24 kHz PCM at real time with server_vad: each turn of speech is started, stopped and
    committed (items chained by previous_item_id), then transcribed; texts arrive while the audio
    still plays, and together read as the CLI reads the same recording."""
    samples, _ = joined_clips([JFK, "en_harvard_speechbrain_example1.wav"])
    audio = pcm16(samples)
    events, sent = [], {}
    with connect(client) as conn:
        conn.session.update(session={"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 24000},
            "transcription": {"model": "gpt-4o-transcribe", "language": "en"},
            "turn_detection": {"type": "server_vad", "threshold": 0.5, "silence_duration_ms": 500},
        }}})  # fmt: skip
        start = time.monotonic()

        def play() -> None:
            step = 4800  # 0.1 s
            for i in range(0, len(audio), step):
                append(conn, audio[i : i + step])
                time.sleep(max(0.0, start + (i + step) / 48000 - time.monotonic()))
            append(conn, bytes(48000))  # a second of silence ends the last turn
            sent["at"] = time.monotonic() - start
            conn.input_audio_buffer.clear()  # its answer marks the end of what was sent

        player = threading.Thread(target=play)
        player.start()
        for event in conn:
            events.append((time.monotonic() - start, event.to_dict()))
            kinds = [e["type"] for _, e in events]
            stopped = kinds.count("input_audio_buffer.speech_stopped")
            if "input_audio_buffer.cleared" in kinds and kinds.count(COMPLETED) == stopped:
                break
            assert time.monotonic() - start < 120, kinds
        player.join()
    kinds = [e["type"] for _, e in events if e["type"] != "input_audio_buffer.cleared"]
    assert kinds[:2] == ["session.created", "session.updated"], kinds
    assert events[1][1]["session"]["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 500
    items = [e for _, e in events if e["type"] == "input_audio_buffer.committed"]
    assert len(items) >= 2, kinds
    assert items[0]["previous_item_id"] is None
    assert all(b["previous_item_id"] == a["item_id"] for a, b in zip(items, items[1:]))
    for item in (i["item_id"] for i in items):
        own = [e["type"] for _, e in events if e.get("item_id") == item]
        assert own[:3] == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                           "input_audio_buffer.committed"], own  # fmt: skip
        assert own[-1] == COMPLETED and set(own[3:-1]) <= {DELTA}, own
    completed = [(t, e) for t, e in events if e["type"] == COMPLETED]
    assert [e["item_id"] for _, e in completed] == [i["item_id"] for i in items], "not in the order committed"
    assert completed[0][0] < sent["at"], "no transcript came while the recording played"
    for _, event in completed:
        deltas = "".join(e["delta"] for _, e in events if e["type"] == DELTA and e["item_id"] == event["item_id"])
        assert deltas.strip() == event["transcript"]
        assert event["usage"]["type"] == "duration" and event["usage"]["seconds"] > 0
    heard = " ".join(e["transcript"] for _, e in completed)
    assert errors_against(cli_text(samples, tmp_path), heard, "en") <= 3, heard


@needs_corpus
@pytest.mark.parametrize("protocol", ["beta g711_ulaw", "GA audio/pcma", "GA audio/pcm at 16 kHz"])
def test_a_committed_buffer_in_each_format_is_transcribed(client, protocol, tmp_path):
    """Without turn detection the client commits; G.711 (μ-law, A-law, as ffmpeg encodes them)
    and 16-bit PCM at 16 kHz all read as the CLI reads the recording. The beta protocol's
    transcription_session.update is answered in its own shape."""
    samples, _ = joined_clips(["en_harvard_speechbrain_example1.wav"])
    with connect(client) as conn:
        if protocol.startswith("beta"):
            conn.send({"type": "transcription_session.update", "session": {
                "input_audio_format": "g711_ulaw", "turn_detection": None,
                "input_audio_transcription": {"model": "whisper-1", "language": "en"},
            }})  # fmt: skip
            updated, data = "transcription_session.updated", g711(samples, "mulaw")
        else:
            fmt = {"type": "audio/pcma"} if "pcma" in protocol else {"type": "audio/pcm", "rate": 16000}
            include = [] if "pcma" in protocol else ["item.input_audio_transcription.logprobs"]
            conn.session.update(session={"type": "transcription", "include": include, "audio": {"input": {
                "format": fmt, "turn_detection": None, "transcription": {"model": "whisper-1", "language": "en"},
            }}})  # fmt: skip
            updated = "session.updated"
            data = g711(samples, "alaw") if "pcma" in protocol else pcm16(samples, 16000)
        session = events_until(conn, updated)[-1]["session"]
        if protocol.startswith("beta"):
            assert session["input_audio_format"] == "g711_ulaw" and session["turn_detection"] is None
        append(conn, data, step=8000)
        conn.input_audio_buffer.commit()
        events = events_until(conn, COMPLETED)
    kinds = [e["type"] for e in events]
    assert "input_audio_buffer.speech_started" not in kinds
    assert kinds.index("input_audio_buffer.committed") < kinds.index(COMPLETED)
    assert errors_against(cli_text(samples, tmp_path), events[-1]["transcript"], "en") <= 1, events[-1]
    if "16 kHz" in protocol:  # with the logprobs the session's include asked for: each token's, as with HTTP
        logprobs = events[-1]["logprobs"]
        assert bytes(b for lp in logprobs for b in lp["bytes"]).decode().strip() == events[-1]["transcript"]
        assert [lp for e in events if e["type"] == DELTA for lp in e["logprobs"]] == logprobs
        assert all(lp["logprob"] <= 0 for lp in logprobs)
    else:
        assert "logprobs" not in events[-1]


def test_bad_events_get_error_events_and_the_session_goes_on(client):
    """Malformed JSON, an unknown type, audio that is not base64, an event over 15 MiB, a commit
    of nothing, settings out of range, a model or language not served, a conversation session:
    each gets an `error` event in OpenAI's shape, and the connection stays open for the next."""
    bad = [
        ("{not json", "invalid_json", None),
        (json.dumps({"type": "response.create"}), "invalid_value", "type"),
        (json.dumps({"type": "input_audio_buffer.append", "audio": "not base64!"}), "invalid_value", "audio"),
        (json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (16 << 20)}), "message_too_large", None),
        (json.dumps({"type": "input_audio_buffer.commit"}), "input_audio_buffer_commit_empty", None),
        (json.dumps({"type": "session.update", "session": {"type": "realtime"}}), "invalid_value", "session.type"),
        (json.dumps({"type": "session.update", "session": {"audio": {"input": {"format": {"type": "audio/pcm",
         "rate": 44100}}}}}), "invalid_value", "session.audio.input.format.rate"),  # fmt: skip
        (json.dumps({"type": "session.update", "session": {"audio": {"input": {"turn_detection": {
         "type": "server_vad", "threshold": 3}}}}}), "invalid_value",
         "session.audio.input.turn_detection.threshold"),  # fmt: skip
        (json.dumps({"type": "session.update", "session": {"audio": {"input": {"transcription": {
         "model": "gpt-4o-transcribe", "language": "xx"}}}}}), "invalid_value",
         "session.audio.input.transcription.language"),
        (json.dumps({"type": "session.update", "session": {"audio": {"input": {"transcription": {
         "model": "dall-e-3"}}}}}), "model_not_found", "session.audio.input.transcription.model"),  # fmt: skip
    ]  # fmt: skip
    with connect(client) as conn:
        events_until(conn, "session.created")
        for message, code, param in bad:
            conn.send_raw(message)
            error = events_until(conn, "error")[-1]["error"]
            assert error["type"] == "invalid_request_error" and error["message"], error
            assert (error.get("code"), error.get("param")) == (code, param), (message[:80], error)
        conn.session.update(session={"type": "transcription", "audio": {"input": {"turn_detection": None}}})
        assert events_until(conn, "session.updated")[-1]["type"] == "session.updated"
        append(conn, pcm16(np.zeros(16000, np.float32)))
        conn.input_audio_buffer.commit()
        assert "input_audio_buffer.committed" in [e["type"] for e in events_until(conn, COMPLETED)]


def test_a_client_that_never_commits_is_held_to_ten_minutes(client):
    """Without turn detection the buffer holds at most 10 minutes: the append past it is refused
    with an error (its audio is not taken, and the client is told so), and clear empties it."""
    with connect(client) as conn:
        conn.session.update(session={"type": "transcription", "audio": {"input": {"turn_detection": None}}})
        events_until(conn, "session.updated")
        append(conn, bytes(600 * 48000), step=4 << 20)  # 10 minutes of 24 kHz silence
        append(conn, bytes(4800))
        error = events_until(conn, "error")[-1]["error"]
        assert error["code"] == "input_audio_buffer_full" and "not added" in error["message"], error
        conn.input_audio_buffer.clear()
        events_until(conn, "input_audio_buffer.cleared")
        append(conn, bytes(9600))
        conn.input_audio_buffer.commit()
        assert events_until(conn, COMPLETED)[-1]["usage"]["seconds"] == pytest.approx(0.2, abs=0.02)


def test_streams_past_the_limit_are_refused_and_a_wrong_key_gets_401(server, client):
    """100 connections at once: MAX_STREAMS are served, the rest get 429 in OpenAI's shape at the
    handshake; once one closes, a new one is served. A wrong key is refused before any of it."""
    from websockets.exceptions import InvalidStatus

    opened, refused, failures = [], [], []
    barrier = threading.Barrier(100)
    lock = threading.Lock()
    release = threading.Event()

    def one() -> None:
        barrier.wait()
        try:
            with connect(client) as conn:
                events_until(conn, "session.created")
                with lock:
                    opened.append(conn)
                release.wait(60)
        except InvalidStatus as exc:
            with lock:
                refused.append((exc.response.status_code, json.loads(exc.response.body)))
        except Exception as exc:  # anything else fails the test below
            with lock:
                failures.append(repr(exc))

    threads = [threading.Thread(target=one) for _ in range(100)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 60
    while len(opened) + len(refused) + len(failures) < 100 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not failures, failures[:3]
    assert (len(opened), len(refused)) == (MAX_STREAMS, 100 - MAX_STREAMS)
    assert all(status == 429 and body["error"]["code"] == "too_many_streams" for status, body in refused)
    release.set()
    for thread in threads:
        thread.join(30)
    time.sleep(0.5)  # the server lets the closed slots go
    with connect(client) as conn:
        assert events_until(conn, "session.created")[-1]["type"] == "session.created"
    wrong = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(InvalidStatus) as refused_key:
        with connect(wrong):
            pass
    assert refused_key.value.response.status_code == 401
