"""Which process leads a database's maintenance: one at a time, whichever holds a lock that
its death frees (docs/OPERATIONS.md, "Maintenance").

- PostgreSQL: a session-level advisory lock (`pg_try_advisory_lock`) held by a connection of
  its own, in autocommit (an idle session holds back no vacuum). A process that does not
  lead holds no connection for it: each try borrows a pooled connection and gives it back;
  the try that wins detaches its connection from the pool and keeps it. The server frees
  the lock when that session ends, so a process that dies, or loses its connection, loses
  the lead; advisory locks are per database, so each database has one leader. A session
  pooler in transaction mode (PgBouncer's) cannot keep a session lock: the service must
  reach the server directly, as it must for its other session state.
- SQLite: an exclusive `flock` on a file beside the database (`<database>-maintenance.lock`),
  which the kernel frees when the process dies. flock locks belong to the open file, so two
  apps in one process, each with its own open file, are two contenders as two processes are.

`hold()` answers, each time it is asked, whether this process leads now: it takes the lock
when it is free and, while it holds it, checks that it still does (the connection
answers). A forked child holds nothing its parent held: it opens its own file or
connection.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from typing import IO, Protocol

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import SQLAlchemyError

from app.storage.files import open_private

# The advisory lock's key: "queuelog" in ASCII, unlikely to be another application's.
ADVISORY_LOCK_KEY = 0x71756575656C6F67


class Leadership(Protocol):
    def hold(self) -> bool:
        """True while this process leads: takes the lead when it is free, and checks that
        it still holds it when it does."""
        ...

    def release(self) -> None:
        """Give the lead up (the process stops): another process may take it at once."""
        ...


def leadership_of(engine: Engine) -> Leadership:
    """The lead of the database `engine` reaches."""
    if engine.dialect.name == "sqlite":
        return FileLeadership(f"{engine.url.database}-maintenance.lock")
    return AdvisoryLeadership(engine)


class FileLeadership:
    """SQLite's: an exclusive flock on a file beside the database, never waited for."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: IO[bytes] | None = None
        self._pid = 0

    def hold(self) -> bool:
        if self._file is not None and self._pid == os.getpid():
            return True  # a flock stays held as long as the process keeps its file open
        # A forked child's inherited file is its parent's lock, not its own: left alone.
        self._file = None
        # Read-only is enough for a flock, and still opens on a filesystem turned read-only.
        lock_file = os.fdopen(open_private(self.path, os.O_RDONLY), "rb")
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock_file.close()
            return False
        except BaseException:
            lock_file.close()
            raise
        self._file, self._pid = lock_file, os.getpid()
        return True

    def release(self) -> None:
        if self._file is not None and self._pid == os.getpid():
            self._file.close()  # closing the last descriptor of the open file unlocks it
        self._file = None


class AdvisoryLeadership:
    """PostgreSQL's: a session advisory lock on a connection taken out of the pool."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        # Held while this process leads, never otherwise: a follower's try gives its
        # connection back, so the lead costs a database one connection, not one per process.
        self._conn: Connection | None = None
        self._pid = 0

    def hold(self) -> bool:
        if self._pid != os.getpid():
            # A forked child must not use (nor close) its parent's session.
            self._conn, self._pid = None, os.getpid()
        try:
            if self._conn is not None:
                self._conn.execute(text("SELECT 1"))  # the session, and so its lock, lives
                return True
            conn = self._engine.connect()
            try:
                conn.execution_options(isolation_level="AUTOCOMMIT")
                if conn.execute(text("SELECT pg_try_advisory_lock(:key)"),
                                {"key": ADVISORY_LOCK_KEY}).scalar_one():
                    # The session holding the lock leaves the pool: never lent to a
                    # request, and closed (the lock with it) only by release() or death.
                    conn.detach()
                    self._conn = conn
                    return True
                return False
            finally:
                if self._conn is not conn:
                    conn.close()  # back to the pool: a follower keeps no connection
        except SQLAlchemyError:
            # The session is gone, and its lock with it (or never was): the lead is lost,
            # to be tried for again. The caller reports the error.
            self._close()
            raise

    def release(self) -> None:
        if self._pid == os.getpid():
            if self._conn is not None:
                # Unlocked before the close: the server frees a closed session's locks a
                # moment after the close returns, and the next leader should not wait.
                with contextlib.suppress(SQLAlchemyError):
                    self._conn.execute(text("SELECT pg_advisory_unlock(:key)"),
                                       {"key": ADVISORY_LOCK_KEY})
            self._close()
        self._conn = None

    def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(SQLAlchemyError):  # dead: nothing left to free
                self._conn.close()
        self._conn = None


def try_advisory_lead(conn: Connection) -> bool:
    """Take the database's maintenance lead on `conn`'s session if it is free (a session lock:
    held until the session ends). The listening session's way to lead (app/storage/listener.py)."""
    return bool(conn.execute(text("SELECT pg_try_advisory_lock(:key)"),
                             {"key": ADVISORY_LOCK_KEY}).scalar_one())
