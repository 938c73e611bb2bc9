"""Listening to PostgreSQL's notifications: one session per host (docs/SCALING.md, "The
database tells every host").

The database's triggers send a notification on CHANNEL when a transaction changes what a
waiting process acts on (migrations 0025 and 0027): its payload names the kinds of change,
space-separated. Of the processes of one host that serve a database, the one holding an
exclusive flock on a file beside the host's wake directory listens, on a connection of its own
taken out of the pool (never lent to a request); the others wait on the flock, which the
kernel hands to one of them the moment the holder dies. The listener hands each
notification's kinds to `deliver` (which tells this host's processes), and, between
notifications, lets a `duty` use the idle session (the maintenance lead: its advisory lock
lives on this session, so that the lead needs no connection of its own).

Nothing is lost for good: when the session is cut or a new listener takes over, it delivers
every kind once it listens again, so every waiter looks once, as a lost notification would
have had it do. A session that goes quiet without breaking (a cut link) is found by the
duty's statements, at least every PROBE_SECONDS.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import IO, Protocol

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import SQLAlchemyError

from app.storage.files import open_private

log = logging.getLogger(__name__)

CHANNEL = "queuelog"
APPLICATION_NAME = "queuelog listener"
# At most this long between two statements on the listening session: how soon a session
# that went quiet without breaking is found dead.
PROBE_SECONDS = 5.0
# How soon a stopped listener notices it is stopped.
_STOP_CHECK_SECONDS = 0.5
# After a failed connect, the next try's wait (doubling up to the last).
RECONNECT_SECONDS = (0.2, 5.0)


class ListenerDuty(Protocol):
    """Work done on the listening session between notifications."""

    def tick(self, conn: Connection) -> float:
        """Use the session (autocommit); the seconds until the next tick."""
        ...

    def lost(self) -> None:
        """The session ended (whatever it held, it holds no more)."""
        ...


class DatabaseListener:
    """This process's part: wait for the host's listening turn, then listen until stopped
    (without `lock_path`, listen at once, for this process alone: `queuelog dispatch`).

    `deliver(kinds)` runs in the listening thread, for each notification and, with
    `every_kind`, after each (re)connect. A forked child starts its own thread.
    """

    def __init__(self, engine: Engine, lock_path: str | None,
                 deliver: Callable[[frozenset[str]], None], every_kind: frozenset[str],
                 duty: ListenerDuty | None = None) -> None:
        self.engine = engine
        self.lock_path = lock_path
        self.deliver = deliver
        self.every_kind = every_kind
        self.duty = duty
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._lock_file: IO[bytes] | None = None
        self._conn: Connection | None = None
        self.listening = False

    def start(self) -> DatabaseListener:
        if self._thread is not None and self._pid == os.getpid():
            return self
        self._pid = os.getpid()
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="queuelog-listener", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening: within half a second the session (and what its duty held) and the
        host's turn are given up, so another process takes them. Not waited for: a process
        that exits gives them up as it goes, its files and sockets closed by the kernel."""
        self._stopping.set()

    def _run(self) -> None:
        try:
            self._lock_file = self._wait_for_turn()
        except OSError as error:
            log.warning("notifications: this host's listening turn could not be taken (%s); "
                        "waiting requests poll instead", error)
            return
        if self._lock_file is None:
            return
        try:
            wait = RECONNECT_SECONDS[0]
            while not self._stopping.is_set():
                try:
                    self._listen()
                    wait = RECONNECT_SECONDS[0]
                except Exception as error:  # psycopg's own too: nothing ends the thread
                    if self.listening or wait == RECONNECT_SECONDS[0]:
                        log.warning("notifications: the listening session ended (%s); "
                                    "connecting again", type(error).__name__)
                    self._end_session()
                    if self._stopping.wait(wait):
                        break
                    wait = min(wait * 2, RECONNECT_SECONDS[1])
        finally:
            self._end_session()
            self._lock_file.close()  # the next process in line takes the turn

    def _wait_for_turn(self) -> IO[bytes] | None:
        if self.lock_path is None:  # a process that listens for itself alone
            return open(os.devnull, "rb")
        lock_file = os.fdopen(open_private(self.lock_path, os.O_RDONLY), "rb")
        while not self._stopping.is_set():
            try:
                fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return lock_file
            except BlockingIOError:
                # Blocking in flock would leave stop() no way to end this thread; a try a
                # second costs a system call, nothing on the database.
                self._stopping.wait(1.0)
        lock_file.close()
        return None

    def _listen(self) -> None:
        conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        conn.detach()  # never back to the pool: closed with the session
        self._conn = conn
        # Named, so that an operator tells it from the pools' sessions (pg_stat_activity).
        conn.execute(text(f"SET application_name = '{APPLICATION_NAME}'; LISTEN {CHANNEL}"))
        raw = conn.connection.dbapi_connection
        assert raw is not None
        self.listening = True
        # Whatever was sent while nobody on this host listened: every waiter looks once.
        self.deliver(self.every_kind)
        next_tick = time.monotonic()
        while not self._stopping.is_set():
            now = time.monotonic()
            if now >= next_tick:
                wait = PROBE_SECONDS
                if self.duty is not None:
                    wait = min(self.duty.tick(conn), PROBE_SECONDS)
                else:
                    conn.execute(text("SELECT 1"))
                next_tick = time.monotonic() + wait
            kinds: set[str] = set()
            # In slices, so that stop() is seen within one (a wait costs no statement).
            wait = min(max(next_tick - time.monotonic(), 0.0), _STOP_CHECK_SECONDS)
            for notification in raw.notifies(timeout=wait, stop_after=1):
                kinds.update(notification.payload.split())
            if kinds:
                # And whatever else has arrived: many notices waiting are told as one, so a
                # burst of commits wakes each waiter once, not once per commit.
                for notification in raw.notifies(timeout=0.0):
                    kinds.update(notification.payload.split())
                self.deliver(frozenset(kinds))

    def _end_session(self) -> None:
        was = self.listening
        self.listening = False
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(SQLAlchemyError):
                conn.close()
        if was and self.duty is not None:
            self.duty.lost()
