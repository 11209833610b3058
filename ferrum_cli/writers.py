"""Output writers, one table of them (WRITERS): txt, openai-whisper's srt, vtt and tsv, json,
jsonl and rttm; each knows its media type and whether it streams. All are written atomically.
A diarized transcription carries its speakers into every format (docs/diarization.md)."""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import IO

from .errors import OutputError, UsageError
from .platform.files import atomic_write_bytes
from .results import Segment, Transcription


@dataclass(frozen=True)
class SubtitleLayout:
    """How srt and vtt cues are cut into lines (openai-whisper's options); each needs word times."""

    max_line_width: int | None = None  # characters in a line
    max_line_count: int | None = None  # lines in a cue
    max_words_per_line: int | None = None
    highlight_words: bool = False  # underline each word as it is spoken

    def given(self) -> list[str]:
        """The options set, as the CLI names them."""
        return ["--" + f.name.replace("_", "-") for f in fields(self) if getattr(self, f.name) not in (None, False)]


@dataclass(frozen=True)
class Writer:
    """One output format: what it writes, and how it is served."""

    name: str  # the -f name and the file's extension
    media_type: str  # its HTTP Content-Type
    streams: bool  # a line per segment: it can be written out as segments are decoded
    write: Callable[[Transcription, SubtitleLayout], str]


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


def segment_json(segment: Segment, language: str | None = None, input_name: str | None = None) -> str:
    """A jsonl line's record: the segment, its input's language, and the input's name where one
    stdout carries several inputs."""
    record = segment.to_dict() if language is None else {**segment.to_dict(), "language": language}
    return strict_json(record if input_name is None else {"input": input_name, **record})


SPEAKER_MARK = "[{}] ".format  # a speaker's label before their text in txt and srt, streamed or written whole


def segment_line(segment: Segment, fmt: str, language: str | None = None) -> str:
    """One segment in a format that streams (WRITERS[fmt].streams), as it is decoded."""
    if fmt == "jsonl":
        return segment_json(segment, language) + "\n"
    return (SPEAKER_MARK(segment.speaker) if segment.speaker else "") + segment.text.strip() + "\n"


JSON_FORMATS = ("json", "jsonl")
LINE_FORMATS = (*JSON_FORMATS, "rttm")  # a record a line, told apart by its shape: several share a stream


def named_json(result: Transcription, fmt: str, name: str) -> str:
    """json or jsonl whose records each name their input ("input"): several inputs on one stdout
    stay one stream that a JSON reader takes (jq, json.loads line by line)."""
    if fmt == "json":
        return strict_json({"input": name, **result.to_dict()}) + "\n"
    return "".join(segment_json(s, result.language, name) + "\n" for s in result.segments)


def _txt(result: Transcription, layout: SubtitleLayout) -> str:
    if not result.turns:
        return "".join(segment_line(s, "txt") for s in result.segments)
    lines: list[tuple[str | None, list[str]]] = []  # one line per turn: a speaker's segments in a row
    for segment in result.segments:
        if lines and lines[-1][0] == segment.speaker:
            lines[-1][1].append(segment.text.strip())
        else:
            lines.append((segment.speaker, [segment.text.strip()]))
    return "".join(f"{SPEAKER_MARK(speaker)}{' '.join(texts)}\n" for speaker, texts in lines)


def _jsonl(result: Transcription, layout: SubtitleLayout) -> str:
    return "".join(segment_line(s, "jsonl", result.language) for s in result.segments)


def _json(result: Transcription, layout: SubtitleLayout) -> str:
    return strict_json(result.to_dict()) + "\n"


def _openai_whisper(
    writer: str, mark: Callable[[str], str], escaped: Callable[[str], str] = str
) -> Callable[[Transcription, SubtitleLayout], str]:
    """openai-whisper's own srt or vtt writer; a segment's speaker marked at the start of its text
    (of its first word, where words are laid out into lines), the text escaped as the format needs."""

    def write(result: Transcription, layout: SubtitleLayout) -> str:
        from whisper import utils

        doc = result.to_dict()
        for segment in doc["segments"]:
            segment["text"] = escaped(segment["text"])
            for word in segment.get("words") or ():
                word["word"] = escaped(word["word"])
            if speaker := segment.get("speaker"):
                segment["text"] = mark(speaker) + segment["text"].strip()
                if segment.get("words"):
                    segment["words"][0]["word"] = mark(speaker) + segment["words"][0]["word"].strip()
        subtitles = getattr(utils, writer)(".")
        marks = [mark(name) for name in dict.fromkeys(s["speaker"] for s in doc["segments"] if s.get("speaker"))]
        if marks:
            cues = subtitles.iterate_result
            subtitles.iterate_result = lambda *args, **kwargs: _with_speakers(cues(*args, **kwargs), marks)
        buffer: IO[str] = io.StringIO()
        subtitles.write_result(doc, buffer, asdict(layout))
        return buffer.getvalue()

    return write


