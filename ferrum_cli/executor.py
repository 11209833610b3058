"""WhisperModelExecutor: the library API, after the executor of the Rust project ferrum."""

from __future__ import annotations

import os
import queue
import resource
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Union

from .audio.ffmpeg import AudioStream, SpooledInput, stop_decoders
from .errors import ExecutorStateError, FerrumError, InputError, UsageError
from .languages import language_code
from .options import MAX_BATCH_SIZE, TranscribeOptions
from .results import Segment, Transcription

if TYPE_CHECKING:
    import numpy as np
    import torch

    from .engine.service import Ticket

AudioSource = Union[str, os.PathLike, bytes, Callable[[], bytes], BinaryIO, "np.ndarray", "torch.Tensor", AudioStream]
LOOK_AHEAD = 2  # batches' worth of inputs submitted ahead of the one being read: short ones share a batch
STOP_GRACE_SECONDS = 2.0  # how long a call left early waits for the engine before it stops its own decoders


@dataclass(frozen=True)
class _Callbacks:
    """transcribe_many's callbacks, each by an input's key; tickets bring them to the caller's thread."""

    on_segment: Callable[[object, Segment], None] | None = None
    on_progress: Callable[[object, float], None] | None = None
    on_partial: Callable[[object, Transcription], None] | None = None
    on_step: Callable[[object, str], None] | None = None

    def ticket(
        self, number: int, key: object, source: AudioSource, options: TranscribeOptions, told: queue.SimpleQueue
    ) -> Ticket:
        """The input's ticket: what the engine's thread tells of it goes into `told`, its result
        as (None, number, result)."""
        from .engine.service import Ticket

        def tell(callback):
            return (lambda value, *_: told.put((callback, key, value))) if callback else None

        return Ticket(
            audio_opener(source, options.audio_stream), options, tell(self.on_segment),
            lambda result: told.put((None, number, result)),
            live=isinstance(source, AudioStream) and source.live, on_progress=tell(self.on_progress),
            on_partial=tell(self.on_partial), on_step=tell(self.on_step),
        )  # fmt: skip


