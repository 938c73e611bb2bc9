"""The only place the SQL of failure groups lives (docs/OPERATIONS.md): the rows the failing
transactions keep up to date, and what GET /failures, the dashboard's failures page and a
retry by fingerprint read of them and of the attempts they count."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Connection,
    String,
    and_,
    bindparam,
    case,
    delete,
    func,
    literal,
    literal_column,
    or_,
    select,
    union,
)

from app.core.clock import MICROS
from app.core.statuses import JobStatus
from app.jobs.domain.models import BoundedCount
from app.storage.dialects import conflict_insert_for
from app.storage.schema import failure_groups, job_attempts, jobs

HOUR_US = 3600 * MICROS
# The newest jobs of a group are found among this many of its newest attempts per job shown.
NEWEST_ATTEMPTS_PER_JOB = 5


@dataclass(frozen=True, slots=True)
class FailureGroup:
    """One row of failure_groups. Times are microseconds since the epoch."""

    type: str
    fingerprint: str
    sample: str
    count: int
    jobs_failed: int
    first_seen: int
    last_seen: int


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt as its group counts it: `ended_failed` when its job failed for good."""

    type: str
    fingerprint: str
    sample: str
    ended_failed: bool


def counted_into_groups(stmt: Any) -> Any:
    """`stmt`, an INSERT of failure_groups rows (the engine's own: conflict_insert_for), made
    to count each row into its group: a new group is inserted as it is, an existing one adds
    the row's counts and takes its sample and last_seen."""
    table = failure_groups
    return stmt.on_conflict_do_update(
        index_elements=[table.c.type, table.c.fingerprint],
        set_={"count": table.c["count"] + stmt.excluded["count"],
              "jobs_failed": table.c.jobs_failed + stmt.excluded.jobs_failed,
              "sample": stmt.excluded.sample,
              "last_seen": stmt.excluded.last_seen})


@functools.cache
def _upsert(dialect: str) -> Any:
    return counted_into_groups(conflict_insert_for(dialect, failure_groups))


# A job's last attempt: the one whose error is the job's own once it rests failed.
def _is_last_attempt() -> Any:
    later = job_attempts.alias("later")
    return ~select(later.c.id).where(later.c.job_id == job_attempts.c.job_id,
                                     later.c.number > job_attempts.c.number).exists()


def _failing_now() -> Any:
    """How many jobs a group holds failed now, among the jobs of its newest attempts: the
    group's attempts read newest first through their fingerprint index, at most
    `examined_cap` of them, each one's job looked up by its id and its job's later attempts
    through uq_job_attempts_job_id_number. Both look-ups are correlated subqueries, run per
    attempt: as a join, PostgreSQL's planner hashes a scan of every job once the group's
    attempts look many. Its cost is bounded by the cap, never by the jobs stored nor by the
    failed ones. (attempts examined, failing now)."""
    newest = (select(job_attempts.c.job_id, job_attempts.c.number)
              .where(job_attempts.c.fingerprint == bindparam("fingerprint"))
              .order_by(job_attempts.c.ended_at.desc())
              .limit(bindparam("examined_cap")).subquery("newest"))
    status_now = (select(jobs.c.status)
                  .where(jobs.c.id == newest.c.job_id, jobs.c.type == bindparam("type"))
                  .scalar_subquery())
    later = job_attempts.alias("later")
    is_last = ~select(later.c.id).where(later.c.job_id == newest.c.job_id,
                                        later.c.number > newest.c.number).exists()
    failing = and_(status_now == literal_column(f"'{JobStatus.FAILED.value}'"), is_last)
    return select(func.count(), func.coalesce(func.sum(case((failing, 1), else_=0)), 0)
                  ).select_from(newest)


_count_failing_now = _failing_now()


