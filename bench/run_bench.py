"""`make bench`: ferrum side by side with openai-whisper and faster-whisper on the shared corpus.

Scenarios (the performance issue's): the English clips joined 6 times (about 603 s), the 12
English clips in one process, the cold start on the JFK clip, peak memory on a 10- and a
60-minute file, `ferrum serve` under concurrent clients (serve_bench.py) and the longform
through `--live` at real-time pace (live_bench.py) and through /v1/realtime from the openai
client (realtime_bench.py). Same audio, same base weights (the installed
pack), greedy decoding, language given. Every system runs in its own process; peak RSS is
that process's. The machines are noisy, so the systems of a scenario take turns, BENCH_ROUNDS
times (2), and the best time counts; WER is the mean over the runs (openai-whisper's fallback
sampling is not seeded, so its text changes from run to run). The figures go to
bench/results/latest.json. A benchmark, not a test: nothing here asserts a time.

The WER joins digits grouped only by spaces, commas or dashes before scoring, in the
reference and the text alike (scored_words). On the longform the bench also counts the copies
of the clips that each system left out (clips_missed). The same figures come for a second
joined file, the clips in reverse order 4 times (about 402 s): a check, with no target, that a WER
difference comes from the systems and not from the order of one file's clips.
On x86 CPUs the longform also runs `ferrum --compute int8`, the opt-in encoder, beside the
default; the targets judge the default. Where ../shared/bench/as_avx2.sh runs (root, Linux), the
longform and the 12 clips run again for ferrum and faster-whisper as on a CPU with AVX2 and
nothing newer, most users' CPUs (#36's targets judge both).

BENCH_DEVICE=cuda runs the same scenarios on a GPU: ferrum and openai-whisper in float16, and
faster-whisper in float16 where its CTranslate2 build can use the GPU. The targets are the CPU
issue's, so that run prints its ratios without them and writes bench/results/cuda.json.
BENCH_CORPUS names the corpus folder where ../shared/corpus is not beside the checkout, and
BENCH_RESULTS the file to write. BENCH_ONLY=files leaves out the server, live, realtime, cluster
and diarization scenarios (the first three run at real-time pace), as on a GPU lent for minutes.
"""

from __future__ import annotations

import atexit
import json
import operator
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import (
    CORPUS,
    DEVICE,
    RESULTS,
    ROOT,
    aligned,
    build_audio,
    ferrum_command,
    scored_words,
    wer,
)  # fmt: skip

AS_AVX2 = CORPUS.parent / "bench" / "as_avx2.sh"  # runs a command as on a CPU with AVX2 and nothing newer
ONLY_FILES = os.environ.get("BENCH_ONLY") == "files"  # transcribing files alone: what fits a short GPU lease
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "2"))  # runs of each system per scenario; the best time counts
TARGET_TESTS = {">=": operator.ge, "<=": operator.le, "<": operator.lt}  # how the summary judges a target (op, bound)


def build_models(work: Path, with_ct2: bool) -> dict:
    """The same weights for everyone: openai's .pt and a CTranslate2 folder, from the base pack."""
    import torch

    from ferrum_cli.weights.packs import PACKS, read_pack
    from ferrum_cli.weights.resolve import resolve

    weights = resolve("base")
    pt = work / "base.pt"
    torch.save({"dims": weights.dims, "model_state_dict": {k: v.float() for k, v in weights.state_dict.items()}}, pt)
    if not with_ct2:
        return {"pt": str(pt)}
    pack = next(p for p in PACKS if p.model == "base" and p.is_installed())
    data, config = read_pack(pack)
    ct2 = work / "ct2-base"
    ct2.mkdir()
    (ct2 / "model.bin").write_bytes(data)
    (ct2 / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "vocabulary.txt", "vocabulary.json"):
        from importlib.resources import files

        source = files(pack.config[0]).joinpath("data/" + name)
        if source.is_file():
            (ct2 / name).write_bytes(source.read_bytes())
    return {"pt": str(pt), "ct2": str(ct2)}