@dataclass
class _Counters:
    files: int = 0
    windows_encoded: int = 0
    tokens_decoded: int = 0
    encode_seconds: float = 0.0
    decode_seconds: float = 0.0
    audio_seconds: float = 0.0
    errors: int = 0
    extra: dict = field(default_factory=dict)


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class WhisperModelExecutor:
    """One loaded Whisper model on one device, with counters and a lifecycle."""

    def __init__(self, model, weights_info: dict, device: str, dtype: str) -> None:
        self._model = model
        self._info = weights_info
        self.device, self.dtype = device, dtype
        self._state = "ready"
        self._counters = _Counters()
        self._lock = threading.Lock()
        self._holder: int | None = None  # the thread whose call holds _lock
        self._count_model_calls()

    @classmethod
    def from_path(
        cls, model_path: str = "base", device: str = "auto", dtype: str = "auto", threads: int | None = None
    ) -> WhisperModelExecutor:
        """Load from a model name, an openai .pt, a Hugging Face or CTranslate2 directory.
        threads: torch's CPU threads for this process, set before the load (None: torch's choice)."""
        from .platform.cpu import on_own_thread

        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise UsageError(f"threads must be a whole number of at least 1, not {threads!r}")
        if not str(model_path).strip():
            raise UsageError("no model given: a name (base, tiny.en, ...), a .pt file or a folder")
        if threads:
            import torch

            torch.set_num_threads(threads)
        return on_own_thread(lambda: _load(model_path, device, dtype)[0])

    # -- lifecycle -------------------------------------------------------------

    @contextmanager
    def _exclusive(self):
        """The model to one call at a time. A call made from inside another on the same thread (from
        a callback, or the body of a loop over transcribe_many) would wait for itself for ever, and
        while serve()'s service runs it owns the model: both are refused."""
        if self._holder == threading.get_ident():
            raise ExecutorStateError(
                "the executor is already transcribing on this thread: a callback, or the body of a loop "
                "over transcribe_many, cannot call it until that call is done"
            )
        self._refuse_while_serving()
        with self._lock:
            self._refuse_while_serving()  # serve() may have begun while this call waited
            self._holder = threading.get_ident()
            try:
                yield
            finally:
                self._holder = None

    def _refuse_while_serving(self) -> None:
        if self._state == "serving":
            raise ExecutorStateError("the executor is serving: submit to the service serve() gave, or close it first")

    def _require_model(self):
        if self._state == "shutdown" or self._model is None:
            raise ExecutorStateError("the executor has been shut down; create a new one with from_path()")
        return self._model

    def check_options(self, options: TranscribeOptions) -> None:
        """Options out of range (options.check), a compute this CPU cannot run, and for an English-only
        model other languages and translation, are refused up front."""
        options.check()
        check_compute(options.compute)
        if self._require_model().is_multilingual:
            return
        name = self._info.get("name", "this model")
        if options.language not in (None, "en"):
            raise UsageError(f"model {name} is English-only; it cannot transcribe language {options.language!r}")
        if options.languages and "en" not in options.languages:
            named = ", ".join(options.languages)
            raise UsageError(f"model {name} is English-only; it cannot transcribe languages {named}")
        if options.task == "translate":
            raise UsageError(f"model {name} is English-only; it cannot translate")

    def warmup(self) -> float:
        """One real forward pass (the encoder and the decoder's steps) on 1 s of noise; returns seconds."""
        import numpy as np

        self._require_model()
        start = time.perf_counter()
        noise = np.random.default_rng(0).normal(0, 0.05, 16000).astype(np.float32)
        options = TranscribeOptions(language="en", temperature=(0.0,), vad=False)
        with self._exclusive():
            for _ in self._in_order([(None, noise)], options, _Callbacks(), count=False):
                pass
        return time.perf_counter() - start

    def shutdown(self) -> None:
        self._model = None
        self._state = "shutdown"
        self.release_cache()

    def release_cache(self) -> None:
        import gc

        gc.collect()
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:
            pass

    # -- transcription ----------------------------------------------------------

    def transcribe(
        self,
        audio: str | os.PathLike[str] | bytes | np.ndarray,
        options: TranscribeOptions | None = None,
        on_segment: Callable[[Segment], None] | None = None,
        on_progress: Callable[[float], None] | None = None,
        on_warning: Callable[[str], None] | None = None,
    ) -> Transcription:
        """The rich call: segments, language with its probability, duration, options. A path, bytes
        of any format ffmpeg reads, or float32 samples at 16 kHz; on_warning gets each of the
        result's warnings. Raises the input's FerrumError."""
        ((_, result),) = self.transcribe_many(
            [(None, audio)],
            options,
            (lambda _, segment: on_segment(segment)) if on_segment else None,
            (lambda _, seconds: on_progress(seconds)) if on_progress else None,
        )
        if isinstance(result, FerrumError):
            raise result
        for warning in result.warnings if on_warning else ():
            on_warning(warning)
        return result

    def transcribe_many(
        self,
        items: Iterable[tuple[object, AudioSource] | AudioSource],
        options: TranscribeOptions | None = None,
        on_segment: Callable[[object, Segment], None] | None = None,
        on_progress: Callable[[object, float], None] | None = None,
        on_partial: Callable[[object, Transcription], None] | None = None,
        on_step: Callable[[object, str], None] | None = None,
    ) -> Iterator[tuple[object, Transcription | FerrumError]]:
        """(key, result or error) for each (key, source) of items, in order: a path, bytes, a
        callable giving bytes, float32 samples at 16 kHz, or an AudioStream. An item that is not a
        pair is a source alone, its own key. Where items itself raises, the inputs it gave before
        are handed back first, then its error is raised.

        The inputs go through one EngineService, as the server's requests do: windows of several
        inputs share batches, an input that fails comes back as its error and the rest go on. A
        live AudioStream is decoded stretch by stretch as it arrives; on_partial gets its
        transcription so far after each new segment; on_step the name of each slow step after
        the engine (diarization) as it begins. The callbacks run on the caller's thread.
        """
        self._require_model()
        options = options or TranscribeOptions()
        self.check_options(options)
        with self._exclusive():
            self._state = "busy"
            try:
                yield from self._in_order(items, options, _Callbacks(on_segment, on_progress, on_partial, on_step))
            finally:
                self._state = "ready" if self._model is not None else "shutdown"

    def _in_order(
        self, items: Iterable[tuple[object, AudioSource]], options: TranscribeOptions, callbacks: _Callbacks,
        count: bool = True,
    ) -> Iterator[tuple[object, Transcription | FerrumError]]:  # fmt: skip
        """items through a service of their own that reads them one after another; what its
        thread tells is passed to the callbacks here, and the results are handed back in order.
        Leaving early (an error, Ctrl-C) cancels what is left and stops the batch in hand."""
        from .engine.service import EngineService

        told: queue.SimpleQueue = queue.SimpleQueue()  # (callback, key, value) from the engine's thread
        service = EngineService(self._require_model(), in_order=True)
        waiting: deque[tuple[int, object, Ticket]] = deque()  # submitted, not yet handed back, in order
        results: dict[int, Transcription | FerrumError] = {}
        numbered = enumerate(items)
        items_failed: Exception | None = None  # raised by the caller's items: raised once those before are back
        listed_all = False  # items ran out (or raised): the service is told, so its last short inputs go on
        try:
            while True:
                while len(waiting) < LOOK_AHEAD * options.batch_size and not listed_all:
                    service.listing(True)
                    try:
                        item = next(numbered, None)
                    except Exception as exc:
                        item, items_failed = None, exc
                    service.listing(False)
                    if item is None:
                        listed_all = True
                        service.end_of_inputs()
                        break
                    number, entry = item
                    key, source = entry if isinstance(entry, tuple) and len(entry) == 2 else (entry, entry)
                    waiting.append((number, key, service.submit(callbacks.ticket(number, key, source, options, told))))
                if not waiting:
                    if items_failed is not None:
                        raise items_failed
                    return
                callback, key, value = told.get()
                if callback is None:  # key: the input's number
                    results[key] = value
                    if count:
                        self._count_result(value)
                else:
                    callback(key, value)
                while waiting and waiting[0][0] in results:
                    number, key, _ = waiting.popleft()
                    yield key, results.pop(number)
        finally:
            for _, _, ticket in waiting:
                service.cancel(ticket)
            # left early: nothing of the batch in hand is wanted, so it stops at its next token. The
            # engine may also wait on audio that has not ended, from a decoder this thread started (a
            # pipe whose writer goes on, a URL's stream), which no signal reaches
            if waiting and not service.abandon(STOP_GRACE_SECONDS):
                stop_decoders({threading.get_ident()})
            service.close()

    def serve(self, share_batches: bool = True, on_batch=None):
        """A long-lived EngineService on this model, for callers on many threads (the server).
        It owns the model until closed: the executor's own calls meanwhile are an ExecutorStateError."""
        from .engine.service import EngineService

        with self._exclusive():  # after a call in progress on another thread
            service = EngineService(self._require_model(), share_batches, on_batch, self._count_result)
            self._state = "serving"
        service.on_closed = self._service_closed
        return service

    def _service_closed(self) -> None:
        if self._state == "serving":
            self._state = "ready"

    def _count_result(self, result) -> None:
        if isinstance(result, FerrumError):
            self._counters.errors += 1
        else:
            self._count(result)

    def _count(self, result: Transcription) -> None:
        c = self._counters
        c.files += 1
        c.audio_seconds += result.duration
        c.tokens_decoded += sum(len(s.tokens) for s in result.segments)

    def detect_language(
        self, audio: str | os.PathLike[str] | bytes | np.ndarray, among: Sequence[str] = ()
    ) -> tuple[str, float]:
        """(language code, probability) from up to three speech windows of the first batch; ('und', 0.0)
        when there is no speech. audio: what transcribe() takes. among: the codes it may be, the
        probability then among them."""
        import itertools

        from .audio.windows import plan_windows
        from .engine.encoder import plan_compute
        from .engine.language import detect_language

        model = self._require_model()
        options = TranscribeOptions(languages=tuple(among))
        options.check()
        chunks = audio_opener(audio)()  # an input of no kind it reads raises its InputError here
        with self._exclusive():
            windows = plan_windows(chunks, options.vad, options.vad_options)
            first = [w for _, w in itertools.islice(windows, options.batch_size)]
            return detect_language(model, first, plan_compute(model, options).encoder, among=options.languages)

    def transcribe_file(self, audio_path: str | bytes | os.PathLike[str], language: str | None = None) -> str:
        """The text; language by code or English name ("de", "german"), None or "auto" to detect it.
        A path in bytes (a name that is not UTF-8, as os.listdir(b".") gives it) is a path here."""
        if isinstance(audio_path, bytes):
            audio_path = os.fsdecode(audio_path)
        return self.transcribe(audio_path, TranscribeOptions(language=language_code(language or "auto"))).text

    def transcribe_bytes(self, audio_data: bytes, language: str | None = None) -> str:
        """WAV or anything ffmpeg reads; the bytes go to ffmpeg on stdin."""
        if isinstance(audio_data, (str, os.PathLike)):
            raise InputError("transcribe_bytes takes a file's bytes; transcribe_file takes its path")
        return self.transcribe(audio_data, TranscribeOptions(language=language_code(language or "auto"))).text

    # -- description ------------------------------------------------------------

    def info(self) -> dict:
        params = sum(p.numel() for p in self._model.parameters()) if self._model is not None else None
        return _describe(self._info, params, self.device, self.dtype)

    def capabilities(self) -> dict:
        from .platform.devices import DTYPES, available_devices, dtype_supported

        dims = self._info["dims"]
        element = {"float32": 4, "float16": 2, "bfloat16": 2}[self.dtype]
        params = sum(p.numel() for p in self._model.parameters()) if self._model is not None else 0
        # one window: encoder activations (ctx x width x ~12 live tensors) plus attention maps
        activation = (
            dims["n_audio_ctx"] * dims["n_audio_state"] * 12 + dims["n_audio_head"] * dims["n_audio_ctx"] ** 2
        ) * element
        return {
            "tasks": ["transcribe", "translate"] if dims["n_vocab"] >= 51865 else ["transcribe"],
            "word_timestamps": True,
            "alignment_heads_known": self._info.get("alignment_heads_known", False),
            "max_batch_size": MAX_BATCH_SIZE,
            "devices": available_devices(),
            "dtypes": {d: [t for t in DTYPES if dtype_supported(d, t)] for d in available_devices()},
            "memory": {"parameter_bytes": params * element, "activation_bytes_per_window": activation},
        }

    def status(self) -> dict:
        c = self._counters
        out = {
            "state": self._state,
            "device": self.device,
            "dtype": self.dtype,
            "counters": {
                "files": c.files,
                "windows_encoded": c.windows_encoded,
                "tokens_decoded": c.tokens_decoded,
                "audio_seconds": round(c.audio_seconds, 3),
                "errors": c.errors,
            },
            "average_encode_seconds": c.encode_seconds / c.windows_encoded if c.windows_encoded else None,
            "average_decode_seconds_per_token": c.decode_seconds / c.tokens_decoded if c.tokens_decoded else None,
            "memory": {"rss_bytes": _rss_bytes(), "peak_rss_bytes": _peak_rss_bytes()},
        }
        if self.device.startswith("cuda"):
            import torch

            out["memory"]["cuda_allocated_bytes"] = torch.cuda.memory_allocated(self.device)
            out["memory"]["cuda_peak_allocated_bytes"] = torch.cuda.max_memory_allocated(self.device)
        return out

    def _count_model_calls(self) -> None:
        """Time the encoder and decoder with forward hooks, so every engine is counted."""
        model, counters = self._model, self._counters

        def pre(key):
            def hook(module, args):
                counters.extra[key] = time.perf_counter()

            return hook

        def post(key, windows: bool):
            def hook(module, args, output):
                elapsed = time.perf_counter() - counters.extra.pop(key, time.perf_counter())
                if windows:
                    counters.windows_encoded += output.shape[0]
                    counters.encode_seconds += elapsed
                else:
                    counters.decode_seconds += elapsed

            return hook

        model.encoder.register_forward_pre_hook(pre("enc"))
        model.encoder.register_forward_hook(post("enc", True))
        model.decoder.register_forward_pre_hook(pre("dec"))
        model.decoder.register_forward_hook(post("dec", False))


