"""The server scenario of `make bench`: `ferrum serve` under 1, 4 and 16 concurrent clients on
the 12 English clips, against the same clips through the library in one process, and against
the same server with cross-request batching switched off (--no-share-batches). Beside them,
with no target, the library's own gain from batching (the 12 clips batched against one at a
time in the same process): the most that sharing batches can give the server over decoding
one request at a time.

Every request sends language=en, as the other scenarios give the language. Latency is from the
first byte sent to the answer read. Run alone: python bench/serve_bench.py.
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BIN = Path(sys.executable).parent
ROUNDS_OF_CLIPS = 2  # each concurrency sends the 12 clips this many times
CONCURRENCY = (1, 4, 16)

IN_PROCESS = r"""
import json, sys, time
from ferrum_cli import WhisperModelExecutor
from ferrum_cli.options import TranscribeOptions
clips, single = json.loads(sys.argv[1]), sys.argv[2]
ex = WhisperModelExecutor.from_path("base")
ex.warmup()
options = TranscribeOptions(language="en")
best, best_one, best_apart = float("inf"), float("inf"), float("inf")
for _ in range(2):
    start = time.perf_counter()
    texts = {k: r.text for k, r in ex.transcribe_many([(c, c) for c in clips], options)}
    best = min(best, time.perf_counter() - start)
    start = time.perf_counter()
    ex.transcribe(single, options)
    best_one = min(best_one, time.perf_counter() - start)
    start = time.perf_counter()
    for clip in clips:
        ex.transcribe(clip, options)
    best_apart = min(best_apart, time.perf_counter() - start)
print(json.dumps({"seconds": best, "single_seconds": best_one, "apart_seconds": best_apart, "texts": texts}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    def __init__(self, *args: str) -> None:
        import httpx

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [str(BIN / "ferrum"), "serve", "--port", str(self.port), *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        for _ in range(600):
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError("ferrum serve did not become ready")

    def ask(self, path: str) -> tuple[str, float]:
        import httpx

        data = Path(path).read_bytes()
        start = time.perf_counter()
        response = httpx.post(
            self.url + "/v1/audio/transcriptions", files={"file": (Path(path).name, data)},
            data={"model": "whisper-1", "language": "en"}, timeout=600,
        )  # fmt: skip
        response.raise_for_status()
        return response.json()["text"], time.perf_counter() - start

    def load(self, clips: list[str], clients: int) -> dict:
        """The clips ROUNDS_OF_CLIPS times over `clients` concurrent clients."""
        requests = clips * ROUNDS_OF_CLIPS
        start = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            answers = list(pool.map(self.ask, requests))
        wall = time.perf_counter() - start
        latencies = sorted(seconds for _, seconds in answers)
        return {
            "seconds": wall,
            "requests": len(requests),
            "latency_p50": statistics.median(latencies),
            "latency_p95": latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))],
            "texts": dict(zip(requests, (text for text, _ in answers))),
        }

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def measure(clips: list[str], clip_seconds: float, single: str, console) -> tuple[list[dict], dict, dict]:
    """(rows, ratios, targets) for the server scenario."""
    out = subprocess.run(
        [sys.executable, "-c", IN_PROCESS, json.dumps(clips), single], capture_output=True, text=True, check=True
    ).stdout
    baseline = json.loads(out.splitlines()[-1])
    rows = [
        row("library, one process", 1, clip_seconds, len(clips), baseline["seconds"]),
        row("library, one process, one clip at a time", 1, clip_seconds, len(clips), baseline["apart_seconds"]),
    ]
    for r in rows:
        console.print(f"  server  {r['system']:<32} {r['audio_per_second']:>7} audio s/s")
    served = Served()
    try:
        single_seconds = min(served.ask(single)[1] for _ in range(3))
        by_clients = {}
        for clients in CONCURRENCY:
            by_clients[clients] = result = served.load(clips, clients)
            rows.append(row("ferrum serve", clients, clip_seconds * ROUNDS_OF_CLIPS, result["requests"], result))
            console.print(f"  server  {'ferrum serve, ' + str(clients) + ' clients':<32} "
                          f"{rows[-1]['audio_per_second']:>7} audio s/s  p50 {rows[-1]['latency_p50']} s  "
                          f"p95 {rows[-1]['latency_p95']} s")  # fmt: skip
    finally:
        served.stop()
    alone = Served("--no-share-batches")
    try:
        unshared = alone.load(clips, 16)
    finally:
        alone.stop()
    rows.append(row("ferrum serve --no-share-batches", 16, clip_seconds * ROUNDS_OF_CLIPS, unshared["requests"],
                    unshared))  # fmt: skip
    console.print(f"  server  {rows[-1]['system'] + ', 16 clients':<32} {rows[-1]['audio_per_second']:>7} audio s/s")
    same_text = all(by_clients[16]["texts"][c] == baseline["texts"][c] for c in clips)
    served_wer, library_wer = (clips_wer(clips, texts) for texts in (by_clients[16]["texts"], baseline["texts"]))
    library_rate = clip_seconds / baseline["seconds"]
    shared_rate = clip_seconds * ROUNDS_OF_CLIPS / by_clients[16]["seconds"]
    unshared_rate = clip_seconds * ROUNDS_OF_CLIPS / unshared["seconds"]
    ratios = {
        "serve 16 clients / library in one process": round(shared_rate / library_rate, 2),
        "serve 16 clients / --no-share-batches": round(shared_rate / unshared_rate, 2),
        "serve one clip idle / library": round(single_seconds / baseline["single_seconds"], 2),
        # what sharing batches can gain at most: the library itself, batched against one clip at a time
        "library batched / library one clip at a time": round(baseline["apart_seconds"] / baseline["seconds"], 2),
        # packed with whichever requests came with it, a clip may read a little differently than in the library's run
        "serve 16 clients text = library text": same_text,
        "serve 16 clients WER %": round(100 * served_wer, 2),
        "library WER %": round(100 * library_wer, 2),
        "serve 16 clients WER - library WER (points)": round(100 * (served_wer - library_wer), 2),
    }
    targets = {
        "serve 16 clients / library in one process": (">=", 0.8),
        "serve 16 clients / --no-share-batches": (">=", 2.0),
        "serve one clip idle / library": ("<=", 1.3),
        "serve 16 clients WER - library WER (points)": ("<=", 0.5),
    }
    return rows, ratios, targets


