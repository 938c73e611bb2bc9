"""This process's copy of the job types' settings: what the hot path asks of a type (has it key
modes? is it under flow control?) answered without a read of job_types per transaction.

The copy is read whole (one row per type ever changed: a few rows) by a background thread at
most once a second where the app is served (`start`), and at once in the process that changed
a type (TypeService). Where nothing started the thread (an operator's command, a test), a copy
a second old is not trusted (the transaction reads as without one) and is read again in a
short thread of its own. The rules that must hold at once on every host do
not trust it (docs/FLOW-CONTROL.md, Type settings across processes):

- a claim of types the copy shows free of flow control carries the condition "no row of
  job_types puts the job's type under flow control" in its own statement, so a pause, a cap,
  a rate or a push url set on another host stops plain claims of that type at once;
- a type the copy shows under flow control, or with key modes, is read as before, in the
  transaction; so is the key mode of a job that carries a concurrency key.

What a stale copy can do is let a job without a key of a type that just became fair enter
pending without a round: each process that sees a type become fair numbers such jobs (at
that refresh and the next), as they would have been numbered on entering.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Mapping

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from app.core.clock import MICROS, Clock
from app.core.periodic import PeriodicThread
from app.jobs.sql.key_repository import KeyRepository
from app.jobs.sql.repository import JobRepository
from app.jobs.tx.key_rules import number_unrounded
from app.storage.engine import Database
from app.storage.schema import job_types
from app.types.models import TypeSettings

log = logging.getLogger(__name__)

# How old the copy may grow: the background thread reads it this often, and a process without
# the thread reads it again on use once it is this old.
REFRESH_SECONDS = 1.0
# Where the database tells of each change: the thread's safety-net read.
TOLD_REFRESH_SECONDS = 60.0
# The refreshes after the one that saw a type become fair that number its stragglers again
# (an enqueue that decided on the stale copy may commit after the first).
_CATCH_UP_REFRESHES = 2


class TypeSettingsCopy:
    def __init__(self, db: Database, clock: Clock,
                 refresh_seconds: float = REFRESH_SECONDS) -> None:
        self.db = db
        self.clock = clock
        self.refresh_seconds = refresh_seconds
        self._settings: dict[str, TypeSettings] | None = None  # None: not read yet
        self._read_at = 0.0  # time.monotonic() of the last read
        self._lock = threading.Lock()
        self._catch_up: dict[str, int] = {}  # newly fair type -> refreshes left to number it
        self._thread = PeriodicThread("queuelog-type-settings", self._refresh_round,
                                      refresh_seconds, at_exit=self.stop,
                                      stop_timeout=refresh_seconds * 5)
        self._wanted = False  # start() was called: the copy is kept fresh by the thread
        self._failing = False
        self._start_lock = threading.Lock()
        self._reading = False  # a one-off read is under way (_refresh_soon)
        self._aging: Mapping[str, int] = {}  # aging(), as of the copy _aging_of
        self._aging_of: dict[str, TypeSettings] | None = None

    # -- what the hot path asks -----------------------------------------------------------

    def without_key_modes(self, job_type: str) -> bool:
        """True when the copy shows the type neither fair nor ordered (app/jobs/tx/key_rules.py
        then reads nothing for its jobs without a concurrency key)."""
        current = self._current()
        if current is None:
            return False  # no fresh copy: read in the transaction, as before
        settings = current.get(job_type)
        if settings is None:
            return True
        mode = settings.key_mode
        return not (mode.fair or mode.ordered)

    def under_flow_control(self, wanted: Collection[str] | None) -> bool:
        """True when the copy shows one of the `wanted` types (None: any) paused, pushed,
        fair, or with a cap or a rate: a claim of them reads their rows as before."""
        current = self._current()
        if current is None:
            return True  # no fresh copy: the rows are read, as before
        return any(s.is_limited for name, s in current.items()
                   if wanted is None or name in wanted)

    def orders_keys(self, wanted: Collection[str] | None) -> bool:
        """True when the copy shows one of the `wanted` types (None: any) ordered per key (or
        when there is no fresh copy): a job of it may become claimable when another ends."""
        current = self._current()
        if current is None:
            return True
        return any(s.key_mode.ordered for name, s in current.items()
                   if wanted is None or name in wanted)

    # -- keeping it fresh -------------------------------------------------------------------

    def aging(self) -> Mapping[str, int]:
        """The types that age (not fair ones: their claims take rounds), with their interval
        in µs. From the last copy read, however old: an aged order a second late is the
        same kind of order, and a claim must not wait for a read."""
        self._current()  # read again soon when it is old
        settings = self._settings
        if settings is None:
            return {}
        if self._aging_of is not settings:
            self._aging = {name: s.aging_seconds * MICROS for name, s in settings.items()
                           if s.aging_seconds is not None and s.fairness is None}
            self._aging_of = settings
        return self._aging

    def snapshot(self) -> dict[str, TypeSettings] | None:
        """Every stored type's settings as the copy holds them (None: no fresh copy)."""
        return self._current()

    def tick(self) -> None:
        """What the background thread does each second: read the copy again, then number
        the stragglers of the types it saw become fair."""
        self.refresh()
        self.catch_up()

    def refresh(self) -> None:
        """Read every type's row now. Writes nothing: it may run inside a transaction (read
        on use, or right after a change)."""
        with self.db.read() as conn:
            rows = [TypeSettings.from_row(row._mapping) for row in conn.execute(select(job_types))]
        fresh = {s.type: s for s in rows}
        with self._lock:
            before, self._settings = self._settings, fresh
            self._read_at = time.monotonic()
            if before is not None:
                for name, settings in fresh.items():
                    old = before.get(name)
                    if settings.is_fair and (old is None or not old.is_fair):
                        self._catch_up[name] = _CATCH_UP_REFRESHES

    def catch_up(self) -> None:
        """Number the pending jobs left without a round in the types this process saw become
        fair (at the refresh that saw it and the next)."""
        with self._lock:
            due = sorted(self._catch_up)
            settings = self._settings or {}
        for name in due:
            self._number_stragglers(name, settings.get(name))

    def start(self) -> TypeSettingsCopy:
        """Keep the copy fresh in a daemon thread (where the app is served)."""
        self._wanted = True
        self._thread.start()
        return self

    def stop(self) -> None:
        self._thread.stop()

    def told_by_database(self) -> None:
        """The database tells this process when a type's settings change (a served process
        on PostgreSQL: app/jobs/wake/database_wake.py, which calls changed()): the thread reads
        the copy then, and otherwise only every TOLD_REFRESH_SECONDS, a safety net."""
        self._thread.interval = TOLD_REFRESH_SECONDS

    def changed(self) -> None:
        """A type's settings changed (told by the database): read the copy now."""
        self._thread.wake()

    def _refresh_round(self) -> float | None:
        """The thread's round; while stragglers of a newly fair type are left to number, the
        next comes within a second whatever the thread's interval."""
        try:
            self.tick()
        except SQLAlchemyError as error:
            if not self._failing:  # logged once per outage; the last copy is kept meanwhile
                # The class alone: a driver's message can carry the SQL or the host.
                log.warning("queuelog: the job types' settings could not be read (%s); "
                            "retrying each second", type(error).__name__)
            self._failing = True
        else:
            self._failing = False
        return REFRESH_SECONDS if self._failing or self._catch_up else None

    def _current(self) -> dict[str, TypeSettings] | None:
        """The copy, or None when there is none fresh enough to trust (then the caller reads
        in its transaction, as without a copy). Never read here: a request's transaction
        may be holding its connection, and a second one could wait on the pool for ever."""
        if self._wanted and not self._thread.started:
            # Started before a fork (gunicorn --preload): the thread stayed in the parent.
            self.start()
        settings = self._settings
        if self._thread.running:
            return settings
        if settings is None or time.monotonic() - self._read_at >= self.refresh_seconds:
            self._refresh_soon()
            return None
        return settings

    def _refresh_soon(self) -> None:
        """Without the thread (an operator's command, a test): one read off the request
        path, in a short thread of its own, at most one at a time."""
        with self._start_lock:
            if self._reading:
                return
            self._reading = True

        def read() -> None:
            try:
                self.tick()
            except SQLAlchemyError:
                log.warning("queuelog: the job types' settings could not be read",
                            exc_info=True)
            finally:
                self._reading = False

        threading.Thread(target=read, name="queuelog-type-settings-once", daemon=True).start()

    def _number_stragglers(self, job_type: str, settings: TypeSettings | None) -> None:
        with self._lock:
            left = self._catch_up.get(job_type, 0) - 1
            if left <= 0:
                self._catch_up.pop(job_type, None)
            else:
                self._catch_up[job_type] = left
        if settings is None or not settings.is_fair:
            return
        mode = settings.key_mode
        self.db.run_write(lambda conn: number_unrounded(
            JobRepository(conn), KeyRepository(conn), job_type, mode, self.clock.now_us()))

