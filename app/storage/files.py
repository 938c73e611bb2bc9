"""Files queuelog creates hold every payload, result, error and key digest: owner-only."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PRIVATE_MODE = 0o600


def _create(path: str | Path, flags: int) -> int:
    """Create `path` 0600 and open it; FileExistsError when it is there already.

    The mode is set with fchmod: os.open's mode argument passes through the umask, which
    could narrow it to unusable or, with a wider mode, leave it open to others."""
    fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, PRIVATE_MODE)
    try:
        os.fchmod(fd, PRIVATE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_private(path: str | Path, flags: int = os.O_RDWR) -> int:
    """Open `path` with `flags`, creating it 0600 if it is missing; returns the descriptor.
    An existing file keeps its mode: the operator may have chosen it."""
    try:
        return _create(path, flags)
    except FileExistsError:
        return os.open(path, flags)


def create_private(path: str | Path) -> None:
    """Create `path` empty and 0600 unless it exists (SQLite takes an empty file as a new
    database, and gives its -wal and -shm files the database file's mode). Where it cannot
    be created (no such directory, say), whoever opens it next reports why."""
    with contextlib.suppress(OSError):  # FileExistsError included
        os.close(_create(path, os.O_WRONLY))
