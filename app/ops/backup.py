"""A consistent copy of the live SQLite database, taken while the service keeps writing.

A plain file copy of a WAL database can pair a main file from one moment with a -wal file
from another, or miss the -wal file's commits altogether. `VACUUM INTO` reads the database
in one read transaction, so the copy is the database as of one instant; under WAL it holds
no lock that writers wait for.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import uuid
from pathlib import Path

from sqlalchemy import Engine

from app.storage.dialects import is_sqlite
from app.storage.files import create_private


class BackupError(RuntimeError):
    """The backup cannot be taken; the message tells the operator why."""


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _check_copy(path: Path) -> int:
    """Open the copy as its own database, check it, and count its jobs."""
    copy = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        verdict = copy.execute("PRAGMA integrity_check").fetchone()[0]
        if verdict != "ok":
            raise BackupError(f"the copy failed its integrity check: {verdict}")
        count: int = copy.execute("SELECT count(*) FROM jobs").fetchone()[0]
        return count
    finally:
        copy.close()


def backup_sqlite(engine: Engine, target: Path, *, overwrite: bool = False) -> int:
    """Write a consistent copy of the engine's SQLite database to `target`; returns how many
    jobs the copy holds. The copy appears at `target` whole or not at all."""
    if not is_sqlite(engine):
        raise BackupError("backup copies a SQLite database; back PostgreSQL up with pg_dump "
                          "or the server's own backups")
    source = Path(engine.url.database or "").resolve()
    target = Path(target).resolve()
    if target == source:
        raise BackupError("the backup cannot overwrite the live database")
    if not target.parent.is_dir():
        raise BackupError(f"{target.parent} is not a directory")
    if target.exists() and not overwrite:
        raise BackupError(f"{target} exists; add --force to replace it")

    partial = target.with_name(f".{target.name}.{uuid.uuid4().hex}.partial")
    try:
        # The copy holds everything the database does: owner-only, whatever the umask.
        # VACUUM INTO writes into an empty file it is given, keeping its mode.
        create_private(partial)
        # A raw connection: VACUUM cannot run inside the transaction SQLAlchemy would begin,
        # and this one still has the engine's busy timeout.
        raw = engine.raw_connection()
        try:
            driver = raw.driver_connection
            if driver is None:  # only once the pool has invalidated it
                raise BackupError("the database connection closed before the copy began")
            driver.execute("VACUUM INTO ?", (str(partial),))
        finally:
            raw.close()
        # VACUUM INTO does not sync what it wrote; the rename below must not publish a file
        # that a power cut could still empty.
        _fsync(partial)
        jobs = _check_copy(partial)
        os.replace(partial, target)
        _fsync(target.parent)
    except sqlite3.Error as exc:
        raise BackupError(f"SQLite refused the backup: {exc}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
    return jobs
