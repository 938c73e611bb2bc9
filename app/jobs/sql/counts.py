"""The backlog's counts, by type: waiting, pending (and scheduled, and the oldest due),
completed, failed and cancelled. One place for them: GET /types, the dashboard (through the
type service) and /metrics read the same snapshot, at most QUEUELOG_TYPE_COUNTS_MAX_AGE_SECONDS old.

Counting them reads one index entry per stored pending or finished job (about 0.5 s at a
million on SQLite): too slow for every request, and a cost that grows with the backlog.
A stale snapshot is answered at once while one thread of the process counts
again in the background; only the first request of a process (or every request, with max
age 0) waits for the count, and concurrent first requests share one count. The running
jobs are not here: they are as many as the workers hold, and read live by whoever needs them.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from app.core.clock import Clock
from app.core.errors import ServiceUnavailable
from app.jobs.domain.models import PendingSummary
from app.jobs.sql.repository import JobRepository
from app.storage.engine import Database

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BacklogSnapshot:
    """The counts as of `counted_at_us` (the service's clock)."""

    counted_at_us: int
    pending: Mapping[str, PendingSummary] = field(default_factory=dict)
    # (type, status) -> count, for completed, failed and cancelled.
    finished: Mapping[tuple[str, str], int] = field(default_factory=dict)
    # type -> count of its jobs waiting for dependencies.
    waiting: Mapping[str, int] = field(default_factory=dict)
    # type -> count of its reserved jobs (docs/JOBS.md, Reserved jobs).
    reserved: Mapping[str, int] = field(default_factory=dict)
    # type -> count of its suspended jobs (docs/WAITS.md).
    suspended: Mapping[str, int] = field(default_factory=dict)

    def pending_of(self, job_type: str) -> PendingSummary:
        return self.pending.get(job_type, PendingSummary(0, 0, None))

    def oldest_due_run_at(self) -> int | None:
        """The oldest due run_at of any type (None: nothing was due)."""
        found = [s.oldest_due_run_at for s in self.pending.values()
                 if s.oldest_due_run_at is not None]
        return min(found) if found else None

    def types(self) -> set[str]:
        """Every type with a pending or finished job stored."""
        return (set(self.pending) | set(self.waiting) | set(self.reserved)
                | set(self.suspended)
                | {job_type for job_type, _status in self.finished})


class BacklogCounts:
    """The per-process cache of the backlog's counts (see the module's docstring)."""

    def __init__(self, db: Database, clock: Clock, max_age_seconds: float) -> None:
        self.db = db
        self.clock = clock
        self.max_age = max_age_seconds
        self._lock = threading.Lock()
        self._counting = threading.Lock()  # one count at a time per process
        self._value: BacklogSnapshot | None = None
        self._counted_at = 0.0  # time.monotonic() when the count that made _value began
        self._refreshing = False

    def get(self) -> BacklogSnapshot:
        with self._lock:
            value, age = self._value, time.monotonic() - self._counted_at
            stale = value is None or age >= self.max_age
            start_refresh = stale and value is not None and not self._refreshing
            if start_refresh:
                self._refreshing = True
        if value is None or self.max_age <= 0:
            # With max age 0 the count must have begun after this request did; a first
            # request takes any count, a concurrent one's included.
            return self._count(time.monotonic() if self.max_age <= 0 else -math.inf)
        if start_refresh:
            threading.Thread(target=self._refresh, name="queuelog-backlog-counts",
                             daemon=True).start()
        return value

    def pending_now(self) -> Mapping[str, PendingSummary]:
        """The pending jobs by type: this process's snapshot while it is fresh, else a count
        of their own that leaves the snapshot as it is (a caller on a timer, the stats'
        depth, must not make the pages read a count older than they would have)."""
        with self._lock:
            value, age = self._value, time.monotonic() - self._counted_at
        if value is not None and age < self.max_age:
            return value.pending
        with self.db.counting_read() as conn:
            return JobRepository(conn).pending_by_type(self.clock.now_us())

    def _count(self, begun_since: float) -> BacklogSnapshot:
        """A snapshot counted by a count that began at `begun_since` or later: this one, or
        one that finished while this one waited for its turn."""
        with self._counting:
            with self._lock:
                if self._value is not None and self._counted_at >= begun_since:
                    return self._value
            started = time.monotonic()
            # A counting read: it takes a slot of the counting-reads budget (app/storage/engine.py).
            with self.db.counting_read() as conn:
                now = self.clock.now_us()
                repo = JobRepository(conn)
                value = BacklogSnapshot(now, repo.pending_by_type(now), repo.count_finished(),
                                        repo.count_waiting(), repo.count_reserved(),
                                        repo.count_suspended())
            with self._lock:
                self._value, self._counted_at = value, started
            return value

    def _refresh(self) -> None:
        try:
            self._count(math.nextafter(self._counted_at, math.inf))
        except ServiceUnavailable:
            pass  # the budget is full: the next request after this one tries again
        except Exception:
            log.exception("backlog counts: the background count failed")
        finally:
            with self._lock:
                self._refreshing = False
