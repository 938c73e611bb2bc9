"""How this process's maintenance fares: each chore's failures, and when it may run again.

Maintenance (the sweeps of expired leases and jobs, the next steps of a cascade, the release
of overdue reservations, suspended jobs' moments, retention) is never a request's own work:
the leader's maintenance loop runs it (app/jobs/usecases/maintenance_loop.py), and a request
that ends a job follows the cascade it left. A chore that fails is logged (its error's
class, never a payload, a token or the SQL), counted in /metrics
(queuelog_maintenance_failures), shown in /readyz's `maintenance` detail, and retried with a
backoff, while requests and the other chores go on (docs/OPERATIONS.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from sqlalchemy.exc import SQLAlchemyError

log = logging.getLogger(__name__)

# A failing chore is tried again after FIRST_RETRY_SECONDS, then twice as long each time it
# fails again, up to MAX_RETRY_SECONDS.
FIRST_RETRY_SECONDS = 0.5
MAX_RETRY_SECONDS = 60.0

# The chores, as named in the log, /readyz and the metric's `chore` label.
RESCUE = "lease_rescue"
EXPIRY = "expiry"
CASCADE = "dependency_cascade"
RESERVATIONS = "reservation_release"
RETENTION = "retention"
WAITS = "wait_resume"  # suspended jobs' moments, and the events kept long enough

FailureSink = Callable[[str], None]


# Jobs (or cascades) held back per chore at most: a chore's probes skip them.
MAX_HELD_BACK = 1000


@dataclass
class ChoreFailure:
    """A chore failing now: since when (wall clock, seconds), how many failures in a row,
    the last error's class, and how many of its jobs it holds back for their backoff."""

    since: float
    failures: int
    error: str
    held_back: int = 0


def backoff_seconds(failures: int) -> float:
    return min(MAX_RETRY_SECONDS, FIRST_RETRY_SECONDS * float(2 ** min(max(failures, 1) - 1, 16)))


class MaintenanceHealth:
    """The failures of this process's chores, and the jobs each holds back. Thread-safe:
    the maintenance loop and the requests that follow their cascades report here.

    A chore that fails as a whole (the database does not answer) waits out its backoff
    (`may_run`); one whose work fails for some jobs alone holds those jobs back for theirs
    (`held_back`), and goes on with the others."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._failing: dict[str, ChoreFailure] = {}
        self._retry_at: dict[str, float] = {}
        # chore -> job id -> (failures in a row, when it may be tried again)
        self._held: dict[str, dict[int, tuple[int, float]]] = {}
        # Told the chore's name at each failure (the metrics' counter).
        self.on_failure: list[FailureSink] = []

    def may_run(self, chore: str) -> bool:
        """False while a chore that failed as a whole waits out its backoff."""
        return self._monotonic() >= self._retry_at.get(chore, 0.0)

    def held_back(self, chore: str) -> frozenset[int]:
        """The chore's jobs waiting out their backoff."""
        held = self._held.get(chore)
        if not held:
            return frozenset()
        now = self._monotonic()
        return frozenset(job_id for job_id, (_n, retry_at) in held.items() if retry_at > now)

    def succeeded(self, chore: str, ids: Collection[int] = ()) -> None:
        """The chore ran (for `ids`: these jobs went through)."""
        with self._lock:
            held = self._held.get(chore, {})
            for job_id in ids:
                held.pop(job_id, None)
            now = self._monotonic()
            still_held = sum(1 for _n, retry_at in held.values() if retry_at > now)
            self._retry_at.pop(chore, None)
            failure = self._failing.get(chore)
            if failure is None:
                return
            if still_held:
                failure.held_back = still_held
                return
            del self._failing[chore]
        log.warning("maintenance: %s works again after %d failure(s)", chore,
                    failure.failures)

    def failed(self, chore: str, error: BaseException, ids: Collection[int] = ()) -> None:
        """Log and count the failure; hold back `ids` (the jobs it failed on) for their
        backoff, or without ids the whole chore for its own."""
        name = type(error).__name__
        now = self._monotonic()
        with self._lock:
            failure = self._failing.get(chore)
            failures = 1 if failure is None else failure.failures + 1
            if ids:
                held = self._held.setdefault(chore, {})
                for job_id in ids:
                    strikes = held.get(job_id, (0, 0.0))[0] + 1
                    held[job_id] = (strikes, now + backoff_seconds(strikes))
                while len(held) > MAX_HELD_BACK:
                    del held[next(iter(held))]
                delay = max(held[job_id][1] for job_id in ids if job_id in held) - now
            else:
                delay = backoff_seconds(failures)
                self._retry_at[chore] = now + delay
            held_now = sum(1 for _n, retry_at in self._held.get(chore, {}).values()
                           if retry_at > now)
            self._failing[chore] = ChoreFailure(
                since=time.time() if failure is None else failure.since,
                failures=failures, error=name, held_back=held_now)
        # The class alone: a driver's message can carry the SQL, its values or the host.
        what = f"{len(ids)} job(s)" if ids else "the chore"
        if isinstance(error, SQLAlchemyError):
            log.error("maintenance: %s failed (%s); %s retried in %.1f s", chore, name, what,
                      delay)
        else:
            log.error("maintenance: %s failed (%s); %s retried in %.1f s", chore, name, what,
                      delay, exc_info=error)
        for sink in self.on_failure:
            sink(chore)

    def failing(self) -> dict[str, ChoreFailure]:
        """The chores failing now, by name."""
        with self._lock:
            return {chore: ChoreFailure(f.since, f.failures, f.error, f.held_back)
                    for chore, f in self._failing.items()}

    def guarded(self, chore: str, work: Callable[[], object]) -> bool:
        """Run `work` unless the chore waits out its backoff; a failure is reported, never
        raised. True when it ran and succeeded."""
        if not self.may_run(chore):
            return False
        try:
            work()
        except Exception as error:  # a chore's failure must not spread
            self.failed(chore, error)
            return False
        self.succeeded(chore)
        return True