def check_compute(compute: str) -> None:
    """A bad `--compute`, or one this CPU cannot run (int8 without fbgemm), as a UsageError or
    DeviceError: checked before a model loads."""
    from .engine.encoder import check_compute as check

    check(compute)


def check_model(model: str, path_here: bool = True) -> None:
    """An unknown model name, or a path with nothing there, as a ModelNotFoundError: checked before
    a server listens or a cluster is joined, which load the model later or elsewhere. path_here
    False: the path is read on other machines, so only names are checked."""
    from .weights.resolve import check_model_name

    check_model_name(model, path_here)


def verify_ahead(model: str) -> None:
    """Start checking the cached weights of a model name on another thread, so that the check
    overlaps the caller's start (torch's import); from_path uses the result if the file is unchanged."""
    from .weights.cache import start_verifying

    start_verifying(model)


def audio_opener(source: AudioSource, audio_stream: int | None = None) -> Callable:
    """What the engine calls to start an input: its audio chunks, decoded by ffmpeg as they are
    read. audio_stream: which of a file's audio streams (TranscribeOptions.audio_stream)."""
    import numpy as np

    from .audio.ffmpeg import decode_bytes, stream_file
    from .audio.pcm import samples_of

    if isinstance(source, np.ndarray):  # samples already, at 16 kHz
        return lambda: [samples_of(source)]
    if _is_torch_tensor(source):  # as openai-whisper's transcribe() takes them
        return lambda: [samples_of(_tensor_samples(source))]
    if isinstance(source, (AudioStream, SpooledInput)):
        return lambda: source
    if callable(source):
        return lambda: decode_bytes(source(), audio_stream)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return lambda: decode_bytes(bytes(source), audio_stream)
    if isinstance(source, (str, os.PathLike)):
        return lambda: stream_file(source, audio_stream=audio_stream)
    if callable(getattr(source, "read", None)):  # stdin, an open file, io.BytesIO, a web framework's upload
        return lambda: SpooledInput(source, audio_stream)
    return lambda: _not_audio(source)


