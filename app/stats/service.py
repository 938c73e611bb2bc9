"""The queue over time (docs/OPERATIONS.md): the buckets GET /stats and the dashboard read, and the
ticker's chore that counts the pending depth each minute and forgets what is past keeping.

The counts themselves are counted by the job transactions (app/jobs/timeline/recorder.py) and
written by each process about once a second (app/jobs/timeline/stats_buffer.py); this module
reads them, and writes the depth, which no job transaction could count cheaply.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection

from sqlalchemy.exc import SQLAlchemyError

from app.core.clock import MICROS, Clock
from app.core.errors import ValidationFailed
from app.core.limits import STATS_BUCKETS
from app.jobs.sql.counts import BacklogCounts
from app.jobs.timeline.stats_buffer import StatsBuffer
from app.jobs.timeline.stats_repository import MINUTE_US, StatsRepository, minute_of
from app.stats.models import Bucket, Series, Step
from app.storage.engine import Database

# How long the counts and the depth are kept.
KEPT_US = 14 * 86_400 * MICROS
# Old minutes removed per pass (one pass a minute per process): well ahead of the one minute
# a minute that grows old.
FORGOTTEN_MINUTES_PER_PASS = 60
DEFAULT_SPAN_US = 3600 * MICROS


class StatsService:
    """`job_types` are the configured types (each gets a depth row a minute, 0 included, so
    that a type's depth falls to 0 on the chart rather than keeping its last value);
    `unwritten` the counts this process has not written yet."""

    def __init__(self, db: Database, clock: Clock, counts: BacklogCounts,
                 job_types: Collection[str], unwritten: StatsBuffer) -> None:
        self.db = db
        self.clock = clock
        self.counts = counts
        self.job_types = frozenset(job_types)
        self.unwritten = unwritten
        # The last minute's chore run, with whether it sampled: a process that takes the lead
        # within a minute it has already written its counts in still samples that minute.
        self._done: tuple[int, bool] = (0, False)
        self._lock = threading.Lock()
        # Whether this process samples the depth and forgets old minutes for the whole
        # database: every process, unless one is chosen (the maintenance leader, where the
        # database tells every host: app/__init__.py, start_database_wakes), so that an idle
        # host's workers do not each count and write the same thing every minute.
        self.samples_database: Callable[[], bool] = lambda: True

    def series(self, job_type: str | None, *, start_us: int | None = None,
               end_us: int | None = None, step: Step = Step.MINUTE) -> Series:
        """The buckets of `step` from the one holding `start_us` to the one holding the
        moment before `end_us` (default: the last hour up to now), oldest first, empty ones
        included. ValidationFailed when `end_us` is not after `start_us` or the span holds
        more than STATS_BUCKETS buckets."""
        end = self.clock.now_us() if end_us is None else end_us
        start = end - DEFAULT_SPAN_US if start_us is None else start_us
        if end <= start:
            raise ValidationFailed("to must be after from.",
                                   errors={"to": ["Must be after from."]})
        width = step.micros
        first = start - start % width
        last = (end - 1) - (end - 1) % width
        count = (last - first) // width + 1
        if count > STATS_BUCKETS.max:
            raise ValidationFailed(
                f"That span holds {count} buckets of a {step.value}; at most "
                f"{STATS_BUCKETS.max} fit one answer.",
                errors={"from": [f"At most {STATS_BUCKETS.max} {step.value}s before to."]})
        now = self.clock.now_us()
        self._write_own_counts()
        with self.db.read() as conn:
            repo = StatsRepository(conn)
            counts = repo.counts_by_minute(job_type, first, last + width)
            depth = repo.depth_by_minute(job_type, first, last + width)
            pending = repo.depth_before(job_type, first)
        buckets = []
        for at in range(first, last + width, width):
            sums = [0, 0, 0, 0]
            for minute in range(at, at + width, MINUTE_US):
                found = counts.get(minute)
                if found is not None:
                    sums = [a + b for a, b in zip(sums, found, strict=True)]
                # The depth at the bucket's end: its last count, or the one before it (the
                # depth did not change while nothing ran to count it).
                pending = depth.get(minute, pending)
            shown = pending if at <= now else None
            buckets.append(Bucket(at, sums[0], sums[1], sums[2], sums[3], shown))
        return Series(job_type, step, buckets)

    def _write_own_counts(self) -> int:
        """Write what this process counted (the rows written). Before a read, written rather
        than added to what the read finds: a flush under way on the flusher's thread is
        waited for, so a count is never missed between the two nor shown twice, and the
        statement is the one the flusher would send within the second anyway. Other
        processes' counts show once their flushers have written them, within a second."""
        try:
            return self.unwritten.flush()
        except SQLAlchemyError:
            return 0  # kept for the next flush; a read shows what is written

    def chore(self) -> Callable[[], int]:
        """A ticker chore: once a minute per process, count the pending depth of every type,
        write the counts kept so far (then no minute it forgets is written after it), and
        forget a batch of what is older than 14 days; where `samples_database` says this
        process does not (another samples the whole database for it), only write its counts.
        Returns the rows written."""

        def stats() -> int:
            done = (minute_of(self.clock.now_us()), self.samples_database())
            with self._lock:
                if done == self._done:
                    return 0
                self._done = done
            if not done[1]:
                return self._write_own_counts()
            return self.sample_depth() + self._write_own_counts() + self.forget_old()

        return stats

    def sample_depth(self) -> int:
        """Write this minute's pending count of each type: the backlog snapshot's while it
        is fresh (app/jobs/sql/counts.py), else a count of its own; a read outside the write
        lock."""
        now = self.clock.now_us()
        pending = dict.fromkeys(self.job_types, 0)
        pending.update({job_type: summary.pending
                        for job_type, summary in self.counts.pending_now().items()})
        with self.db.write() as conn:
            StatsRepository(conn).write_depth(pending, now)
        return len(pending)

    def forget_old(self) -> int:
        before = minute_of(self.clock.now_us()) - KEPT_US
        with self.db.write() as conn:
            return StatsRepository(conn).delete_before(before, FORGOTTEN_MINUTES_PER_PASS)
