"""Audio in: find ffmpeg, decode any input to 16 kHz mono float32, stream long files."""

from __future__ import annotations

import io
import os
import re
import shutil
import stat
import struct
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..errors import AudioDecodeError, FFmpegNotFoundError, InputError
from .constants import SAMPLE_RATE
from .wav import plain_wav, read_plain_wav


@dataclass(frozen=True)
class FFmpegInfo:
    path: str
    source: str  # "FERRUM_FFMPEG", "PATH" or "imageio-ffmpeg"


@lru_cache(maxsize=1)
def find_ffmpeg() -> FFmpegInfo:
    """FERRUM_FFMPEG, then PATH, then the static binary that imageio-ffmpeg ships."""
    override = os.environ.get("FERRUM_FFMPEG")
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise FFmpegNotFoundError(f"FERRUM_FFMPEG={override!r} is not an executable file")
        return FFmpegInfo(override, "FERRUM_FFMPEG")
    on_path = shutil.which("ffmpeg")
    if on_path:
        return FFmpegInfo(on_path, "PATH")
    try:
        import imageio_ffmpeg

        return FFmpegInfo(imageio_ffmpeg.get_ffmpeg_exe(), "imageio-ffmpeg")
    except Exception as exc:  # imageio-ffmpeg raises RuntimeError when its binary is missing
        raise FFmpegNotFoundError(
            f"ffmpeg not found on PATH and imageio-ffmpeg has none ({exc}); install ffmpeg or set FERRUM_FFMPEG"
        ) from None


def ffmpeg_version() -> str:
    out = subprocess.run([find_ffmpeg().path, "-version"], capture_output=True, text=True, check=False).stdout
    first = out.splitlines()[0] if out else ""
    return first.split(" version ")[1].split()[0] if " version " in first else "unknown"


URL_SCHEMES = ("http", "https", "rtsp", "rtmp", "rtmps", "srt", "udp", "tcp", "rtp")
SOURCE_SLOT = "\x00source"  # where the input goes in ffmpeg's arguments; no path holds a NUL
NETWORK_TIMEOUT_US = 15_000_000  # a server that stops answering for 15 s ends the input (http, tcp)


def is_url(text: str) -> bool:
    """An input ffmpeg opens over the network, by its scheme."""
    scheme, sep, rest = str(text).partition("://")
    return bool(sep and rest) and scheme.lower() in URL_SCHEMES


def _decode_args(
    source: str, start: float | None = None, input_format: str | None = None, live: bool = False,
    audio_stream: int | None = None,
) -> list[str]:  # fmt: skip
    """ffmpeg's argument list, built with ffmpeg-python and never passed to a shell.

    live: output as soon as decoded (no probing ahead, each packet flushed), for audio that
    arrives in real time; input_format: a capture device's (alsa, pulse, avfoundation, dshow, lavfi);
    audio_stream: which of the input's audio streams, from 0 (ffmpeg's `-map 0:a:N`); None: ffmpeg's pick.
    """
    import ffmpeg

    in_kwargs: dict = {"ss": f"{start:.3f}"} if start else {}
    if input_format:
        in_kwargs["f"] = input_format
    if is_url(source) and source.split(":", 1)[0].lower() in ("http", "https", "tcp"):
        in_kwargs["rw_timeout"] = NETWORK_TIMEOUT_US
    if live:
        in_kwargs |= {"probesize": 32768, "analyzeduration": 0}
    out_kwargs = {"flush_packets": 1} if live else {}
    # mono stays mono and anything wider becomes stereo, which to_mono downmixes as ffmpeg's -ac 1
    # would, to the bit, unless the channels cancel; the WAV header says which ffmpeg chose
    # the source goes in after: ffmpeg-python hashes its arguments as UTF-8, which a file name
    # that is not UTF-8 (its bytes kept by Python as surrogates) cannot be
    stream = ffmpeg.input(SOURCE_SLOT, **in_kwargs)
    if audio_stream is not None:
        stream = stream[f"a:{audio_stream}"]
    stream = stream.output(
        "pipe:", format="wav", acodec="pcm_f32le", ar=SAMPLE_RATE, af="aformat=channel_layouts=mono|stereo",
        **out_kwargs,
    )  # fmt: skip
    global_args = ["-hide_banner", "-nostats", "-v", "level+info"]
    if source != "pipe:0":
        global_args.insert(0, "-nostdin")
    args = stream.global_args(*global_args).compile(cmd=find_ffmpeg().path)
    return [source if arg == SOURCE_SLOT else arg for arg in args]


