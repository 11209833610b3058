"""Files written so that a reader never sees half of one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


UMASK = _umask()  # read once: setting it to read it is not thread-safe


def name_max(folder: Path) -> int:
    """The bytes a file name may have in folder (its nearest existing parent): 255 on most file
    systems, 143 on eCryptfs."""
    for place in (folder, *folder.parents):
        try:
            return os.pathconf(place, "PC_NAME_MAX")
        except (OSError, ValueError, AttributeError):  # not there yet; no pathconf (Windows)
            continue
    return 255


def _temp_prefix(path: Path) -> str:
    """'.NAME.', with NAME cut so that mkstemp's name (8 random characters and .tmp after) fits
    where NAME itself fits."""
    room = name_max(path.parent) - len("..XXXXXXXX.tmp")
    name = path.name
    while len(os.fsencode(name)) > room:
        name = name[:-1]
    return f".{name}."


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Temp file in the same folder, fsync, rename: a reader never sees half a file. The file gets
    the mode a plain open() would give it (mkstemp's is 0600), or keeps the one it had."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = os.stat(path).st_mode & 0o777
    except OSError:
        mode = 0o666 & ~UMASK
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent)
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
