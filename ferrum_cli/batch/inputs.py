"""Input expansion: files, directories, glob patterns and stdin become a list of jobs,
each with the output stem it will be written under."""

from __future__ import annotations

import fnmatch
import glob
import os
import re
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

from ..audio.ffmpeg import is_url
from ..errors import UsageError

STDIN = "-"

# Audio and video containers ffmpeg reads, taken by extension when a directory is walked.
MEDIA_EXTENSIONS = frozenset(
    """aac ac3 aif aifc aiff alac amr ape au avi caf dts flac m2ts m4a m4b m4v mka mkv mov mp2 mp3 mp4
    mpeg mpg mts mxf oga ogg ogv opus qt ra rm spx ts tta voc w64 wav weba webm wma wmv wv 3gp 3g2""".split()
)


CAPTURE_FORMATS = ("alsa", "pulse", "avfoundation", "dshow", "lavfi", "oss", "jack", "openal")


@dataclass(frozen=True)
class Job:
    source: str  # a file path, a URL, "-" for stdin, or a capture device's name
    relative: PurePosixPath  # output path under -o, without the format's extension
    display: str  # how the input is named to the user
    capture_format: str | None = None  # a microphone: ffmpeg's input device (alsa, pulse, ...)

    @property
    def is_stdin(self) -> bool:
        return self.source == STDIN

    @property
    def is_url(self) -> bool:
        return self.capture_format is None and is_url(self.source)

    @property
    def is_stream(self) -> bool:
        """Read as it comes (stdin, a URL, a device, a named pipe or the shell's <(...)), not a
        file on disk."""
        return self.is_stdin or self.is_url or self.capture_format is not None or _is_pipe(self.source)


def _is_pipe(path: str) -> bool:
    """A path that is neither a file nor a folder: a FIFO, /dev/fd/N, a character device."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def url_stem(url: str) -> PurePosixPath:
    """A URL's output stem: its last path part without the extension (else its host), made safe."""
    parts = urlsplit(url)
    name = unquote(parts.path.rstrip("/").rsplit("/", 1)[-1]) or parts.hostname or "stream"
    name = Path(name).stem if "." in name.strip(".") else name
    return PurePosixPath(re.sub(r"[^\w.-]+", "_", name).strip("._") or "stream")


def microphone(device: str, name: str = "mic") -> Job:
    """A capture device as a job. DEVICE is FORMAT:NAME (alsa:hw:1, pulse:default, lavfi:sine,
    avfoundation::0, dshow:audio=Mic) or, for this platform's usual device, "default"."""
    fmt, sep, rest = device.partition(":")
    if sep and fmt in CAPTURE_FORMATS:
        return Job(rest or "default", _safe_relative(Path(name)), f"<mic {device}>", fmt)
    if sys.platform == "darwin":
        return Job(
            ":0" if device == "default" else device, _safe_relative(Path(name)), f"<mic {device}>", "avfoundation"
        )
    if sys.platform == "win32":
        if device == "default":
            raise UsageError("on Windows, name the microphone: --mic dshow:audio=NAME (ferrum status lists them)")
        return Job(f"audio={device}", _safe_relative(Path(name)), f"<mic {device}>", "dshow")
    return Job(device, _safe_relative(Path(name)), f"<mic {device}>", "pulse" if _has_pulse() else "alsa")


def _has_pulse() -> bool:
    return bool(
        os.environ.get("PULSE_SERVER") or Path(os.environ.get("XDG_RUNTIME_DIR", "/nonexistent"), "pulse").exists()
    )


def _is_media(path: Path) -> bool:
    return path.suffix.lower().lstrip(".") in MEDIA_EXTENSIONS


def _walk_once(root: str | Path, depth: int | None = None) -> Iterator[tuple[str, tuple[str, ...], list[str]]]:
    """(folder, its parts below root, its file names) for each folder under root, in sorted order,
    following symlinks but reading each real folder once (so never into a loop), and no deeper
    than depth folders below root."""
    seen_dirs: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        try:
            st = os.stat(dirpath)
        except OSError:
            dirnames[:] = []
            continue
        if (st.st_dev, st.st_ino) in seen_dirs:
            dirnames[:] = []
            continue
        seen_dirs.add((st.st_dev, st.st_ino))
        below = Path(os.path.relpath(dirpath, root)).parts
        below = () if below == (".",) else below
        if depth is not None and len(below) >= depth:
            dirnames[:] = []
        dirnames.sort()
        yield dirpath, below, sorted(filenames)


def walk_media(root: Path) -> list[Path]:
    """Media files under root, following symlinks but never into a loop. Hidden names are left
    out, as the shell's * and our globs leave them: macOS's ._talk.mp3 copies of a file's
    metadata (on USB drives and shares), a .Trash folder's files. Named, they are read."""
    found = (
        Path(dirpath) / name
        for dirpath, below, names in _walk_once(root)
        if not any(part.startswith(".") for part in below)
        for name in names
        if not name.startswith(".")
    )
    return [path for path in found if _is_media(path) and os.path.isfile(path)]


def _stem(path: Path) -> Path:
    try:
        return path.with_suffix("")
    except ValueError:  # an empty name, such as the one of "/"
        return path


def _safe_relative(path: Path) -> PurePosixPath:
    """A relative output path that can only go down: no '..', no root, no empty parts."""
    parts = [p for p in PurePosixPath(path.as_posix()).parts if p.strip("/") not in ("", ".", "..")]
    parts = [p.replace("\n", " ").replace("\r", " ") for p in parts]
    return PurePosixPath(*parts) if parts else PurePosixPath("audio")