def clips_wer(clips: list[str], texts: dict) -> float:
    """The word error rate of the clips' texts together, against the corpus references."""
    from common import CORPUS, english_rows, wer

    refs = {str(CORPUS / r["file"]): r["reference_transcript"] for r in english_rows()}
    return wer(" ".join(refs[c] for c in clips), " ".join(texts[c] for c in clips))


def row(system: str, clients: int, audio_seconds: float, requests: int, result) -> dict:
    seconds = result if isinstance(result, float) else result["seconds"]
    out = {
        "scenario": "server",
        "system": system,
        "clients": clients,
        "requests": requests,
        "seconds": round(seconds, 2),
        "requests_per_second": round(requests / seconds, 2),
        "audio_per_second": round(audio_seconds / seconds, 1),
    }
    if not isinstance(result, float):
        out["latency_p50"], out["latency_p95"] = round(result["latency_p50"], 2), round(result["latency_p95"], 2)
    return out


if __name__ == "__main__":
    import wave

    from rich.console import Console

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import CORPUS, english_rows

    paths = [str(CORPUS / r["file"]) for r in english_rows()]

    def seconds_of(path: str) -> float:
        if path.endswith(".wav"):
            with wave.open(path) as w:
                return w.getnframes() / w.getframerate()
        from ferrum_cli.audio.ffmpeg import decode_file

        return len(decode_file(path).samples) / 16000

    total = sum(seconds_of(p) for p in paths)
    jfk = str(CORPUS / "en_jfk_inaugural_1961.flac")
    rows, ratios, targets = measure(paths, total, jfk, Console())
    print(json.dumps({"rows": rows, "ratios": ratios, "targets": targets}, indent=1))
