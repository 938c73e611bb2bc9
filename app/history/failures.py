"""Failure groups (docs/OPERATIONS.md): the failed attempts of each type grouped by the fingerprint
of their error, as GET /failures and the dashboard's failures page read them. The groups are
rows the failing transactions keep (app/jobs/timeline/recorder.py); reading them scans
nothing."""

from __future__ import annotations

from dataclasses import dataclass

from app.core.clock import Clock
from app.core.errors import NotFound
from app.jobs.domain.models import BoundedCount
from app.jobs.timeline.failure_repository import HOUR_US, FailureGroup, FailureRepository
from app.storage.engine import Database

# The dashboard's chart of a group: its failed attempts per hour over the last day.
CHART_HOURS = 24
NEWEST_JOBS_SHOWN = 10
# A group's jobs failing now are counted among the jobs of its newest attempts, this many at
# most (FailureRepository.failing_now): exact for a group that keeps no more.
FAILING_NOW_EXAMINED = 10_000


@dataclass(frozen=True, slots=True)
class GroupDetail:
    """A group with its failed attempts per hour (oldest first, CHART_HOURS of them, the
    current hour last), its newest jobs' ids and its jobs failed now (those whose last
    attempt failed with it: what a retry of the group takes)."""

    group: FailureGroup
    hourly: list[tuple[int, int]]
    newest_job_ids: list[int]
    failing_now: BoundedCount


class FailureGroups:
    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock

    def groups(self, *, job_type: str | None = None, since_us: int | None = None,
               limit: int = 50) -> list[FailureGroup]:
        """The groups last seen since `since_us`, most recent first."""
        with self.db.read() as conn:
            return FailureRepository(conn).groups(job_type=job_type, since_us=since_us,
                                                  limit=limit)

    def matching(self, text: str, *, job_type: str | None = None,
                 limit: int = 50) -> tuple[list[FailureGroup], bool]:
        """The groups (of one type) whose newest error holds `text` (any case), or whose
        fingerprint it is: up to `limit`, most recently seen first, and whether more match.
        The jobs list's error filter: the jobs are then found through these groups."""
        with self.db.read() as conn:
            found = FailureRepository(conn).matching(text, job_type=job_type, limit=limit + 1)
        return found[:limit], len(found) > limit

    def overview(self, *, job_type: str | None = None, limit: int = 50) -> list[GroupDetail]:
        """The groups most recently seen first, each with its day and newest jobs, read in
        one transaction (the dashboard's failures page)."""
        first_hour, hours = self._hours()
        # A counting read: each group's failing_now reads up to FAILING_NOW_EXAMINED attempts.
        with self.db.counting_read() as conn:
            repo = FailureRepository(conn)
            groups = repo.groups(job_type=job_type, since_us=None, limit=limit)
            counts = repo.hourly_counts_of(groups, first_hour)
            return [GroupDetail(
                group, [(hour, counts[(group.type, group.fingerprint)].get(hour, 0))
                        for hour in hours],
                repo.newest_job_ids(group.type, group.fingerprint, NEWEST_JOBS_SHOWN),
                repo.failing_now(group.type, group.fingerprint, FAILING_NOW_EXAMINED))
                for group in groups]

    def _hours(self) -> tuple[int, list[int]]:
        """The start of the first hour a chart shows, and of each of its hours."""
        now_hour = self.clock.now_us() // HOUR_US * HOUR_US
        first_hour = now_hour - (CHART_HOURS - 1) * HOUR_US
        return first_hour, list(range(first_hour, now_hour + 1, HOUR_US))

    def detail(self, job_type: str, fingerprint: str) -> GroupDetail:
        """One group, its last day hour by hour and its newest jobs; NotFound when no such
        group is kept."""
        first_hour, hours = self._hours()
        # A counting read: each group's failing_now reads up to FAILING_NOW_EXAMINED attempts.
        with self.db.counting_read() as conn:
            repo = FailureRepository(conn)
            group = repo.group(job_type, fingerprint)
            if group is None:
                raise NotFound("No such failure group.")
            counts = repo.hourly_counts_of([group], first_hour)[(job_type, fingerprint)]
            newest = repo.newest_job_ids(job_type, fingerprint, NEWEST_JOBS_SHOWN)
            failing = repo.failing_now(job_type, fingerprint, FAILING_NOW_EXAMINED)
        return GroupDetail(group, [(hour, counts.get(hour, 0)) for hour in hours], newest,
                           failing)