def _is_torch_tensor(source: object) -> bool:
    torch = sys.modules.get("torch")  # a caller with a tensor has imported torch
    return torch is not None and isinstance(source, torch.Tensor)


def _tensor_samples(tensor) -> np.ndarray:
    """A tensor's samples as numpy has them: from any device, floats as float32 (bfloat16 has
    no numpy type), integers kept as the PCM they are."""
    tensor = tensor.detach().cpu()
    return (tensor.float() if tensor.is_floating_point() else tensor).numpy()


def _not_audio(source: object):
    """The error of an input of no kind audio_opener reads, which comes back as that input's own."""
    what = type(source).__name__
    raise InputError(
        f"audio must be a path, bytes, a binary file, a numpy array or torch tensor of 16 kHz samples or an"
        f" AudioStream, not {what}"
    )


def _describe(weights_info: dict, params: int | None, device: str | None, dtype: str | None) -> dict:
    from whisper.tokenizer import LANGUAGES

    dims = weights_info["dims"]
    multilingual = dims["n_vocab"] >= 51865
    n_languages = dims["n_vocab"] - 51765 - int(multilingual)
    return {
        **weights_info,
        "parameters": params,
        "layers": {"encoder": dims["n_audio_layer"], "decoder": dims["n_text_layer"]},
        "heads": {"encoder": dims["n_audio_head"], "decoder": dims["n_text_head"]},
        "width": dims["n_audio_state"],
        "vocabulary": dims["n_vocab"],
        "audio_context": dims["n_audio_ctx"],
        "text_context": dims["n_text_ctx"],
        "multilingual": multilingual,
        "languages": list(LANGUAGES)[:n_languages] if multilingual else ["en"],
        "dtype": dtype,
        "device": device,
    }