def _with_speakers(cues: Iterable[tuple[str, str, str]], marks: list[str]) -> Iterator[tuple[str, str, str]]:
    """Every cue opens with its speaker's mark: a segment cut into several cues by the line
    options marked only its first, and a highlighted first word took the mark into its <u>."""
    speaking = ""
    for start, end, text in cues:
        for marked in marks:
            text = text.replace("<u>" + marked, marked + "<u>")
        if speaking and not any(text.startswith(marked) for marked in marks):
            text = speaking + text
        speaking = max(marks, key=text.rfind) if any(marked in text for marked in marks) else speaking
        yield start, end, text


def vtt_escaped(text: str) -> str:
    """Text as a WebVTT cue holds it: a bare '&', '<' or '>' (or '-->') would read as markup."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _tsv(result: Transcription, layout: SubtitleLayout) -> str:
    """openai-whisper's tsv (start and end in milliseconds); diarized, a speaker column before the text."""
    if not result.turns:
        return _openai_whisper("WriteTSV", str)(result, layout)
    rows = ["start\tend\tspeaker\ttext"]
    for s in result.segments:
        text = s.text.strip().replace("\t", " ")
        rows.append(f"{round(1000 * s.start)}\t{round(1000 * s.end)}\t{s.speaker}\t{text}")
    return "\n".join(rows) + "\n"


def _rttm(result: Transcription, layout: SubtitleLayout) -> str:
    """Who spoke when, as evaluation tools read it: a line per turn, the input's name as its file id."""
    file_id = "_".join((result.name or "audio").split()) or "audio"
    return "".join(
        f"SPEAKER {file_id} 1 {t.start:.3f} {t.end - t.start:.3f} <NA> <NA> {'_'.join(t.speaker.split())} <NA> <NA>\n"
        for t in result.turns
    )


WRITERS: dict[str, Writer] = {
    writer.name: writer
    for writer in (
        Writer("txt", "text/plain; charset=utf-8", True, _txt),
        Writer("srt", "application/x-subrip; charset=utf-8", False, _openai_whisper("WriteSRT", SPEAKER_MARK)),
        Writer(
            "vtt",
            "text/vtt; charset=utf-8",
            False,
            _openai_whisper("WriteVTT", lambda name: f"<v {vtt_escaped(name)}>", vtt_escaped),
        ),
        Writer("json", "application/json", False, _json),
        Writer("tsv", "text/tab-separated-values; charset=utf-8", False, _tsv),
        Writer("jsonl", "application/x-ndjson", True, _jsonl),
        Writer("rttm", "text/plain; charset=utf-8", False, _rttm),
    )
}
FORMATS = tuple(WRITERS)  # the one list of output formats
SPEAKER_FORMATS = ("rttm",)  # only a diarized transcription has them


def parse_formats(values: list[str], diarize: bool = False) -> list[str]:
    """Repeatable and comma-separated; 'all' means every format (rttm only with diarization)."""
    out: list[str] = []
    for value in values:
        for item in value.split(","):
            item = item.strip().lower()
            if item == "all":
                out.extend(f for f in FORMATS if diarize or f not in SPEAKER_FORMATS)
            elif item in SPEAKER_FORMATS and not diarize:
                raise UsageError(f"-f {item} writes who spoke when: it needs --diarize")
            elif item in FORMATS:
                out.append(item)
            elif item:
                raise UsageError(f"unknown output format {item!r}; choose from {', '.join(FORMATS)} or all")
    return list(dict.fromkeys(out)) or ["txt"]


def render(result: Transcription, fmt: str, layout: SubtitleLayout = SubtitleLayout()) -> str:
    """The text of one format (a library caller's srt: render(result, "srt"))."""
    if fmt not in WRITERS:
        raise UsageError(f"unknown output format {fmt!r}; choose {', '.join(FORMATS)}")
    return WRITERS[fmt].write(result, layout)


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
        atomic_write_bytes(path, text.encode("utf-8", "surrogateescape"))  # a file name's own bytes (rttm)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None


def ensure_writable_dir(output_dir: Path) -> None:
    """Fail before any model work when -o cannot be written."""
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # mkdir's own word for a name that a file already holds
        raise OutputError(f"cannot write into {output_dir}: it is a file, not a folder") from None
    except OSError as exc:
        raise OutputError(f"cannot create output folder {output_dir}: {exc.strerror or exc}") from None
    if not os.access(output_dir, os.W_OK | os.X_OK):
        raise OutputError(f"output folder {output_dir} is not writable")