class FailureRepository:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def record(self, failures: Sequence[Failure], now_us: int) -> None:
        """Count failed attempts into their groups, in the failing transaction. One row per
        group, taken in key order: two transactions failing jobs of the same groups on
        PostgreSQL lock them in the same order (no deadlock)."""
        merged: dict[tuple[str, str], dict[str, Any]] = {}
        for failure in failures:
            row = merged.setdefault((failure.type, failure.fingerprint), {
                "type": failure.type, "fingerprint": failure.fingerprint, "count": 0,
                "jobs_failed": 0, "first_seen": now_us, "last_seen": now_us})
            row["count"] += 1
            row["jobs_failed"] += int(failure.ended_failed)
            row["sample"] = failure.sample
        if not merged:
            return
        stmt = _upsert(self.conn.dialect.name)
        for key in sorted(merged):
            self.conn.execute(stmt, merged[key])

    def groups(self, *, job_type: str | None, since_us: int | None,
               limit: int) -> list[FailureGroup]:
        """The groups last seen since `since_us` (of one type), most recent first."""
        stmt = select(failure_groups)
        if job_type is not None:
            stmt = stmt.where(failure_groups.c.type == job_type)
        if since_us is not None:
            stmt = stmt.where(failure_groups.c.last_seen >= since_us)
        stmt = stmt.order_by(failure_groups.c.last_seen.desc(),
                             failure_groups.c.fingerprint).limit(limit)
        return [FailureGroup(*row) for row in self.conn.execute(stmt)]

    def matching(self, text: str, *, job_type: str | None, limit: int) -> list[FailureGroup]:
        """Up to `limit` groups (of one type) whose sample holds `text` (any case), or whose
        fingerprint it is, most recently seen first. A scan of failure_groups, a row per
        type and fingerprint: never of the attempts or the jobs."""
        stmt = select(failure_groups).where(or_(
            failure_groups.c.sample.icontains(text, autoescape=True),
            failure_groups.c.fingerprint == text))
        if job_type is not None:
            stmt = stmt.where(failure_groups.c.type == job_type)
        stmt = stmt.order_by(failure_groups.c.last_seen.desc(),
                             failure_groups.c.type, failure_groups.c.fingerprint).limit(limit)
        return [FailureGroup(*row) for row in self.conn.execute(stmt)]

    def group(self, job_type: str, fingerprint: str) -> FailureGroup | None:
        row = self.conn.execute(select(failure_groups).where(
            failure_groups.c.type == job_type,
            failure_groups.c.fingerprint == fingerprint)).first()
        return None if row is None else FailureGroup(*row)

    def hourly_counts_of(self, groups: Sequence[FailureGroup],
                         since_us: int) -> dict[tuple[str, str], dict[int, int]]:
        """hourly_counts of several groups in one statement, by (type, fingerprint)."""
        if not groups:
            return {}
        hour = job_attempts.c.ended_at // HOUR_US
        stmt = (select(jobs.c.type, job_attempts.c.fingerprint, hour, func.count())
                .select_from(job_attempts.join(jobs, jobs.c.id == job_attempts.c.job_id))
                .where(job_attempts.c.fingerprint.in_(sorted({g.fingerprint for g in groups})),
                       job_attempts.c.ended_at >= since_us)
                .group_by(jobs.c.type, job_attempts.c.fingerprint, hour))
        counts: dict[tuple[str, str], dict[int, int]] = {
            (g.type, g.fingerprint): {} for g in groups}
        for job_type, fingerprint, bucket, count in self.conn.execute(stmt):
            if (job_type, fingerprint) in counts:
                counts[(job_type, fingerprint)][int(bucket) * HOUR_US] = count
        return counts

    def failing_now(self, job_type: str, fingerprint: str, cap: int) -> BoundedCount:
        """The group's jobs that are failed now with its error as their last (what a retry
        of the group takes), among the jobs of its newest `cap` attempts: exact when the
        group keeps no more attempts than that; `capped` (a lower bound) otherwise."""
        examined, failing = self.conn.execute(_count_failing_now, {
            "fingerprint": fingerprint, "type": job_type, "examined_cap": cap + 1}).one()
        capped = int(examined) > cap
        # Read among cap + 1 attempts: still a lower bound when capped, kept at most the cap.
        return BoundedCount(min(int(failing), cap) if capped else int(failing), capped)

    def newest_job_ids(self, job_type: str, fingerprint: str, limit: int) -> list[int]:
        """The jobs of the group's newest failed attempts, newest first, each once: read
        backwards through the attempts' fingerprint index, a few attempts past `limit`
        (a job that failed several times in a row shows once), never the whole group."""
        stmt = (select(job_attempts.c.job_id)
                .select_from(job_attempts.join(jobs, jobs.c.id == job_attempts.c.job_id))
                .where(job_attempts.c.fingerprint == fingerprint, jobs.c.type == job_type)
                .order_by(job_attempts.c.ended_at.desc(), job_attempts.c.job_id.desc())
                .limit(limit * NEWEST_ATTEMPTS_PER_JOB))
        newest: dict[int, None] = {}
        for job_id in self.conn.execute(stmt).scalars():
            newest.setdefault(job_id)
            if len(newest) == limit:
                break
        return list(newest)

    def delete_last_seen_before(self, job_type: str, before_us: int, limit: int) -> int:
        """Forget up to `limit` groups of a type not seen since `before_us` (retention: their
        jobs are gone by then)."""
        doomed = select(failure_groups.c.fingerprint).where(
            failure_groups.c.type == job_type,
            failure_groups.c.last_seen < before_us).limit(limit).scalar_subquery()
        result = self.conn.execute(delete(failure_groups).where(
            failure_groups.c.type == job_type, failure_groups.c.fingerprint.in_(doomed)))
        return int(result.rowcount or 0)


def last_failed_with(fingerprint: str) -> Any:
    """A WHERE clause on jobs: the job's last attempt ended with this fingerprint (its error
    as the job rests). For the retry of a group's jobs: the group's attempts, found through
    their index, lead to the jobs (never a walk over every failed job)."""
    return jobs.c.id.in_(select(job_attempts.c.job_id).where(
        job_attempts.c.fingerprint == fingerprint, _is_last_attempt()))


def jobs_in_groups(groups: Collection[tuple[str, str]],
                   bound: Callable[[Any], Any] | None) -> Any:
    """The jobs with an attempt in these failure groups ((type, fingerprint) pairs): a FROM
    of (job_id, type), each pair once, read through the attempts' fingerprint index
    (ix_job_attempts_fingerprint_ended_at: so in proportion to the groups' attempts, never a
    walk over the jobs or the attempts), `bound` (a keyset bound on an id, or None) applied
    inside. One branch per type, holding that type's fingerprints: joined to the jobs on
    both columns, a job counts only where its own type's group matched (one fingerprint may
    be a group of several types)."""
    by_type: dict[str, set[str]] = {}
    for job_type, fingerprint in groups:
        by_type.setdefault(job_type, set()).add(fingerprint)
    branches = []
    for job_type, prints in sorted(by_type.items()):
        branch = select(job_attempts.c.job_id, literal(job_type, String).label("type")).where(
            job_attempts.c.fingerprint.in_(sorted(prints)))
        if bound is not None:
            branch = branch.where(bound(job_attempts.c.job_id))
        branches.append(branch)
    matched = branches[0].distinct() if len(branches) == 1 else union(*branches)
    return matched.subquery("in_groups")
