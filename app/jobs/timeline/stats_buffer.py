"""This process's stats counts not yet written (docs/OPERATIONS.md, The queue over time).

A job transaction hands over what it counted once it has committed (app/jobs/tx/uow.py,
JobsTx.committed), so a change rolled back never reaches the stats, and no job transaction
sends a statement for them. The process writes what it kept about once a second
(stats_flusher.py), adding it to its own slot's rows in one statement: processes and hosts
still sum, as the rows add up.

A crash loses what was not written yet: at most the last second of one process's counts. A
flush that fails (the database does not answer) puts its counts back for the next one; while
the database stays away, the newest KEPT_MINUTES minutes are kept and older ones dropped, with
a warning saying how many counts went.
"""

from __future__ import annotations

import logging
import random
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping

from sqlalchemy import Connection

from app.jobs.timeline.stats_repository import SLOTS, CountKey, StatsRepository
from app.storage.engine import Database

log = logging.getLogger(__name__)

# Minutes of counts kept while flushes fail: an hour's outage loses nothing; the buffer never
# holds more than this many minutes, whatever the outage's length.
KEPT_MINUTES = 60


class StatsBuffer:
    """Counts by minute, added from any thread, written by `flush`."""

    def __init__(self, db: Database, *, kept_minutes: int = KEPT_MINUTES) -> None:
        self.db = db
        self.kept_minutes = kept_minutes
        # On PostgreSQL this process's slot: two processes seldom add to one row at once.
        self.slot = random.randrange(SLOTS) if db.dialect == "postgresql" else 0
        self._counts: defaultdict[int, Counter[CountKey]] = defaultdict(Counter)
        self._lock = threading.Lock()
        # One flush at a time: a flush asked for while another writes waits for it, so that
        # once it returns every count handed over before it was called is in the database.
        self._flushing = threading.Lock()
        self._watchers: list[Callable[[Mapping[CountKey, int]], None]] = []

    def add(self, minute: int, counts: Mapping[CountKey, int]) -> None:
        """Keep `counts` for the minute starting at `minute` (a committed transaction's), and
        show them to the watchers."""
        with self._lock:
            self._counts[minute].update(counts)
        for watcher in self._watchers:
            watcher(counts)

    def watch(self, watcher: Callable[[Mapping[CountKey, int]], None]) -> None:
        """Show `watcher` each committed transaction's counts, on the committing thread (it
        must be quick and never raise): the protected types' tallies
        (app/types/protection/tallies.py)."""
        self._watchers.append(watcher)

    def flush(self) -> int:
        """Write every count kept so far (one statement; on SQLite it may share a group
        commit with requests' transactions) and return the rows it added to. On an error
        the counts are kept for the next flush and the error is raised."""
        with self._flushing:
            with self._lock:
                taken, self._counts = self._counts, defaultdict(Counter)
            if not taken:
                return 0

            def write(conn: Connection) -> int:
                return StatsRepository(conn).add_counts(taken, self.slot)

            try:
                return self.db.run_write(write)
            except BaseException:
                # Not written (a commit whose answer was lost may yet have been: those
                # counts would be added twice, the rarer and smaller error).
                self._put_back(taken)
                raise

    def _put_back(self, taken: Mapping[int, Counter[CountKey]]) -> None:
        with self._lock:
            for minute, counts in taken.items():
                self._counts[minute].update(counts)
            dropped = sorted(self._counts)[:-self.kept_minutes]
            lost = sum(sum(self._counts.pop(minute).values()) for minute in dropped)
        if lost:
            log.warning("stats: %d counts of %d minutes dropped: the database has not taken "
                        "them for over %d minutes", lost, len(dropped), self.kept_minutes)
