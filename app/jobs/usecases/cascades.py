"""The next steps of cascades under way: a job's end whose edges were not all applied in its
own transaction (app/jobs/tx/dependencies.py says why and what holds in between).

Each step is a short write transaction of its own, which takes up to CASCADES_PER_STEP of
the remembered jobs (on PostgreSQL skipping those another process steps now), applies one
bounded step of each, and remembers what is left. They run right after the transaction that
left them commits, on its thread, for up to FOLLOW_SECONDS (so that a graph of a few thousand
jobs is settled by the time its request answers), and from the maintenance leader's rounds
(app/jobs/usecases/maintenance_loop.py), which take over the rest and any a process left when
it died. A failing step is maintenance's failure (app/jobs/usecases/maintenance.py): the
request that ended
the job has committed and answers as it would; the step is retried with a backoff.
"""

from __future__ import annotations

import threading
import time

from app.core.clock import Clock
from app.jobs.tx.dependencies import STEP_EDGES
from app.jobs.tx.uow import JobsUnitOfWork
from app.jobs.usecases.maintenance import CASCADE, MaintenanceHealth

# Remembered jobs one step goes on with: the step applies STEP_EDGES edges at most among
# them all, so a step of many jobs with few edges left each is as short as one with many.
CASCADES_PER_STEP = STEP_EDGES
# How long the thread whose transaction left a cascade goes on with it before answering.
FOLLOW_SECONDS = 0.5
# And maintenance, per round (a round is 0.5 s): steps hold the write lock briefly each, and
# other writers take their turns between them.
TICK_SECONDS = 0.1


class Cascades:
    def __init__(self, uow: JobsUnitOfWork, clock: Clock, health: MaintenanceHealth) -> None:
        self.uow = uow
        self.clock = clock
        self.health = health
        # A step's own commit leaves cascades too: the thread already following them goes on
        # in its loop rather than starting another.
        self._following = threading.local()

    def step(self) -> int:
        """One step (one transaction); the cascades it took (0: none is left to take)."""
        return self.uow.run(lambda tx: tx.go_on_with_cascades(
            CASCADES_PER_STEP, self.clock.now_us()))

    def go_on(self, max_seconds: float | None = TICK_SECONDS) -> bool:
        """Steps until no cascade is left, or for `max_seconds` (None: no time bound);
        True when none is left. A failure is maintenance's (logged, counted, retried
        after a backoff), never raised."""
        if getattr(self._following, "active", False):
            return False
        self._following.active = True
        done = False

        def steps() -> None:
            nonlocal done
            deadline = None if max_seconds is None else time.monotonic() + max_seconds
            while self.step():
                if deadline is not None and time.monotonic() >= deadline:
                    return
            done = True

        try:
            self.health.guarded(CASCADE, steps)
        finally:
            self._following.active = False
        return done

    def follow(self) -> None:
        """The signal of a commit that left a cascade: its next steps, on this thread."""
        self.go_on(FOLLOW_SECONDS)

    def chore(self) -> None:
        """Maintenance's share; a read first, so that a round with no cascade under way (nearly
        every round) takes no write lock."""
        if self.health.may_run(CASCADE) and self.under_way()[0]:
            self.go_on(TICK_SECONDS)

    def under_way(self) -> tuple[int, float]:
        """The cascades under way, as the database holds them (every process's): how many,
        and how long the oldest has been (seconds; 0 when none is)."""
        backlog = self.uow.read(lambda tx: tx.dependencies.cascade_backlog())
        return backlog.jobs, backlog.age_seconds(self.clock.now_us())
