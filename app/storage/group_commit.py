"""SQLite's group commit: one writer at a time, and one COMMIT (one fsync) for many requests.

SQLite has one writer at a time, and with synchronous=FULL every commit waits for an fsync
(about 2 ms here). Callers that arrive while a commit is under way queue up; the next one to
get the lock (the leader) runs everything queued, each caller's work in its own SAVEPOINT,
and commits once. Every caller returns only after the commit that holds its work is on
disk, so durability is unchanged while one fsync serves many requests.

The contract for a caller's work (`fn` given to `run`), which follows from that:
- It may run on another thread: the leader's, which is serving another request. It must
  not read thread-local state (Flask's `request`, `g`) and must not rely on which thread
  runs it.
- It runs inside a transaction shared with other callers' work. It must do all its
  database work through the connection it is given, never commit or roll back itself, and
  have no effect outside the database (a metric, a notification, a log line saying a thing
  happened): its work is not committed when it returns, and may yet be rolled back. Such
  effects belong to the caller, after `run` has returned.
- An Exception it raises rolls back its own work alone; `run` raises it to its caller.
  A BaseException (KeyboardInterrupt, SystemExit) does the same for its own caller, and the
  leader's thread, on which it was raised, sees it too once the group has ended; the work
  not yet run goes back to the queue for the next leader.
- A failed BEGIN or COMMIT fails every caller of the group with its error: nothing of the
  group is applied.

Between processes (gunicorn workers, the CLI) the leader holds an exclusive flock on a file
beside the database: a waiting process sleeps in the kernel and wakes as soon as the lock is
free, instead of SQLite's busy handler, which sleeps in coarse steps. A forked child opens
its own connection and its own lock file.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any, Generic, TypeVar, cast

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from app.storage.files import open_private

T = TypeVar("T")
# Each caller's work in the group runs in its own SAVEPOINT of this name (one at a time).
_SAVEPOINT = "queuelog_caller"


class _Work(Generic[T]):
    """One caller's piece of a group commit, and what became of it."""

    __slots__ = ("_done", "error", "fn", "result")

    def __init__(self, fn: Callable[[Connection], T]) -> None:
        self.fn = fn
        self.result: T | None = None
        self.error: BaseException | None = None
        self._done = False

    def is_done(self) -> bool:
        """True once a leader (maybe on another thread) has settled this work."""
        return self._done

    def settle(self) -> None:
        self._done = True


class SqliteWriter:
    """Serialises SQLite writers and commits their work in groups (see the module's
    docstring for what a caller's work may and may not do)."""

    def __init__(self, engine: Engine, lock_path: str, max_batch: int = 256) -> None:
        self.engine = engine
        self.lock_path = lock_path
        self.max_batch = max_batch
        self._leader = threading.Lock()
        self._queued: list[_Work[Any]] = []
        self._queue_lock = threading.Lock()
        self._lock_file: IO[bytes] | None = None
        self._lock_pid = 0
        self._conn: Connection | None = None
        self._conn_pid = 0

    def run(self, fn: Callable[[Connection], T]) -> T:
        """Run `fn` in a write transaction, maybe with other callers' work, and return its
        result once that transaction has committed."""
        work = _Work(fn)
        with self._queue_lock:
            self._queued.append(work)
        while not work.is_done():
            with self._leader:
                if work.is_done():
                    break
                with self._queue_lock:
                    batch = self._queued[: self.max_batch]
                    del self._queued[: self.max_batch]
                interrupt = self._commit(batch)
            if interrupt is not None and interrupt is not work.error:
                # Raised on this thread while it ran another caller's work: this thread is
                # being stopped, so its own work, if still queued, is not to run either.
                with self._queue_lock:
                    if work in self._queued:
                        self._queued.remove(work)
                raise interrupt
        if work.error is not None:
            raise work.error
        return cast(T, work.result)  # done without an error: fn's own result

    @contextmanager
    def exclusive(self) -> Iterator[Connection]:
        """A write transaction of one caller, outside any group (key commands, purge)."""
        with self._leader, self._process_lock():
            conn = self._connection()
            with conn.begin():
                yield conn

    def _commit(self, batch: list[_Work[Any]]) -> BaseException | None:
        """Run `batch` in one transaction and mark each piece done, or requeue the pieces an
        interrupt left unrun. Returns the BaseException (not an Exception) a piece raised."""
        ran = batch
        interrupt: BaseException | None = None
        try:
            with self._process_lock():
                conn = self._connection()
                try:
                    with conn.begin():
                        if len(batch) == 1:
                            batch[0].result = batch[0].fn(conn)
                        else:
                            for position, work in enumerate(batch):
                                self._run_in_savepoint(conn, work)
                                if not isinstance(work.error, Exception | None):
                                    interrupt, ran = work.error, batch[: position + 1]
                                    break
                except DBAPIError:
                    # After a failed COMMIT (a deferred constraint, a full disk) SQLite may
                    # keep the transaction open while SQLAlchemy counts it ended: never use
                    # that connection again. Errors get here rarely; reconnecting is cheap.
                    self._discard_connection()
                    raise
        except BaseException as exc:  # BEGIN, COMMIT or a lone caller's work failed
            for work in ran:
                work.error = work.error or exc
            if not isinstance(exc, Exception):
                interrupt = exc
        finally:
            with self._queue_lock:
                self._queued[:0] = batch[len(ran):]
            for work in ran:
                work.settle()
        return interrupt

    def _connection(self) -> Connection:
        """The writer's own connection, kept open: only the leader uses it, under _leader."""
        if self._conn is None or self._conn_pid != os.getpid() or self._conn.closed:
            self._conn = self.engine.connect().execution_options(queuelog_write=True)
            self._conn_pid = os.getpid()
        return self._conn

    def _discard_connection(self) -> None:
        """Close the connection for good: it goes back to no pool, whatever its state."""
        if self._conn is not None:
            self._conn.invalidate()
            self._conn.close()
        self._conn = None

    @staticmethod
    def _run_in_savepoint(conn: Connection, work: _Work[Any]) -> None:
        # Sent to the driver: SQLAlchemy's begin_nested costs several times the statement
        # itself on this serial path, and this SAVEPOINT is nothing SQLAlchemy must track (the
        # caller's own begin_nested inside `fn` nests within it as usual; the leader's
        # transaction, which SQLAlchemy owns, holds them all).
        driver = conn.connection.driver_connection
        assert driver is not None  # a live connection, in a transaction
        driver.execute(f"SAVEPOINT {_SAVEPOINT}")
        try:
            work.result = work.fn(conn)
        except BaseException as exc:
            # This caller's error (a 409, say) undoes only its own writes.
            driver.execute(f"ROLLBACK TO {_SAVEPOINT}")
            driver.execute(f"RELEASE {_SAVEPOINT}")
            work.error = exc
        else:
            driver.execute(f"RELEASE {_SAVEPOINT}")

    def _open_lock_file(self) -> IO[bytes]:
        """This process's own open lock file."""
        if self._lock_file is None or self._lock_pid != os.getpid():
            # A forked child must not share its parent's open file: flock locks belong to
            # the open file, so parent and child would both believe they hold it.
            self._lock_file = os.fdopen(open_private(self.lock_path), "r+b")
            self._lock_pid = os.getpid()
        return self._lock_file

    @contextmanager
    def _process_lock(self) -> Iterator[None]:
        lock_file = self._open_lock_file()
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)
