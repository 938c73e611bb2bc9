"""This process's entries among the waiters (PostgreSQL with notices: docs/SCALING.md, "The
database tells every host").

The jobs' triggers notify only while some process waits for the change: a claim for the
job's type, or a read for a job's end. PostgreSQL serialises the commits of notifying
transactions, so enqueues of a type nobody waits for pay nothing for notices. A request that
is about to wait holds its process's entry (its claims' types, or its reads) for
HOLD_SECONDS, longer than any wait, with one statement, written again only when less than the
longest wait is left or a claim waits for a type the entry lacks: a process whose requests
keep waiting for the same types writes it every 25 s or so.

A type added to an entry (or an entry written anew) cannot have been seen by a transaction
that checked before it committed: such a transaction may commit a job after the request's
first look and tell nobody. So for GRACE_SECONDS after, the process's waits peek every
POLL_SECONDS, as without notices, which any such transaction outlasts but a long batch.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from collections.abc import Collection

from sqlalchemy import Connection

from app.core.clock import MICROS, Clock
from app.jobs.sql.waiter_repository import CLAIMS, READS, forget_lapsed, hold_waiting
from app.storage.engine import Database

# Longer than any wait (a read waits up to 60 s): an entry written at a wait's start lasts it.
HOLD_SECONDS = 90.0
# Written again when less than this is left: more than the longest wait.
REFRESH_LEFT_SECONDS = 65.0
GRACE_SECONDS = 1.0
# Entries lapsed this long ago (their processes stopped waiting, or stopped) are forgotten by
# the next entry written.
FORGET_AFTER_SECONDS = 3600.0
# What a claim of any type waits for, in the entry's types.
ANY_TYPE = ""
_entries = itertools.count(1)


class WaiterEntry:
    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock
        self._number = next(_entries)
        self._lock = threading.Lock()
        self._pid = 0
        # What each entry holds (the types of its claims, or ANY_TYPE), and until when.
        self._held: dict[str, dict[str, int]] = {CLAIMS: {}, READS: {}}
        self._peek_until = 0.0

    @property
    def name(self) -> str:
        return f"{socket.gethostname()[:150]}:{os.getpid()}:{self._number}"

    def before_claim_wait(self, types: Collection[str] | None) -> float:
        """Hold the claims' entry for a claim of `types` (None: any) that starts now; until
        when (time.monotonic) this process's waits must still peek."""
        return self._hold(CLAIMS, [ANY_TYPE] if types is None else sorted(types))

    def before_read_wait(self, _types: Collection[str] | None = None) -> float:
        """Hold the reads' entry for a read that starts to wait for a job's end now."""
        return self._hold(READS, [ANY_TYPE])

    def _hold(self, waits_for: str, wanted: list[str]) -> float:
        now = self.clock.now_us()
        refresh_by = now + round(REFRESH_LEFT_SECONDS * MICROS)
        with self._lock:
            if self._pid != os.getpid():  # a forked child's entries are its own
                self._held = {CLAIMS: {}, READS: {}}
                self._pid = os.getpid()
            held = self._held[waits_for]
            if all(held.get(item, 0) > refresh_by for item in wanted):
                return self._peek_until
            new = any(held.get(item, 0) <= now for item in wanted)
            until = now + round(HOLD_SECONDS * MICROS)
            current = {item for item, at in held.items() if at > now} | set(wanted)
        types = None if ANY_TYPE in current else current
        name = self.name
        lapsed_before = now - round(FORGET_AFTER_SECONDS * MICROS)

        def write(conn: Connection) -> None:
            hold_waiting(conn, name, waits_for, types, until)
            forget_lapsed(conn, lapsed_before)

        self.db.run_write(write)
        with self._lock:
            self._held[waits_for] = dict.fromkeys(current, until)
            if new:
                self._peek_until = time.monotonic() + GRACE_SECONDS
            return self._peek_until
