"""Run a peer system over audio files in this process and print JSON: texts, segments and seconds.

    python bench/peers.py openai  --model base.pt  --language en [--device cuda] [--word-timestamps] a.wav
    python bench/peers.py faster  --model ct2_dir  --language en [--batch 8] a.wav
    ... [--beam 5]: beam search (greedy by default)

Seconds count transcription only, not the model load, as ../shared/bench/asr_eval.py does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def ffmpeg_on_path() -> None:
    """openai-whisper and faster-whisper call `ffmpeg` by name; give them ferrum's."""
    import tempfile

    from ferrum_cli.audio.ffmpeg import find_ffmpeg

    folder = tempfile.mkdtemp(prefix="bench_ffmpeg_")
    os.symlink(find_ffmpeg().path, os.path.join(folder, "ffmpeg"))
    os.environ["PATH"] = folder + os.pathsep + os.environ.get("PATH", "")


def run_openai(args) -> tuple[dict, float, float]:
    import torch
    import whisper

    t0 = time.perf_counter()
    checkpoint = torch.load(args.model, map_location="cpu", weights_only=True)
    model = whisper.model.Whisper(whisper.model.ModelDimensions(**checkpoint["dims"]))
    model.load_state_dict(checkpoint["model_state_dict"])
    model.to(args.device)  # as whisper.load_model does: float32 weights, float16 compute on a GPU
    loaded = time.perf_counter()
    texts, segments = {}, {}
    for path in args.files:
        result = model.transcribe(
            path,
            language=args.language,
            fp16=args.device != "cpu",
            word_timestamps=args.word_timestamps,
            beam_size=args.beam if args.beam > 1 else None,
        )
        texts[path] = result["text"]
        segments[path] = [[s["start"], s["end"], s["text"]] for s in result["segments"]]
    return texts, segments, loaded - t0, time.perf_counter() - loaded


def run_faster(args) -> tuple[dict, float, float]:
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    t0 = time.perf_counter()
    on_cpu = args.device == "cpu"
    model = WhisperModel(args.model, device=args.device.split(":")[0], compute_type="int8" if on_cpu else "float16")
    engine = BatchedInferencePipeline(model) if args.batch else model
    loaded = time.perf_counter()
    extra = {"batch_size": args.batch} if args.batch else {}
    texts, segments = {}, {}
    for path in args.files:
        found, _ = engine.transcribe(path, beam_size=args.beam, language=args.language, **extra)
        segments[path] = [[s.start, s.end, s.text] for s in found]
        texts[path] = "".join(text for _, _, text in segments[path])
    return texts, segments, loaded - t0, time.perf_counter() - loaded


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("system", choices=["openai", "faster"])
    parser.add_argument("--model", required=True)
    parser.add_argument("--language")
    parser.add_argument("--batch", type=int, default=0)
    parser.add_argument("--beam", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--word-timestamps", action="store_true", help="openai: word_timestamps=True")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    ffmpeg_on_path()
    texts, segments, load_s, run_s = (run_openai if args.system == "openai" else run_faster)(args)
    json.dump({"texts": texts, "segments": segments, "load_seconds": load_s, "seconds": run_s}, sys.stdout)


if __name__ == "__main__":
    main()
