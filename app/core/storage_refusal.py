"""Database errors that say the storage refuses writes (a full disk, a read-only or failing
filesystem), named for the service: the client's 503 (app/web/problems.py) and the log lines
of the processes that write on their own (the tickers). Read from the driver's error codes
(SQLite's result code, PostgreSQL's SQLSTATE) by name, with no driver imported."""

from __future__ import annotations

from app.core.errors import StorageUnavailable

# What SQLite says when its files cannot be written (the primary result codes, below the
# extended ones' low byte): SQLITE_FULL, and SQLITE_READONLY / SQLITE_IOERR, which a
# filesystem turned read-only or a failing disk give.
_SQLITE_FULL = 13
_SQLITE_STORAGE_REFUSED = frozenset({8, 10})
# PostgreSQL's disk_full (class 53, insufficient resources).
_POSTGRES_DISK_FULL = "53100"


def storage_refusal(error: BaseException) -> tuple[StorageUnavailable, str] | None:
    """A database error that says the storage refuses writes, as the client's error and
    the cause's name for the log (SQLITE_FULL, …); None for any other error."""
    orig = getattr(error, "orig", None)
    code = getattr(orig, "sqlite_errorcode", None)
    if isinstance(code, int):
        primary = code & 0xFF
        if primary == _SQLITE_FULL or primary in _SQLITE_STORAGE_REFUSED:
            name = str(getattr(orig, "sqlite_errorname", code))
            return StorageUnavailable(full=primary == _SQLITE_FULL), name
    if getattr(orig, "sqlstate", None) == _POSTGRES_DISK_FULL:
        return StorageUnavailable(full=True), "disk_full"
    return None