def run_measured(cmd: list[str]) -> tuple[str, float, int]:
    """(stdout, wall seconds, peak RSS bytes) of one process; the RSS is that child's own (wait4)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out_chunks = []
    import threading

    err_chunks: list[bytes] = []
    t_out = threading.Thread(target=lambda: out_chunks.append(proc.stdout.read()))
    t_err = threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()))
    t_out.start(), t_err.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    t_out.join(), t_err.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"bench: {shlex.join(cmd)[:200]} exited {proc.returncode}:\n{b''.join(err_chunks).decode()[-2000:]}")
    return b"".join(out_chunks).decode(), wall, usage.ru_maxrss * 1024


DIGIT_CLIP = "en_digits_"  # one spoken number: a digit wrong is the whole clip's one word wrong


def _overlap(start: float, end: float, other_start: float, other_end: float) -> float:
    return max(0.0, min(end, other_end) - max(start, other_start))


def clips_missed(layout: list[tuple[str, float, float]], refs: dict, segments: list) -> list[str]:
    """The copies of clips in the longform that a system left out: fewer than a quarter of a
    copy's reference words found in its text, in order (a misread sentence keeps more). The
    digit-string clip, one word that a digit wrong misses whole, is left out when no
    segment covers half a second of it."""
    words, owner = [], []
    for k, (clip, _, _) in enumerate(layout):
        clip_words = scored_words(refs[clip])
        words += clip_words
        owner += [k] * len(clip_words)
    _, found = aligned(words, scored_words(" ".join(text for _, _, text in segments)))
    missed = []
    for k, (clip, start, end) in enumerate(layout):
        if DIGIT_CLIP in clip:
            left_out = not any(_overlap(start, end, s, e) >= min(0.5, (end - start) / 2) for s, e, _ in segments)
        else:
            hits = [f for f, o in zip(found, owner) if o == k]
            left_out = sum(hits) < len(hits) / 4
        if left_out:
            missed.append(f"{Path(clip).stem} at {start:.0f} s")
    return missed


def avx2_emulation() -> str | None:
    """Why as_avx2.sh cannot run here (it needs root and Linux), or None when it can."""
    if not AS_AVX2.exists():
        return f"{AS_AVX2} is absent"
    probe = subprocess.run([str(AS_AVX2), "true"], capture_output=True, text=True)
    return f"{AS_AVX2.name} does not run here: {probe.stderr.strip()[:200]}" if probe.returncode else None


def faster_whisper_runs() -> str | None:
    """Why faster-whisper cannot run on DEVICE, or None when it can."""
    try:
        import ctranslate2
    except ImportError:
        return "faster-whisper is not installed (make bench installs it)"
    if DEVICE.startswith("cuda") and ctranslate2.get_cuda_device_count() == 0:
        return "this CTranslate2 build sees no CUDA device"
    return None


def cpu_description() -> str:
    """Model name and the widest vector unit torch uses: the same code runs 5x apart across these."""
    import torch

    from ferrum_cli.engine.encoder import cpu_auto_compute
    from ferrum_cli.platform.cpu import cpu_has_native_bf16, cpu_name

    bf16 = ", bfloat16 instructions" if cpu_has_native_bf16() else ""
    return f"{cpu_name()} ({torch.backends.cpu.get_cpu_capability()}{bf16}; ferrum computes in {cpu_auto_compute()})"


def gpu_name() -> str | None:
    if DEVICE == "cpu":
        return None
    import torch

    return torch.cuda.get_device_name(DEVICE) if DEVICE.startswith("cuda") else DEVICE


def ferrum(inputs: list[str], work: Path, *extra: str, wrap: tuple[str, ...] = ()) -> tuple[dict, dict, float, int]:
    """wrap: a command that runs ferrum's (as_avx2.sh)."""
    out = Path(tempfile.mkdtemp(dir=work))
    cmd = [*wrap, *ferrum_command(), "transcribe", *inputs, "--language", "en", "--device", DEVICE]
    cmd += ["-o", str(out), "-q", "-f", "txt", "-f", "json", *extra]
    _, wall, rss = run_measured(cmd)
    texts = {i: (out / (Path(i).stem + ".txt")).read_text(encoding="utf-8") for i in inputs}
    segments = {}
    for i in inputs:
        doc = json.loads((out / (Path(i).stem + ".json")).read_text(encoding="utf-8"))
        segments[i] = [[s["start"], s["end"], s["text"]] for s in doc["segments"]]
    return texts, segments, wall, rss


