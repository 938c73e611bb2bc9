"""This process's entry among the waiters (PostgreSQL with notices: docs/SCALING.md, "The
database tells every host").

The jobs' triggers notify only while some process's entry in job_waiters is current, so that
enqueues pay nothing for notices while nobody waits (PostgreSQL serialises the commits of
notifying transactions). A request that is about to wait holds the entry for HOLD_SECONDS,
longer than any wait, with one statement, written again only when less than the longest wait
is left: a process whose requests keep waiting writes it every 25 s or so.

An entry written anew (none was current) cannot have been seen by a transaction that checked
before it committed: such a transaction may commit a job after the request's first look and
tell nobody. So for GRACE_SECONDS after, the process's waits peek every POLL_SECONDS, as
without notices, which any such transaction outlasts but a long batch.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time

from app.core.clock import MICROS, Clock
from app.jobs.sql.waiter_repository import hold_waiting
from app.storage.engine import Database

# Longer than any wait (a read waits up to 60 s): an entry written at a wait's start lasts it.
HOLD_SECONDS = 90.0
# Written again when less than this is left: more than the longest wait.
REFRESH_LEFT_SECONDS = 65.0
GRACE_SECONDS = 1.0
_entries = itertools.count(1)


class WaiterEntry:
    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock
        self._number = next(_entries)
        self._lock = threading.Lock()
        self._until_us = 0
        self._pid = 0
        self._peek_until = 0.0

    @property
    def name(self) -> str:
        return f"{socket.gethostname()[:150]}:{os.getpid()}:{self._number}"

    def before_wait(self) -> float:
        """Hold the entry for a wait that starts now (a statement when it must be written);
        until when (time.monotonic) this process's waits must still peek."""
        now = self.clock.now_us()
        with self._lock:
            if (self._pid == os.getpid()
                    and self._until_us - now > REFRESH_LEFT_SECONDS * MICROS):
                return self._peek_until
            lapsed = self._pid != os.getpid() or self._until_us <= now
        until = now + round(HOLD_SECONDS * MICROS)
        name = self.name
        self.db.run_statement(lambda conn: hold_waiting(conn, name, until))
        with self._lock:
            self._until_us, self._pid = until, os.getpid()
            if lapsed:
                self._peek_until = time.monotonic() + GRACE_SECONDS
            return self._peek_until
