"""Where a process's claims start reading while PostgreSQL's xmin horizon is held
(docs/SCALING.md, "A held snapshot").

While a transaction holds a snapshot, the row versions that claims leave behind can be neither
removed nor marked dead in the claim's index: a claim that reads the pending jobs from the
front steps over every job claimed since the snapshot began, visiting each one's row, and the
claim rate falls the longer the snapshot is held. So, while the maintenance leader says a
holder has held the horizon for a while (`horizon_held`, told to every listening process), a
claim of any type reads each priority level from a position instead of from its front:

- a level's position is the place in claim order (created_at, id) of the last job this
  process claimed at that level, never later than MARGIN_SECONDS ago: an enqueue stamps its
  job's creation before it commits, and another host's clock may run a little ahead of this
  one's;
- behind the positions, the claim still reads from the front when they find nothing (the same
  statement: app/jobs/sql/claim_repository.py), and a claim reads from the front at least every
  FRONT_SECONDS in any case;
- a read from the front steps over everything the holder keeps, so it costs more the longer
  the hold lasts: the next one waits FRONT_COST_TIMES as long as the last one took, when that
  is longer than FRONT_SECONDS, so that reads from the front never take more than a small,
  fixed share of the claims' time, however long the hold.

A job that becomes claimable behind its level's position (a retry or a delayed job that comes
due, a dependent released, a lease rescued) is therefore claimed at most FRONT_SECONDS later
than it would have been (FRONT_COST_TIMES the last front read's time, once that is longer), and
never missed. Outside a held horizon, nothing changes: every claim reads from the front, in
exact claim order.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

from app.core.clock import MICROS, Clock
from app.core.priorities import Priority
from app.jobs.domain.models import Job

# A holder is told once it has held the horizon this long (app/jobs/usecases/horizon_watch.py):
# a shorter snapshot (a report of a few seconds) leaves too little behind to matter.
HELD_SECONDS = 30.0
# One notice keeps the positions in use this long: the leader tells again at each look while
# the holder holds (every 30 s), and after it lets go the positions lapse on their own.
HELD_FOR_SECONDS = 90.0
# How often a claim reads from the front even though positions are in use.
FRONT_SECONDS = 1.0
# ... or, once a read from the front takes longer than FRONT_SECONDS / FRONT_COST_TIMES, how
# many times its time passes before the next: front reads then cost one claim thread at most
# 1 / FRONT_COST_TIMES of its time, where at a fixed second they would cost ever more of it.
FRONT_COST_TIMES = 50.0
# How far behind now a position always stays (see the module's docstring).
MARGIN_SECONDS = 5.0

LEVELS = tuple(sorted((int(level) for level in Priority), reverse=True))

# A place in a level's claim order: (created_at, id).
Position = tuple[int, int]
_FRONT: Position = (0, 0)


class ClaimPositions:
    """One process's positions, shared by its request threads."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._held_until_us = 0
        self._next_front_us = 0
        self._after: dict[int, Position] = {}  # by level: the last claimed job's place

    def horizon_held(self) -> None:
        """The leader's notice: a holder has held the horizon past HELD_SECONDS."""
        now = self.clock.now_us()
        with self._lock:
            if self._held_until_us <= now:
                self._after.clear()  # what a past hold left says nothing of the jobs now
            self._held_until_us = now + round(HELD_FOR_SECONDS * MICROS)

    @property
    def in_use(self) -> bool:
        return self.clock.now_us() < self._held_until_us

    def where_to_start(self) -> Mapping[int, Position] | None:
        """Each level's position ((created_at, id) its claim reads from; (0, 0): the front)
        for the next claim of any type, or None: read from the front (no held horizon, or a
        front read is due)."""
        now = self.clock.now_us()
        if now >= self._held_until_us:
            return None  # the common case: no held horizon, no lock taken
        with self._lock:
            if now >= self._next_front_us:
                self._next_front_us = now + round(FRONT_SECONDS * MICROS)
                return None
            latest = (now - round(MARGIN_SECONDS * MICROS), 0)
            return {level: min(self._after.get(level, _FRONT), latest) for level in LEVELS}

    def claimed(self, jobs: Iterable[Job], *, from_the_front_us: int | None = None) -> None:
        """A claim of any type took `jobs`: each level's position moves up to the last one.
        `from_the_front_us`: how long the claim took, when it read from the front (its
        where_to_start was None), which sets when the next read from the front comes."""
        if not self.in_use:
            return
        with self._lock:
            if from_the_front_us is not None:
                later = self.clock.now_us() - from_the_front_us + round(
                    FRONT_COST_TIMES * from_the_front_us)
                self._next_front_us = max(self._next_front_us, later)
            for job in jobs:
                place = (job.created_at, job.id)
                if place > self._after.get(job.priority, _FRONT):
                    self._after[job.priority] = place