def capture_devices() -> list[dict]:
    """The microphones ffmpeg can see here, as --mic takes them (FORMAT:NAME); [] where none."""
    import sys

    ffmpeg = find_ffmpeg().path
    found: list[dict] = []

    def run(args: list[str]) -> str:
        try:
            proc = subprocess.run([ffmpeg, "-hide_banner", *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return proc.stdout + proc.stderr

    if sys.platform == "darwin":
        audio = run(["-f", "avfoundation", "-list_devices", "true", "-i", ""]).split("audio devices:")[-1]
        for index, name in re.findall(r"\[(\d+)\] (.+)", audio):
            found.append({"device": f"avfoundation::{index}", "name": name.strip()})
    elif sys.platform == "win32":
        for name in re.findall(r'"([^"]+)" \(audio\)', run(["-list_devices", "true", "-f", "dshow", "-i", "dummy"])):
            found.append({"device": f"dshow:audio={name}", "name": name})
    else:
        for fmt in ("pulse", "alsa"):
            for line in run(["-sources", fmt]).splitlines():
                m = re.match(r"^[* ] (\S+) \[(.*)\]\s*$", line)
                if m:
                    found.append({"device": f"{fmt}:{m.group(1)}", "name": m.group(2)})
    return found


_TAG = re.compile(r"^(?:\[[^\]]* @ 0x[0-9a-f]+\] )*\[(\w+)\] (?:\[[^\]]* @ 0x[0-9a-f]+\] )*(.*)$")
_DURATION = re.compile(r"Duration: (\d+):(\d\d):(\d\d(?:\.\d+)?)")
_STREAM = re.compile(r"^Stream #(\d+:\d+)(?:\[\w+\])?(?:\((\w+)\))?: (\w+):")
_STREAM_DURATION = re.compile(r"^DURATION\s*: (\d+):(\d\d):(\d\d(?:\.\d+)?)")
_MAPPED = re.compile(r"^Stream #(\d+:\d+) -> ")


def _seconds(match: re.Match) -> float:
    return int(match.group(1)) * 3600 + int(match.group(2)) * 60 + float(match.group(3))


NOT_MEDIA = "Invalid data found when processing input"  # ffmpeg's words for what no demuxer takes


@dataclass
class FFmpegLog:
    """ffmpeg's stderr at `-v level+info`: its errors, the duration the container declares, and
    the input's streams."""

    errors: list[str]
    declared_seconds: float | None
    audio_streams: list[str] = field(default_factory=list)  # "0:1", or "0:1 (eng)" where tagged
    chosen_stream: int | None = None  # the audio stream asked for (--audio-stream), from 0
    has_video: bool = False
    read_stream: str | None = None  # the audio stream ffmpeg chose, as "0:1"
    stream_seconds: dict[str, float] = field(default_factory=dict)  # per stream, where it declares its own

    @classmethod
    def parse(cls, stderr: str, chosen_stream: int | None = None) -> FFmpegLog:
        log, stream, in_input = cls([], None, chosen_stream=chosen_stream), None, True
        for line in stderr.splitlines():
            m = _TAG.match(line.strip())
            if not m:
                continue
            level, text = m.groups()
            text = text.strip()
            if level in ("error", "fatal", "panic"):
                log.errors.append(text)
            elif text.startswith("Output #"):
                in_input = False  # what follows describes ffmpeg's own WAV
            elif (mapped := _MAPPED.match(text)) and log.read_stream is None:
                log.read_stream = mapped.group(1)
            elif not in_input:
                continue
            elif log.declared_seconds is None and (d := _DURATION.search(text)):
                log.declared_seconds = _seconds(d)
            elif found := _STREAM.match(text):
                stream, language, kind = found.groups()
                if kind == "Audio":
                    log.audio_streams.append(stream if language in (None, "und") else f"{stream} ({language})")
                log.has_video = log.has_video or kind == "Video"
            elif stream is not None and (d := _STREAM_DURATION.match(text)):
                log.stream_seconds[stream] = _seconds(d)
        return log

    def reason(self, source: str) -> str:
        """ffmpeg's own last complaint, without the input name it repeats."""
        if not self.errors:
            return "no audio decoded"
        if any("does not contain any stream" in e or "matches no streams" in e for e in self.errors):
            if self.chosen_stream is not None and self.audio_streams:
                streams = f"{len(self.audio_streams)} ({self._numbered_streams()})"
                return f"no audio stream {self.chosen_stream}: it has {streams}"
            return "no audio stream"
        if source == "pipe:0" and any(e.endswith("partial file") for e in self.errors):
            return "an mp4 or m4a whose index comes last cannot be read from a pipe: give its file"
        if any(e.endswith(NOT_MEDIA) for e in self.errors):  # ffmpeg says the same of an empty pipe
            nothing = ", or nothing came" if source == "pipe:0" else ""
            return f"not audio or video that ffmpeg reads{nothing} ({NOT_MEDIA})"
        line = self.errors[-1]
        for prefix in (source + ": ", "pipe:0: ", "pipe:: "):
            line = line.removeprefix(prefix)
        return line.removeprefix("Decoding error: ")

    def warnings(self, decoded_seconds: float, source: str) -> list[str]:
        """What the user should know of audio that did come out: not all of it (a truncated or
        damaged file), or one of several audio streams."""
        found = []
        if truncated := self._truncated(decoded_seconds, source):
            found.append(truncated)
        if len(self.audio_streams) > 1 and self.chosen_stream is None:
            ids = [s.split()[0] for s in self.audio_streams]
            read = ids.index(self.read_stream) if self.read_stream in ids else 0
            found.append(
                f"read audio stream {read} of {len(ids)} ({self._numbered_streams()}); --audio-stream picks another"
            )
        return found

    def _numbered_streams(self) -> str:
        """The audio streams as --audio-stream counts them, with their languages: "0, 1 (eng)"."""
        return ", ".join(f"{n}{s[len(s.split()[0]) :]}" for n, s in enumerate(self.audio_streams))

    def _truncated(self, decoded_seconds: float, source: str) -> str | None:
        declared = self._declared_audio_seconds()
        short = declared is not None and decoded_seconds < declared - 1.0
        if not (self.errors or short):
            return None
        what = f"decoded {decoded_seconds:.1f} s"
        if declared is not None:
            what += f" of {declared:.1f} s"
        return (
            f"truncated or damaged input ({what}): {self.reason(source)}"
            if self.errors
            else f"truncated input ({what})"
        )

    def _declared_audio_seconds(self) -> float | None:
        """The length the audio read should have: its stream's own where declared; the
        container's unless the input has video, whose track often outlasts the sound."""
        if self.read_stream in self.stream_seconds:
            return self.stream_seconds[self.read_stream]
        return None if self.has_video else self.declared_seconds


def _check_readable(path: Path) -> os.stat_result:
    try:
        st = os.stat(path)
    except PermissionError:
        raise InputError("permission denied") from None
    except OSError:
        raise InputError("no such file") from None
    if os.path.isdir(path):
        raise InputError("is a directory")
    if not os.access(path, os.R_OK):
        raise InputError("permission denied")
    if stat.S_ISREG(st.st_mode) and st.st_size == 0:  # a pipe or a device says 0 and has audio to read
        raise AudioDecodeError("empty file")
    return st


@dataclass
class DecodedAudio:
    samples: np.ndarray  # float32, mono, 16 kHz
    warnings: list[str] = field(default_factory=list)  # FFmpegLog.warnings: audio came out, but not all of it

    def __iter__(self) -> Iterator[np.ndarray]:
        """As one chunk, so decoded bytes and file streams feed the same engine."""
        yield self.samples


def _run_decoder(source: str, data: bytes | None, audio_stream: int | None) -> DecodedAudio:
    """ffmpeg over source at once (data on its stdin where given); audio_stream: as _decode_args."""
    proc = subprocess.run(
        _decode_args(source, audio_stream=audio_stream),
        input=data,
        stdin=None if data is not None else subprocess.DEVNULL,
        capture_output=True,
        check=False,
    )
    log = FFmpegLog.parse(proc.stderr.decode("utf-8", "replace"), audio_stream)
    out = io.BytesIO(proc.stdout)
    channels = read_wav_header(out)
    samples = to_mono(out.read(), channels) if channels else np.zeros(0, np.float32)
    if samples.size == 0:
        raise AudioDecodeError(log.reason(source))
    return DecodedAudio(samples, log.warnings(samples.size / SAMPLE_RATE, source))


def decode_file(path: str | os.PathLike[str], audio_stream: int | None = None) -> DecodedAudio:
    """A whole file at once, for callers of the library (the tests and the bench read clips so);
    the engines stream theirs (stream_file). audio_stream: as _decode_args."""
    p = Path(path)
    if not stat.S_ISREG(_check_readable(p).st_mode):  # a FIFO, or <(...)'s /dev/fd/N that only we hold
        with open(p, "rb") as pipe:
            return decode_bytes(pipe.read(), audio_stream)
    source = os.path.abspath(p)  # an absolute name can never read as an ffmpeg option
    return _run_decoder(source, None, audio_stream)


def decode_bytes(data: bytes, audio_stream: int | None = None) -> DecodedAudio:
    """Bytes go to ffmpeg on stdin, and, where it cannot read them so, from a temporary file: an
    mp4 or m4a whose index comes last (ffmpeg's own default, and many recorders') needs to seek.
    audio_stream: as _decode_args."""
    if not data:
        raise AudioDecodeError("empty input")
    try:
        return _run_decoder("pipe:0", data, audio_stream)
    except AudioDecodeError as piped:
        try:
            with tempfile.NamedTemporaryFile(prefix="ferrum-input-") as copy:
                copy.write(data)
                copy.flush()
                return _run_decoder(copy.name, None, audio_stream)
        except (AudioDecodeError, OSError):
            raise piped from None  # not audio either way: the first complaint


PIPE_BYTES = 1 << 20  # 16 s of audio: what a started ffmpeg may decode before anyone reads


def _widen_pipe(pipe) -> None:
    """Let ffmpeg run ahead of its reader by PIPE_BYTES; Linux only, and only as far as allowed."""
    import fcntl

    if hasattr(fcntl, "F_SETPIPE_SZ"):
        try:
            fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:
            pass  # above /proc/sys/fs/pipe-max-size: the default pipe still works


LIVE_CHUNK_SECONDS = 0.1  # what a live input hands on at a time

_decoders: dict[subprocess.Popen, int] = {}  # AudioStream's running ffmpeg, by the thread that started each
_decoders_lock = threading.Lock()


def _track(proc: subprocess.Popen, running: bool) -> None:
    with _decoders_lock:
        if running:
            _decoders[proc] = threading.get_ident()
        else:
            _decoders.pop(proc, None)


def stop_decoders(threads: set[int]) -> None:
    """Kill the running decoders that these threads started: a read that waits on one whose input
    has not ended (a pipe's writer that goes on, a URL's stream) then ends, and its thread with it."""
    with _decoders_lock:
        started = [proc for proc, thread in _decoders.items() if thread in threads]
    for proc in started:
        proc.kill()


class AudioStream:
    """float32 chunks as ffmpeg produces them, so memory does not grow with length.

    A file, a URL, stdin ("pipe:0", which ffmpeg reads itself), a capture device (input_format),
    or `feed`: bytes of any container that a thread writes into ffmpeg as they come (a
    WebSocket's). start() spawns ffmpeg ahead of reading: a short input decodes whole into
    the pipe while the caller loads the model on the other core. `warnings` are set once the
    stream is exhausted (FFmpegLog.warnings: a truncated input, streams left unread). live: chunks of 0.1 s as
    soon as they are decoded, for audio that arrives while it is transcribed. audio_stream: as _decode_args.
    """

    def __init__(
        self, path: str | os.PathLike[str], chunk_seconds: float = 30.0, live: bool = False,
        input_format: str | None = None, feed: Iterable[bytes] | None = None, audio_stream: int | None = None,
    ) -> None:  # fmt: skip
        self.feed = feed
        self.pipe_from: str | None = None  # a FIFO or /dev/fd/N: opened here, read by ffmpeg on its stdin
        if feed is not None:
            path = "pipe:0"
        if input_format or str(path) == "pipe:0" or is_url(str(path)):
            self.source = str(path)
        else:
            p = Path(path)
            self.source = os.path.abspath(p)
            if not stat.S_ISREG(_check_readable(p).st_mode):  # <(...)'s /dev/fd/N is not ffmpeg's to open
                self.pipe_from, self.source = self.source, "pipe:0"
        self.live, self.input_format, self.audio_stream = live, input_format, audio_stream
        self.chunk_bytes = int((LIVE_CHUNK_SECONDS if live else chunk_seconds) * SAMPLE_RATE) * 4
        self.warnings: list[str] = []
        self._started: subprocess.Popen | None = None
        local = not (live or input_format or self.source == "pipe:0" or is_url(self.source))
        # a WAV Whisper can read as it is: no ffmpeg (a WAV has one stream: ffmpeg says so of any other)
        self.wav = plain_wav(self.source) if local and not audio_stream else None

    def start(self) -> AudioStream:
        if self._started is None and self.wav is None:
            self._started = self._spawn()
        return self

    def close(self) -> None:
        """Stop an ffmpeg that start() spawned and nobody read."""
        proc, self._started = self._started, None
        if proc is not None:
            proc.kill()
            proc.communicate()
            _track(proc, running=False)

    def _spawn(self) -> subprocess.Popen:
        stdin = None if self.source == "pipe:0" else subprocess.DEVNULL  # pipe:0: ffmpeg reads ours
        with open(self.pipe_from, "rb") if self.pipe_from else nullcontext(stdin) as stdin:
            proc = subprocess.Popen(
                _decode_args(
                    self.source, input_format=self.input_format, live=self.live, audio_stream=self.audio_stream
                ),
                stdin=subprocess.PIPE if self.feed is not None else stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        _widen_pipe(proc.stdout)
        _track(proc, running=True)
        if self.feed is not None:
            threading.Thread(target=_write_feed, args=(self.feed, proc.stdin), name="ffmpeg-feed", daemon=True).start()
        return proc

    def __iter__(self) -> Iterator[np.ndarray]:
        if self.wav is not None:
            read = 0
            for frames in read_plain_wav(self.source, self.wav, self.chunk_bytes // 4):
                read += len(frames)
                yield to_mono(frames, self.wav.channels)
            # judged as ffmpeg's output is: against the length the header declares
            self.warnings = FFmpegLog([], self.wav.declared_frames / SAMPLE_RATE).warnings(
                read / SAMPLE_RATE, self.source
            )
            return
        proc, self._started = self._started or self._spawn(), None
        stderr_parts: list[bytes] = []
        # drain stderr on the side: a damaged long file can fill the pipe and stall ffmpeg
        drain = threading.Thread(target=lambda: stderr_parts.append(proc.stderr.read()), daemon=True)
        drain.start()
        total, finished = 0, False
        try:
            assert proc.stdout is not None
            channels = read_wav_header(proc.stdout)
            frame_bytes = 4 * max(channels, 1)
            pending = b""
            while channels and (buf := proc.stdout.read(self.chunk_bytes * channels)):
                buf = pending + buf
                usable = len(buf) - len(buf) % frame_bytes
                pending = buf[usable:]
                total += usable // frame_bytes
                yield to_mono(buf[:usable], channels)
            finished = True
        finally:
            if not finished:  # the reader stopped early (error, interrupt): stop ffmpeg too
                proc.kill()
            proc.stdout.close()
            proc.wait()
            drain.join()
            _track(proc, running=False)
        log = FFmpegLog.parse(b"".join(stderr_parts).decode("utf-8", "replace"), self.audio_stream)
        if total == 0:
            raise AudioDecodeError(log.reason(self.source))
        self.warnings = log.warnings(total / SAMPLE_RATE, self.source)


class SpooledInput:
    """The bytes of an open binary stream (stdin, a caller's file or io.BytesIO) copied to a
    temporary file as they come, then decoded from it as a file is: ffmpeg can seek in it (an mp4
    whose index comes last), and memory stays flat however long the input, where decoding bytes
    held all of it, decoded, at once (1.4 GB for an hour's mp3 on stdin, against 0.9 GB as a file).
    `warnings` as AudioStream's."""

    def __init__(self, stream: BinaryIO, audio_stream: int | None = None) -> None:
        self.stream, self.audio_stream = stream, audio_stream
        self.warnings: list[str] = []
        self._copy: BinaryIO | None = None  # made by copied(), else when first read
        self._failed: InputError | None = None  # why copied() could not copy: raised when read

    def copied(self) -> SpooledInput:
        """The copy made now, on the caller's thread: a read that waits for a stream that has not
        ended (stdin) is then one that Ctrl-C reaches, not one the engine's thread waits in. An
        input that cannot be copied (empty, a full disk) fails when read, as that input's error."""
        copy = tempfile.NamedTemporaryFile(prefix="ferrum-input-")
        try:
            self._copy_into(copy)
        except InputError as exc:
            copy.close()
            self._failed = exc
            return self
        except BaseException:
            copy.close()
            raise
        self._copy = copy
        return self

    def __iter__(self) -> Iterator[np.ndarray]:
        if self._failed is not None:
            raise self._failed
        made, self._copy = self._copy, None
        with made or tempfile.NamedTemporaryFile(prefix="ferrum-input-") as copy:
            if made is None:
                self._copy_into(copy)
            decoded = AudioStream(copy.name, audio_stream=self.audio_stream)
            yield from decoded
            self.warnings = decoded.warnings

    def _copy_into(self, copy: BinaryIO) -> None:
        while block := self._read():
            try:
                copy.write(block)
            except OSError as exc:  # a full disk
                folder = tempfile.gettempdir()
                reason = exc.strerror or exc
                raise InputError(
                    f"cannot copy the input into {folder} (TMPDIR names another folder): {reason}"
                ) from None
        if not copy.tell():
            raise AudioDecodeError("empty input")
        copy.flush()

    def _read(self) -> bytes:
        try:
            block = self.stream.read(PIPE_BYTES)
        except OSError as exc:  # stdin redirected from a folder, a device that fails
            raise InputError(f"cannot read the input: {exc.strerror or exc}") from None
        if not isinstance(block, (bytes, bytearray, memoryview)):
            what = type(block).__name__
            raise InputError(f"a stream of audio must be opened in binary mode ('rb'): its read() gave {what}")
        return block


CANCELLED = 0.1  # a downmix with under a tenth of its louder channel's energy: the channels cancel


def read_wav_header(stream: BinaryIO) -> int:
    """The channel count of the WAV ffmpeg writes, the stream left at the first sample; 0 if
    ffmpeg wrote nothing (it failed). On a pipe the sizes are unknown: the data runs to the end."""
    if len(head := stream.read(12)) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return 0
    channels = 0
    while len(chunk := stream.read(8)) == 8:
        kind, size = chunk[:4], struct.unpack("<I", chunk[4:])[0]
        if kind == b"data":
            return channels
        body = stream.read(size + (size & 1))
        if kind == b"fmt ":
            channels = struct.unpack("<H", body[2:4])[0]
    return 0


def to_mono(data: bytes | np.ndarray, channels: int) -> np.ndarray:
    """float32 mono from interleaved float32 frames (bytes, or an array). Two channels are mixed as
    ffmpeg's -ac 1 mixes them (each times 1/sqrt 2); where that mix cancels (one channel
    inverted), the louder channel is kept instead, so that speech is not lost as silence."""
    frames = (np.frombuffer(data, np.float32) if isinstance(data, bytes) else data).reshape(-1, channels)
    if channels == 1:
        return frames[:, 0].copy()
    left, right = frames[:, 0], frames[:, 1]
    mixed = left * STEREO_GAIN + right * STEREO_GAIN
    louder, louder_energy = max(((left, _energy(left)), (right, _energy(right))), key=lambda pair: pair[1])
    return louder.copy() if _energy(mixed) < CANCELLED * louder_energy else mixed


STEREO_GAIN = np.float32(np.sqrt(0.5))


def _energy(samples: np.ndarray) -> float:
    wide = samples.astype(np.float64)
    return float(np.dot(wide, wide))


def _write_feed(feed: Iterable[bytes], pipe) -> None:
    """Bytes into ffmpeg's stdin until the feed ends (then ffmpeg sees the end) or ffmpeg quits."""
    try:
        for data in feed:
            pipe.write(data)
            pipe.flush()
    except (BrokenPipeError, OSError, ValueError):
        pass  # ffmpeg stopped reading: its own error, or the reader stopped it
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def stream_file(
    path: str | os.PathLike[str], chunk_seconds: float = 30.0, audio_stream: int | None = None
) -> AudioStream:
    return AudioStream(path, chunk_seconds, audio_stream=audio_stream)