def peer(
    system: str, model: str, inputs: list[str], *extra: str, wrap: tuple[str, ...] = ()
) -> tuple[dict, dict, float, int, float]:
    cmd = [
        *wrap,
        sys.executable,
        str(ROOT / "bench" / "peers.py"),
        system,
        "--model",
        model,
        "--language",
        "en",
        "--device",
        DEVICE,
        *extra,
        *inputs,
    ]
    out, wall, rss = run_measured(cmd)
    doc = json.loads(out)
    return doc["texts"], doc["segments"], doc["seconds"], rss, wall


def main() -> None:
    if not (CORPUS / "manifest.tsv").exists():
        sys.exit(f"bench: the shared corpus is not at {CORPUS}")
    from rich.console import Console
    from rich.table import Table

    console = Console() if sys.stdout.isatty() else Console(width=120)  # a log keeps table rows whole
    work = Path(tempfile.mkdtemp(prefix="ferrum_bench_"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)  # its wavs and checkpoints: about 430 MB
    no_faster = faster_whisper_runs()
    audio, models = build_audio(work), build_models(work, with_ct2=no_faster is None)
    rows: list[dict] = []
    on_cpu = DEVICE == "cpu"
    openai_name = "openai-whisper fp32" if on_cpu else "openai-whisper fp16"
    faster_name = "faster-whisper int8" if on_cpu else "faster-whisper fp16"
    if no_faster:
        console.print(f"faster-whisper skipped: {no_faster}")

    def record(scenario, system, audio_s, runs, ref=None, note=""):
        """runs: (text, seconds, peak RSS bytes, segments of a single input) of each run: the best
        time, the worst RSS, the mean WER; on a joined file, what each run left out."""
        seconds = min(r[1] for r in runs)
        wers = [wer(ref, r[0]) for r in runs] if ref else []
        row = {
            "scenario": scenario,
            "system": system,
            "audio_seconds": round(audio_s, 1),
            "seconds": round(seconds, 2),
            "x_realtime": round(audio_s / seconds, 1),
            "peak_rss_mb": round(max(r[2] for r in runs) / 2**20),
            "wer": round(sum(wers) / len(wers), 4) if wers else None,
            "runs": len(runs),
            "seconds_each": [round(r[1], 2) for r in runs],
            "wer_each": [round(w, 4) for w in wers],
            "note": note,
        }
        if layout := audio["layouts"].get(scenario):
            row["clips_missed_each"] = [clips_missed(layout, audio["clip_refs"], r[3]) for r in runs]
            row["clips_missed"] = max(len(m) for m in row["clips_missed_each"])
        rows.append(row)
        console.print(
            f"  {scenario:<12} {system:<28} {row['x_realtime']:>6}x  {row['seconds']:>7.2f} s  "
            f"WER {row['wer'] if row['wer'] is not None else '-'}  RSS {row['peak_rss_mb']} MB  "
            f"runs {row['seconds_each']}" + (f"  missed {row['clips_missed_each']}" if "clips_missed" in row else "")
        )

    def rounds(scenario, audio_s, ref, systems, count):
        """Each system `count` times, taking turns, so that a slow spell of the machine hits all of them."""
        runs = {name: [] for name, _, _ in systems}
        for _ in range(count):
            for name, _, run in systems:
                runs[name].append(run())
        for name, note, _ in systems:
            record(scenario, name, audio_s, runs[name], ref, note)

    def in_order(texts: dict, inputs: list[str]) -> str:
        """One text per run, the inputs' texts in input order, to score against the joined references."""
        return " ".join(texts[i] for i in inputs)

    def ferrum_run(inputs, *extra, wrap=()):
        def run():
            texts, segments, wall, rss = ferrum(inputs, work, *extra, wrap=wrap)
            return in_order(texts, inputs), wall, rss, segments[inputs[0]]

        return run

    def peer_run(system, model, inputs, *extra, whole=False, wrap=()):
        def run():
            texts, segments, secs, rss, wall = peer(system, model, inputs, *extra, wrap=wrap)
            return in_order(texts, inputs), wall if whole else secs, rss, segments[inputs[0]]

        return run

    lf, lf_s, lf_ref = audio["longform"], audio["longform_seconds"], audio["longform_ref"]
    from ferrum_cli.platform.cpu import int8_available

    with_int8 = on_cpu and int8_available()  # opt-in, so shown beside the default, not in the targets
    console.print(f"[b]longform[/b] ({lf_s:.0f} s): the 12 English clips joined 6 times, best time of {ROUNDS}")
    whole, only = "whole process, model load included", "transcribe() only"
    rounds(
        "longform",
        lf_s,
        lf_ref,
        [
            ("ferrum", whole, ferrum_run([lf])),
            *([("ferrum --compute int8", whole, ferrum_run([lf], "--compute", "int8"))] if with_int8 else []),
            (openai_name, only, peer_run("openai", models["pt"], [lf])),
            *(
                []
                if no_faster
                else [
                    (faster_name, only, peer_run("faster", models["ct2"], [lf])),
                    (faster_name + " batch 8", only, peer_run("faster", models["ct2"], [lf], "--batch", "8")),
                ]
            ),
        ],
        ROUNDS,
    )

    rev, rev_s = audio["reversed"], audio["reversed_seconds"]
    console.print(
        f"[b]reversed[/b] ({rev_s:.0f} s): the same clips in reverse order, 4 times, so that each"
        " follows another clip: the WER columns, not the times"
    )
    console.print(f"[b]longform with word timestamps[/b] ({lf_s:.0f} s), best time of {ROUNDS}")
    rounds(
        "longform words",
        lf_s,
        lf_ref,
        [
            ("ferrum --word-timestamps", whole, ferrum_run([lf], "--word-timestamps")),
            (openai_name + " words", only, peer_run("openai", models["pt"], [lf], "--word-timestamps")),
        ],
        ROUNDS,
    )
    rounds(
        "reversed",
        rev_s,
        audio["reversed_ref"],
        [("ferrum", whole, ferrum_run([rev])), (openai_name, only, peer_run("openai", models["pt"], [rev]))],
        ROUNDS,
    )

    clips, clip_s = audio["clips"], audio["clip_seconds"]
    clip_ref = " ".join(audio["clip_refs"][c] for c in clips)
    console.print(f"[b]12 clips[/b] ({clip_s:.1f} s) in one process, best time of {ROUNDS}")
    rounds(
        "12 clips",
        clip_s,
        clip_ref,
        [
            ("ferrum", whole, ferrum_run(clips)),
            (openai_name, only, peer_run("openai", models["pt"], clips)),
            *([] if no_faster else [(faster_name, only, peer_run("faster", models["ct2"], clips))]),
        ],
        ROUNDS,
    )

    console.print(f"[b]12 clips, beam search[/b] ({clip_s:.1f} s), 5 beams (the whisper CLI's and faster-whisper's"
                  f" default), best time of {ROUNDS}")  # fmt: skip
    rounds(
        "12 clips beam 5",
        clip_s,
        clip_ref,
        [
            ("ferrum", whole, ferrum_run(clips, "--beam-size", "5")),
            (openai_name, only, peer_run("openai", models["pt"], clips, "--beam", "5")),
            *([] if no_faster else [(faster_name, only, peer_run("faster", models["ct2"], clips, "--beam", "5"))]),
        ],
        ROUNDS,
    )

    no_avx2 = avx2_emulation() if on_cpu and not no_faster else "not on the CPU, or without faster-whisper"
    if no_avx2 is None:
        avx2 = (str(AS_AVX2),)
        console.print("[b]AVX2[/b]: the longform and the 12 clips again, as on a CPU with AVX2 and nothing newer"
                      f" ({AS_AVX2.name}), ferrum and faster-whisper, best time of {ROUNDS}")  # fmt: skip
        rounds(
            "longform avx2",
            lf_s,
            lf_ref,
            [
                ("ferrum", whole, ferrum_run([lf], wrap=avx2)),
                (faster_name + " batch 8", only, peer_run("faster", models["ct2"], [lf], "--batch", "8", wrap=avx2)),
            ],
            ROUNDS,
        )
        rounds(
            "12 clips avx2",
            clip_s,
            clip_ref,
            [
                ("ferrum", whole, ferrum_run(clips, wrap=avx2)),
                (faster_name, only, peer_run("faster", models["ct2"], clips, wrap=avx2)),
            ],
            ROUNDS,
        )
    else:
        console.print(f"AVX2 skipped: {no_avx2}")

    console.print("[b]cold start[/b]: the 11 s JFK clip, whole process, best of 3")
    jfk = audio["jfk"]
    rounds(
        "cold start",
        11.0,
        None,
        [
            ("ferrum", "whole process", ferrum_run([jfk])),
            (openai_name, "whole process", peer_run("openai", models["pt"], [jfk], whole=True)),
        ],
        3,
    )

    console.print("[b]memory[/b]: peak RSS on 10 and 60 minutes")
    rounds("60 minutes", audio["sixty_seconds"], None, [("ferrum", "whole process", ferrum_run([audio["sixty"]]))], 1)

    server_rows, live_row, realtime_row, cluster_rows, diarize_rows = [], None, None, [], []
    more_ratios, more_targets = {}, {}  # of the scenarios below
    if ONLY_FILES:
        console.print("BENCH_ONLY=files: the server, live, realtime, cluster and diarization scenarios skipped")
    else:
        console.print("[b]server[/b]: the 12 clips to ferrum serve from 1, 4 and 16 clients (serve_bench.py)")
        from serve_bench import measure as measure_server

        server_rows, server_ratios, server_targets = measure_server(
            [str(c) for c in clips], clip_s, str(audio["jfk"]), console
        )

        console.print(f"[b]live[/b]: the longform through --live from a real-time pacer ({lf_s:.0f} s, live_bench.py)")
        from live_bench import measure as measure_live

        live_row, live_ratios, live_targets = measure_live(
            ferrum_command(), lf, audio["layouts"]["longform"], lf_ref, wer, console,
            (audio["reversed"], audio["reversed_ref"]),
        )  # fmt: skip

        console.print(f"[b]realtime[/b]: the longform to /v1/realtime from the openai client at real time"
                      f" ({lf_s:.0f} s, realtime_bench.py)")  # fmt: skip
        from realtime_bench import measure as measure_realtime
        from serve_bench import Served

        from ferrum_cli.audio.ffmpeg import decode_file

        served = Served()
        try:
            realtime_row, realtime_ratios, realtime_targets = measure_realtime(
                served.url, decode_file(lf).samples, audio["layouts"]["longform"], lf_ref, wer, console
            )
        finally:
            served.stop()

        console.print(
            "[b]cluster[/b]: the longform and the 12 clips, --cluster local with one worker (cluster_bench.py)"
        )
        from cluster_bench import measure as measure_cluster

        cluster_rows, cluster_ratios, cluster_targets = measure_cluster(ferrum_command(), [lf, *clips], console)

        console.print("[b]diarization[/b]: --diarize on the corpus's diarization folder, scored (diarize_bench.py)")
        from diarize_bench import measure as measure_diarization

        diarize_rows, diarize_ratios, diarize_targets = measure_diarization(ferrum_command(), console)
        more_ratios = server_ratios | live_ratios | realtime_ratios | cluster_ratios | diarize_ratios
        more_targets = server_targets | live_targets | realtime_targets | cluster_targets | diarize_targets

    by = {(r["scenario"], r["system"]): r for r in rows}
    ours = by[("longform", "ferrum")]

    def speedup(peer_name: str) -> float | None:
        peer_row = by.get(("longform", peer_name))
        return round(ours["x_realtime"] / peer_row["x_realtime"], 2) if peer_row else None

    def versus(scenario: str, peer_name: str) -> float | None:
        """ferrum's speed over a peer's in a scenario, None where the peer did not run."""
        mine, theirs = by.get((scenario, "ferrum")), by.get((scenario, peer_name))
        return round(mine["x_realtime"] / theirs["x_realtime"], 2) if mine and theirs else None

    def ferrum_minus_openai(scenario: str, figure: str) -> float:
        return round(by[(scenario, "ferrum")][figure] - by[(scenario, openai_name)][figure], 4)

    def avx2_minus_openai(scenario: str) -> float | None:
        """ferrum's WER under as_avx2.sh less openai-whisper's natively (its text is the CPU's own)."""
        mine = by.get((scenario + " avx2", "ferrum"))
        return round(mine["wer"] - by[(scenario, openai_name)]["wer"], 4) if mine else None

    ratios = {
        "longform x_realtime": ours["x_realtime"],
        "longform vs openai-whisper": speedup(openai_name),
        "longform vs faster-whisper": speedup(faster_name),
        "longform vs faster-whisper batched": speedup(faster_name + " batch 8"),
        "longform WER ferrum - openai": ferrum_minus_openai("longform", "wer"),
        "longform clip copies missed by ferrum": ours["clips_missed"],
        "longform --word-timestamps / without": round(
            by[("longform words", "ferrum --word-timestamps")]["x_realtime"] / ours["x_realtime"], 2
        ),
        "longform --word-timestamps vs openai-whisper words": round(
            by[("longform words", "ferrum --word-timestamps")]["x_realtime"]
            / by[("longform words", openai_name + " words")]["x_realtime"],
            2,
        ),
        "reversed WER ferrum - openai": ferrum_minus_openai("reversed", "wer"),
        "reversed clip copies missed by ferrum": by[("reversed", "ferrum")]["clips_missed"],
        "12 clips x_realtime": by[("12 clips", "ferrum")]["x_realtime"],
        "12 clips vs faster-whisper": versus("12 clips", faster_name),
        "12 clips WER ferrum - openai": ferrum_minus_openai("12 clips", "wer"),
        "12 clips beam 5 vs openai-whisper": versus("12 clips beam 5", openai_name),
        "12 clips beam 5 vs faster-whisper": versus("12 clips beam 5", faster_name),
        "12 clips beam 5 WER ferrum - openai": ferrum_minus_openai("12 clips beam 5", "wer"),
        "AVX2: longform vs faster-whisper batched": versus("longform avx2", faster_name + " batch 8"),
        "AVX2: 12 clips vs faster-whisper": versus("12 clips avx2", faster_name),
        "AVX2: longform WER ferrum - openai": avx2_minus_openai("longform"),
        "AVX2: 12 clips WER ferrum - openai": avx2_minus_openai("12 clips"),
        "cold start seconds": by[("cold start", "ferrum")]["seconds"],
        "60 min peak RSS MB": by[("60 minutes", "ferrum")]["peak_rss_mb"],
        "60 min / 10 min peak RSS": round(by[("60 minutes", "ferrum")]["peak_rss_mb"] / ours["peak_rss_mb"], 2),
    }
    targets = {
        "longform x_realtime": (">=", 40),
        "longform vs openai-whisper": (">=", 4.5),
        "longform vs faster-whisper batched": (">=", 1.5),  # #36 (1.25 before)
        "longform WER ferrum - openai": ("<=", 0.0),
        "longform clip copies missed by ferrum": ("<=", 0),
        "longform --word-timestamps / without": (">=", 0.7),
        "longform --word-timestamps vs openai-whisper words": (">=", 3.0),
        "12 clips x_realtime": (">=", 15),
        "12 clips vs faster-whisper": (">=", 2.0),  # #36, natively and under AVX2, at openai-whisper's WER or below
        "12 clips WER ferrum - openai": ("<=", 0.0),
        "12 clips beam 5 WER ferrum - openai": ("<=", 0.0),
        "AVX2: longform vs faster-whisper batched": (">=", 1.5),
        "AVX2: 12 clips vs faster-whisper": (">=", 2.0),
        "AVX2: longform WER ferrum - openai": ("<=", 0.0),
        "AVX2: 12 clips WER ferrum - openai": ("<=", 0.0),
        "cold start seconds": ("<=", 2.5),
        "60 min peak RSS MB": ("<=", 1536),
        "60 min / 10 min peak RSS": ("<=", 1.10),
    }
    ratios |= more_ratios
    targets |= more_targets
    if not on_cpu:
        targets = {}  # the targets are for the CPU
    table = Table(title=f"ferrum bench (base, greedy where no beams are named, language given, {DEVICE})")
    columns = ("scenario", "system", "x real time", "seconds", "WER", "missed")
    for col in (*columns, "peak RSS"):
        table.add_column(col, justify="right" if col not in ("scenario", "system") else "left")
    for r in rows:
        table.add_row(
            r["scenario"],
            r["system"],
            f"{r['x_realtime']}x",
            f"{r['seconds']:.2f}",
            "-" if r["wer"] is None else f"{r['wer'] * 100:.1f}%",
            str(r["clips_missed"]) if "clips_missed" in r else "-",
            f"{r['peak_rss_mb']} MB",
        )
    console.print(table)
    served = Table(title="ferrum serve (base, language en, the 12 clips twice)")
    for col in ("system", "clients", "requests/s", "audio s/s", "p50 s", "p95 s"):
        served.add_column(col, justify="left" if col == "system" else "right")
    for r in server_rows:
        served.add_row(r["system"], str(r["clients"]), str(r["requests_per_second"]), str(r["audio_per_second"]),
                       str(r.get("latency_p50", "-")), str(r.get("latency_p95", "-")))  # fmt: skip
    console.print(served)
    summary = Table(title="ratios and targets")
    for col in ("figure", "value", "target", "met"):
        summary.add_column(col)
    for key, value in ratios.items():
        if value is None:
            continue
        op, bound = targets.get(key, ("", None))
        met = "" if bound is None else ("yes" if TARGET_TESTS[op](value, bound) else "NO")
        summary.add_row(key, str(value), f"{op} {bound}" if bound is not None else "", met)
    console.print(summary)
    RESULTS.mkdir(parents=True, exist_ok=True)
    doc = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "device": DEVICE,
        "accelerator": gpu_name(),
        "machine": platform.processor() or platform.machine(),
        "cpu": cpu_description(),
        "cpus": os.cpu_count(),
        "rows": rows,
        "server_rows": server_rows,
        "live_row": live_row,
        "realtime_row": realtime_row,
        "cluster_rows": cluster_rows,
        "diarization_rows": diarize_rows,
        "ratios": ratios,
    }
    if no_faster:
        doc["faster_whisper_skipped"] = no_faster
    target = Path(os.environ.get("BENCH_RESULTS") or RESULTS / ("latest.json" if on_cpu else "cuda.json"))
    target.write_text(json.dumps(doc, indent=1) + "\n")
    console.print(f"written {target}")


if __name__ == "__main__":
    main()
