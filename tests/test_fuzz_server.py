"""Hypothesis against a running `ferrum serve`: random forms on both audio endpoints and random
WebSocket streams. Whatever comes in: no 5xx, every error in OpenAI's shape, every body strict
JSON where it claims to be JSON, no request that hangs, and /health fine after.

FERRUM_FUZZ_EXAMPLES raises the number of examples (docs/guarantees.md has a longer run's figures).
"""

from __future__ import annotations

import json
import os
import struct

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .helpers import SAMPLE, RunningServer, wav_bytes

EXAMPLES = int(os.environ.get("FERRUM_FUZZ_EXAMPLES", "60"))
TIMEOUT = 120  # seconds: a request that takes longer has hung
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def fuzzed():
    running = RunningServer("--model", "tiny.en", "--max-upload-mb", "2", "--max-queue-seconds", "120")
    yield running
    assert running.stop() == 0
    assert "Traceback" not in running.output()


def strict(text: str):
    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def check_answer(response: httpx.Response) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:500])
    media = response.headers.get("content-type", "")
    if response.status_code >= 400:
        error = strict(response.text)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
        assert "Traceback" not in error["message"]
    elif media.startswith("application/json"):
        strict(response.text)
    elif media.startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data: "):
                strict(line[6:])


speech = SAMPLE.read_bytes()
tone = wav_bytes(0.1 * np.sin(np.arange(8000) * 0.1))
wav_header_only = b"RIFF" + struct.pack("<I", 36) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, 16000, 32000, 2, 16)
files = st.one_of(
    st.just(None),
    st.sampled_from([speech, tone, b"", wav_header_only, speech[: len(speech) // 3]]),
    st.binary(max_size=4096),
    st.binary(min_size=1, max_size=64).map(lambda b: speech[:44] + b * 50),
)
texts = st.text(max_size=40)
field_values = {
    "model": st.one_of(st.sampled_from(["whisper-1", "tiny.en", "", " ", "base", "large-v9"]), texts),
    "language": st.one_of(st.sampled_from(["en", "english", "EN", "xx", "auto", "", "de"]), texts),
    "prompt": st.one_of(st.sampled_from(["<|endoftext|>", "<|en|><|notimestamps|>", "\x00", "é" * 300]), texts),
    "response_format": st.one_of(st.sampled_from(["json", "text", "srt", "vtt", "verbose_json", "xml", ""]), texts),
    "temperature": st.one_of(
        st.sampled_from(["0", "1", "0.5", "-1", "2", "nan", "inf", "-inf", "1e309", "", "hot"]),
        st.floats(allow_nan=True, allow_infinity=True).map(str),
    ),
    "stream": st.sampled_from(["true", "false", "1", "0", "yes", "maybe", ""]),
}


@st.composite
def forms(draw):
    data = {"model": "whisper-1"} if draw(st.integers(0, 3)) else {}  # mostly a form that gets to the engine
    for name, values in field_values.items():
        if draw(st.integers(0, 2)) == 0:
            data[name] = draw(values)
    granularities = draw(st.lists(st.sampled_from(["word", "segment", "char", ""]), max_size=3))
    filename = draw(st.sampled_from(["a.wav", "a.mp3", "", "../../etc/passwd", "x" * 300, "a\x00b.wav"]))
    return data, granularities, draw(files), filename


@FUZZ
@given(forms(), st.sampled_from(["/v1/audio/transcriptions", "/v1/audio/translations"]))
def test_random_forms_get_an_answer_in_openai_shape(fuzzed, form, path):
    data, granularities, content, filename = form
    fields = [(name, (None, value.encode("utf-8", "surrogatepass"))) for name, value in data.items()]
    fields += [("timestamp_granularities[]", (None, g.encode())) for g in granularities]
    if content is not None:
        fields.append(("file", (filename, content)))
    if not fields:
        fields = [("model", (None, b"whisper-1"))]
    response = httpx.post(fuzzed.url + path, files=fields, timeout=TIMEOUT)
    check_answer(response)


@FUZZ
@given(st.binary(max_size=2048), st.sampled_from(["", "multipart/form-data", "multipart/form-data; boundary=x",
                                                  "application/json", "text/plain"]))  # fmt: skip
def test_random_bodies_get_an_answer_in_openai_shape(fuzzed, body, content_type):
    headers = {"content-type": content_type} if content_type else {}
    check_answer(httpx.post(fuzzed.url + "/v1/audio/transcriptions", content=body, headers=headers, timeout=TIMEOUT))


messages = st.one_of(
    st.binary(max_size=6400),
    st.text(max_size=200),
    st.sampled_from(['{"type": "end"}', "end", "{", '{"type": 5}', "[]", "null", '{"type": "segment"}']),
)
queries = st.dictionaries(
    st.sampled_from(["language", "model", "prompt", "temperature", "task", "audio_format"]),
    st.one_of(st.sampled_from(["en", "xx", "tiny.en", "nan", "translate", "any", "pcm16", "mp3", ""]), texts),
    max_size=4,
)


@settings(max_examples=max(EXAMPLES // 3, 10), deadline=None, suppress_health_check=list(HealthCheck))
@given(queries, st.lists(messages, max_size=12))
def test_random_websocket_streams_end_with_done_or_an_openai_error(fuzzed, query, sent):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    url = fuzzed.url.replace("http", "ws") + "/v1/audio/stream?" + str(httpx.QueryParams(query))
    events = []
    with connect(url, open_timeout=30, close_timeout=10) as ws:
        try:
            for message in [*sent, '{"type": "end"}']:
                ws.send(message)
        except ConnectionClosed:
            pass  # the server closed first, after its error
        try:
            while True:
                events.append(strict(ws.recv(timeout=TIMEOUT)))
        except ConnectionClosed:
            pass
    assert events, "the stream closed without a word"
    last = events[-1]
    assert last["type"] in ("done", "error"), events
    if last["type"] == "error":
        assert set(last["error"]) == {"message", "type", "param", "code"}
        assert last["error"]["type"] != "server_error", last


def test_health_is_fine_after_the_fuzzing(fuzzed):
    assert httpx.get(fuzzed.url + "/health", timeout=10).json()["status"] == "ready"
    with open(SAMPLE, "rb") as fh:
        answer = httpx.post(fuzzed.url + "/v1/audio/transcriptions", files={"file": fh},
                            data={"model": "whisper-1"}, timeout=TIMEOUT)  # fmt: skip
    assert answer.status_code == 200 and "Dashwood" in answer.json()["text"]
