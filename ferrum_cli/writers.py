"""Output writers: openai-whisper's txt, srt, vtt, tsv and json, plus jsonl; all written atomically."""

from __future__ import annotations

import io
import json
import math
import os
from pathlib import Path
from typing import IO

from .errors import OutputError, UsageError
from .platform.files import atomic_write_bytes
from .results import Segment, Transcription

FORMATS = ("txt", "srt", "vtt", "json", "tsv", "jsonl")


def parse_formats(values: list[str]) -> list[str]:
    """Repeatable and comma-separated; 'all' means every format."""
    out: list[str] = []
    for value in values:
        for item in value.split(","):
            item = item.strip().lower()
            if item == "all":
                out.extend(FORMATS)
            elif item in FORMATS:
                out.append(item)
            elif item:
                raise UsageError(f"unknown output format {item!r}; choose from {', '.join(FORMATS)} or all")
    return list(dict.fromkeys(out)) or ["txt"]


def strict_json(value, **kwargs) -> str:
    """JSON that strict parsers read: an infinite or NaN float (an option such as
    max_speech_duration_s=inf) is written as null, never as Infinity."""
    return json.dumps(_finite(value), ensure_ascii=False, allow_nan=False, **kwargs)


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def segment_json(segment: Segment, language: str | None = None) -> str:
    record = segment.to_dict() if language is None else {**segment.to_dict(), "language": language}
    return strict_json(record)


def render(result: Transcription, fmt: str, layout: dict | None = None) -> str:
    """The text of one format. layout: max_line_width, max_line_count, max_words_per_line, highlight_words."""
    if fmt == "jsonl":
        return "".join(segment_json(s, result.language) + "\n" for s in result.segments)
    if fmt == "json":
        return strict_json(result.to_dict()) + "\n"
    if fmt == "txt":
        return "".join(s.text.strip() + "\n" for s in result.segments)
    from whisper.utils import WriteSRT, WriteTSV, WriteVTT

    writer_cls = {"srt": WriteSRT, "vtt": WriteVTT, "tsv": WriteTSV}[fmt]
    buffer: IO[str] = io.StringIO()
    options = {"max_line_width": None, "max_line_count": None, "highlight_words": False, "max_words_per_line": None}
    options.update({k: v for k, v in (layout or {}).items() if v is not None})
    writer_cls(".").write_result(result.to_dict(), buffer, options)
    return buffer.getvalue()


def output_paths(output_dir: Path, relative: os.PathLike[str] | str, formats: list[str]) -> dict[str, Path]:
    base = output_dir / Path(relative)
    return {fmt: base.with_name(f"{base.name}.{fmt}") for fmt in formats}


def check_inside(output_dir: Path, path: Path) -> None:
    """Refuse any output that would land outside -o (through '..' or a symlinked folder)."""
    root = output_dir.resolve()
    target = path.parent.resolve() / path.name
    if root != target and root not in target.parents:
        raise OutputError(f"output {path} would land outside {output_dir}")


def write_atomic(path: Path, text: str) -> None:
    try:
        atomic_write_bytes(path, text.encode("utf-8"))
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None


def ensure_writable_dir(output_dir: Path) -> None:
    """Fail before any model work when -o cannot be written."""
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create output folder {output_dir}: {exc.strerror or exc}") from None
    if not os.access(output_dir, os.W_OK | os.X_OK):
        raise OutputError(f"output folder {output_dir} is not writable")