def _weights_info(weights) -> dict:
    from .weights.locations import openai_alignment_heads

    if not weights.alignment_heads and weights.name:
        weights.alignment_heads = openai_alignment_heads(
            weights.name, weights.dims["n_text_layer"], weights.dims["n_text_head"]
        )
    return {
        "name": weights.name or Path(weights.source).name,
        "source": weights.source,
        "format": weights.format,
        "sha256": weights.sha256,
        "dims": weights.dims,
        "alignment_heads_known": bool(weights.alignment_heads),
        **weights.extra,
    }


def describe_model(model_path: str) -> dict:
    """info() without building the model or touching a device: reads the weights only."""
    from .weights.resolve import resolve

    weights = resolve(model_path)
    params = sum(t.numel() for t in weights.state_dict.values())
    return _describe(_weights_info(weights), params, None, None)


def warmup_steps(model_path: str, device: str = "auto", dtype: str = "auto", diarize: bool = False) -> dict:
    """Resolve (converting and caching if needed), load, and run one forward pass, timing each;
    diarize: also load the diarizer and compile its clustering's code into the cache."""
    start = time.perf_counter()
    executor, resolve_seconds = _load(model_path, device, dtype)
    loaded = time.perf_counter()
    forward = executor.warmup()
    info = executor.info()
    diarizer_seconds = {}
    if diarize:
        from .post import diarizer

        began = time.perf_counter()
        diarizer.warm_up(executor.device)
        diarizer_seconds = {"diarizer_seconds": round(time.perf_counter() - began, 3)}
    return {
        "model": info["name"],
        "format": info["format"],
        "source": info["source"],
        "device": executor.device,
        "dtype": executor.dtype,
        "resolve_seconds": round(resolve_seconds, 3),
        "load_seconds": round(loaded - start - resolve_seconds, 3),
        "forward_seconds": round(forward, 3),
        **diarizer_seconds,
        "total_seconds": round(time.perf_counter() - start, 3),
    }


def _load(model_path: str, device: str, dtype: str) -> tuple[WhisperModelExecutor, float]:
    """The executor of a model on the device and dtype chosen, and the seconds resolving took."""
    from .engine.model import build_model
    from .platform.devices import choose, torch_dtype
    from .weights.resolve import resolve

    start = time.perf_counter()
    placement = choose(device, dtype)
    weights = resolve(model_path)
    resolve_seconds = time.perf_counter() - start
    model = build_model(weights, placement.device, torch_dtype(placement.dtype))
    return WhisperModelExecutor(model, _weights_info(weights), placement.device, placement.dtype), resolve_seconds
