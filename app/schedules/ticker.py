"""The ticker: a thread in each server process that fires the due schedules about twice a
second, and runs this process's own timed chores with them (the pending depth the stats
count). Where the database tells every process when a schedule changes (PostgreSQL), it
sleeps instead until the earliest slot or the next minute, and ticks when told. Started
where the app is served (wsgi.py, under QUEUELOG_SCHEDULER), never by the factory: tests
fire by hand (ScheduleService.fire_due) with a clock they move.

Every process runs one; the database decides which of them fires a slot (see service.py),
so adding processes or hosts adds no duplicates, and any one of them alive keeps schedules
firing, with no leader to wait for when one dies. The database's maintenance (leases,
expiry, cascades, reservations, retention) is the maintenance loop's, which one process
leads (app/jobs/usecases/maintenance_loop.py). A database outage is logged once and retried each
tick.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from sqlalchemy.exc import SQLAlchemyError

from app.core.clock import MICROS
from app.core.periodic import PeriodicThread
from app.core.storage_refusal import storage_refusal
from app.schedules.service import ScheduleService

log = logging.getLogger(__name__)

TICK_SECONDS = 0.5
MINUTE_US = 60 * MICROS
# How long stop() waits for a firing under way to end (its transaction commits or not).
STOP_TIMEOUT_SECONDS = 5.0


class Ticker:
    def __init__(self, schedules: ScheduleService, interval: float = TICK_SECONDS,
                 chores: Sequence[Callable[[], object]] = ()) -> None:
        self.schedules = schedules
        self.interval = interval
        # Run each tick after the schedules fire, each on its own: one failing stops none.
        self.chores = [schedules.fire_due, *chores]
        self._failing = False
        self._told = False
        # Stopped (at exit, and by gunicorn's worker_exit hook), it lets a firing under way
        # end first.
        self._thread = PeriodicThread("queuelog-schedules", self._paced_tick, interval,
                                      wait_first=True, at_exit=self.stop,
                                      stop_timeout=STOP_TIMEOUT_SECONDS)

    def start(self) -> Ticker:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._thread.stop()

    @property
    def running(self) -> bool:
        return self._thread.running

    def told_by_database(self) -> None:
        """The database tells this process when a schedule changes (a served process on
        PostgreSQL: app/jobs/wake/database_wake.py, which calls changed()): each tick then
        sleeps until the earliest slot, or the next minute's chores, rather than
        `interval`."""
        self._told = True

    def changed(self) -> None:
        """A schedule changed (told by the database): tick now."""
        self._thread.wake()

    def _paced_tick(self) -> float | None:
        self.tick()
        if not self._told or self._failing:
            return None
        now = self.schedules.clock.now_us()
        # The chores (the stats' minute) run at each minute's start at the latest.
        wait_us = MINUTE_US - now % MINUTE_US
        if self.schedules.next_slot_at is not None:
            wait_us = min(wait_us, self.schedules.next_slot_at - now)
        return max(wait_us / MICROS, self.interval / 10)

    def tick(self) -> None:
        """One round: fire what is due, then the chores; log (once per outage) and carry on
        with the next chore if one fails."""
        failed = False
        for chore in self.chores:
            try:
                chore()
            except SQLAlchemyError as exc:
                failed = True
                if not self._failing:
                    refusal = storage_refusal(exc)
                    if refusal is not None:
                        log.error("schedules: the database's storage refuses writes (%s); "
                                  "retrying every %.1f s", refusal[1], self.interval)
                    else:
                        log.warning("schedules: the database did not answer (%s); retrying "
                                    "every %.1f s", type(exc).__name__, self.interval)
                self._failing = True
            except Exception:
                failed = True
                log.exception("schedules: %s failed; retrying next tick",
                              getattr(chore, "__name__", "a chore"))
        if self._failing and not failed:
            log.warning("schedules: the database answers again; firing resumed")
            self._failing = False