def shown_path(path: Path) -> str:
    """A path as a message names it: bytes of its name that are not UTF-8 as \\xNN, as `ls -b`
    shows them (Python keeps them as surrogates, which a terminal cannot show)."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def home_expanded(name: str) -> str:
    """A name that starts with ~ and names nothing as it is, with ~ as the shell expands it: quotes
    keep a pattern ('~/talks/**/*.m4a') from the shell, and zsh leaves NAME=~/file as it is."""
    return os.path.expanduser(name) if name.startswith("~") and not os.path.lexists(name) else name


def expand(inputs: list[str], stdin_name: str = "stdin") -> list[Job]:
    """Jobs in the order given; duplicates (by real path) once; raises UsageError when nothing matches."""
    jobs: list[Job] = []
    seen: set[str] = set()
    unmatched: list[str] = []

    def add(path: Path, relative: PurePosixPath) -> None:
        key = os.path.realpath(path)
        if key in seen:
            return
        seen.add(key)
        jobs.append(Job(str(path), relative, shown_path(path)))

    for item in inputs:
        if is_url(item):
            if item not in seen:
                seen.add(item)
                jobs.append(Job(item, url_stem(item), item))
            continue
        if item == STDIN:
            if STDIN not in seen:
                seen.add(STDIN)
                named = Path(stdin_name)  # 'talk.mp3' is the name of what stdin holds: out/talk.srt
                jobs.append(Job(STDIN, _safe_relative(_stem(named) if _is_media(named) else named), "<stdin>"))
            continue
        item = home_expanded(item)
        path = Path(item)
        if os.path.isdir(path):  # os.path's checks answer False where pathlib's raise (EACCES)
            files = walk_media(path)
            if not files:
                raise UsageError(f"no audio or video files in directory '{item}'")
            for f in files:
                add(f, _safe_relative(_stem(f.relative_to(path))))
        elif os.path.lexists(path) or not glob.has_magic(item):
            # an existing file, or a name to report as missing; never treated as a pattern
            add(path, _safe_relative(_stem(Path(path.name))))
        else:
            matches = glob_files(item)
            if not matches:
                unmatched.append(item)
            base = _glob_base(item)
            for m in matches:
                rel = Path(os.path.relpath(m, base)) if base else Path(Path(m).name)
                add(Path(m), _safe_relative(_stem(rel)))
    if unmatched and not jobs:
        raise UsageError(f"no input matched: {', '.join(repr(u) for u in unmatched)}")
    if unmatched:
        # a pattern that matched nothing among others that did is still a usage error
        raise UsageError(f"pattern matched nothing: {unmatched[0]!r}")
    return _disambiguate(jobs)


def glob_files(pattern: str) -> list[str]:
    """The files a glob matches, as glob.glob(recursive=True) would, but each folder read once:
    a symlinked folder is followed unless it leads back to one already read (glob.glob followed
    '..' links without end, or 40 folders deep)."""
    base = _glob_base(pattern)
    rest = Path(pattern).parts[len(Path(base).parts) if base != "." else 0 :]
    if not rest:
        return []
    depth = None if "**" in rest else len(rest) - 1  # a pattern without ** reads only as deep as it reaches
    found = []
    for dirpath, below, names in _walk_once(base, depth):
        for name in names:
            path = os.path.join(dirpath, name)
            if _matches((*below, name), rest) and os.path.isfile(path):
                found.append(os.path.normpath(path) if base == "." else path)
    return sorted(found)


def _matches(parts: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    """Whether a relative path's parts match a glob's parts: ** any number of folders, and a
    name that starts with '.' only where the pattern's part does (as glob)."""
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return _matches(parts, rest) or (bool(parts) and not parts[0].startswith(".") and _matches(parts[1:], pattern))
    if not parts or (parts[0].startswith(".") and not head.startswith(".")):
        return False
    if len(parts) == 1:  # the file's own name: a part the pattern has after it would be a folder
        return fnmatch.fnmatchcase(parts[0], head) and not rest
    return fnmatch.fnmatchcase(parts[0], head) and _matches(parts[1:], rest)


def _glob_base(pattern: str) -> str:
    """The folder part of a pattern before its first wildcard: outputs mirror what lies below it."""
    parts = Path(pattern).parts
    fixed = []
    for part in parts[:-1]:
        if glob.has_magic(part):
            break
        fixed.append(part)
    return str(Path(*fixed)) if fixed else "."


def _disambiguate(jobs: list[Job]) -> list[Job]:
    """Two inputs that map to one output name keep their extension, then get a counter."""
    by_name: dict[str, list[int]] = {}
    for i, job in enumerate(jobs):
        by_name.setdefault(str(job.relative).lower(), []).append(i)
    out = list(jobs)
    for indices in by_name.values():
        if len(indices) < 2:
            continue
        for i in indices:
            job = jobs[i]
            ext = Path(job.source).suffix.lstrip(".")
            name = job.relative.name + (f".{ext}" if ext else "")
            out[i] = replace(job, relative=job.relative.with_name(name))
    taken: set[str] = set()
    for i, job in enumerate(out):
        rel, n = job.relative, 2
        while str(rel).lower() in taken:
            rel, n = job.relative.with_name(f"{job.relative.name}-{n}"), n + 1
        taken.add(str(rel).lower())
        out[i] = replace(job, relative=rel)
    return out
