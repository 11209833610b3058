"""The Realtime scenario of `make bench`: the English longform sent to `ferrum serve`'s
/v1/realtime by the real openai client (`client.realtime.connect`), 24 kHz PCM at real time
(0.1 s every 0.1 s), server_vad at OpenAI's defaults.

Latency, per clip copy: from the moment the client has sent the copy's last sample to the moment
the `completed` event of the last item that holds its speech arrives. WER of the completed
transcripts, joined, against the references, beside the offline run of the same file.
Run alone: python bench/realtime_bench.py [copies of the 12 clips, default 3].
"""

from __future__ import annotations

import base64
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np

STEP_SECONDS = 0.1
COMPLETED = "conversation.item.input_audio_transcription.completed"


def realtime_run(url: str, samples: np.ndarray) -> tuple[list[tuple[float, dict]], float]:
    """Each server event with the second it arrived after the client began sending."""
    import openai
    import soxr

    pcm = (np.clip(soxr.resample(samples, 16000, 24000), -1, 1) * 32767).astype("<i2").tobytes()
    client = openai.OpenAI(base_url=url + "/v1", api_key="bench", max_retries=0)
    events: list[tuple[float, dict]] = []
    with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        conn.session.update(session={"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 24000}, "transcription": {"model": "whisper-1", "language": "en"},
            "turn_detection": {"type": "server_vad"},
        }}})  # fmt: skip
        start = time.monotonic()

        def send() -> None:
            step = int(48000 * STEP_SECONDS)
            for i in range(0, len(pcm), step):
                conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i : i + step]).decode())
                time.sleep(max(0.0, start + (i + step) / 48000 - time.monotonic()))
            conn.input_audio_buffer.append(audio=base64.b64encode(bytes(48000)).decode())
            conn.input_audio_buffer.clear()  # its answer marks the end

        sender = threading.Thread(target=send)
        sender.start()
        for event in conn:
            events.append((time.monotonic() - start, event.to_dict()))
            kinds = [e["type"] for _, e in events]
            if "input_audio_buffer.cleared" in kinds and kinds.count(COMPLETED) == kinds.count(
                "input_audio_buffer.committed"
            ):
                break
        sender.join()
    return events, start


def latencies(events: list[tuple[float, dict]], layout: list[tuple[str, float, float]]) -> list[float]:
    """Per copy: when the completed event of the last item that starts before its end arrived,
    less when its last sample was sent."""
    started = {e["item_id"]: e["audio_start_ms"] / 1000 for _, e in events
               if e["type"] == "input_audio_buffer.speech_started"}  # fmt: skip
    completed = {e["item_id"]: at for at, e in events if e["type"] == COMPLETED}
    out = []
    for _, _, end in layout:
        holding = [item for item, at in started.items() if at < end and item in completed]
        if holding:
            last = max(holding, key=started.get)
            out.append(completed[last] - end)
    return out


def measure(url: str, samples: np.ndarray, layout: list, reference: str, wer, console) -> tuple[dict, dict, dict]:
    """(row, ratios, targets) of the Realtime scenario, against a running `ferrum serve` at url."""
    from live_bench import latency_figures

    events, _ = realtime_run(url, samples)
    text = " ".join(e["transcript"] for _, e in events if e["type"] == COMPLETED)
    delays = latencies(events, layout)
    row = {
        "scenario": "realtime",
        "system": "ferrum serve /v1/realtime, openai client at real time",
        **latency_figures(delays, layout),
        "wer_realtime": round(wer(reference, text), 4),
    }
    console.print(
        f"  realtime p50 {row['latency_p50']} s  p95 {row['latency_p95']} s  max {row['latency_max']} s  "
        f"WER {row['wer_realtime']}  ({row['copies_heard']}/{len(layout)} copies)"
    )
    ratios = {"realtime latency p95 s": row["latency_p95"], "realtime WER": row["wer_realtime"]}
    targets = {"realtime latency p95 s": ("<=", 2.5)}
    return row, ratios, targets


if __name__ == "__main__":
    from rich.console import Console

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import english_longforms, wer
    from serve_bench import Served

    samples, layout, reference = english_longforms(int(sys.argv[1]) if len(sys.argv) > 1 else 3)["longform"]
    served = Served()
    try:
        row, ratios, targets = measure(served.url, samples, layout, reference, wer, Console())
    finally:
        served.stop()
    print(json.dumps({"row": row, "ratios": ratios, "targets": targets}, indent=1))
