"""The jobs' reads: one job, a page of them, the look-ups by key an enqueue makes, and the
counts GET /types, /metrics, explain and the maintenance loop read (each through the index
it names). ClaimRepository below it, JobRepository above it, on the same connection."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from typing import Any

from sqlalchemy import and_, bindparam, case, func, or_, select, tuple_, union_all

from app.core.statuses import JobStatus
from app.jobs.domain.aging import level_index
from app.jobs.domain.models import BoundedCount, Job, PendingSummary
from app.jobs.domain.transitions import Transition
from app.jobs.sql.aging_claims import AHEAD_OF_TYPE_AGED, ahead_aged_params
from app.jobs.sql.claim_repository import ClaimRepository
from app.jobs.sql.job_rows import (
    CLAIMABLE_ROW,
    JOB_COLUMNS,
    UNIQUE_HOLDER,
    job_of,
    status_is_job,
)
from app.jobs.sql.statuses import (
    FINISHED,
    PENDING,
    RESERVED,
    RUNNING,
    SUSPENDED,
    WAITING,
    status_literal,
)
from app.jobs.timeline.failure_repository import jobs_in_groups, last_failed_with
from app.keys.repository import LIVE_KEY, live_key_condition
from app.storage.chunks import chunked
from app.storage.schema import job_tags, jobs
from app.storage.statements import DriverStatement

# Listed with their status as a literal, which matches their partial indexes of ids
# (ix_jobs_failed_id, ix_jobs_cancelled_id): few among many stored, found at once. The other
# statuses stay bound: completed and pending jobs are common, found soonest walking the ids,
# and a literal 'pending' would lead the planners to a partial index in claim order and a
# sort of every pending row. Running jobs are listed through _running_ids.
_LISTED_THROUGH_PARTIAL_INDEX = frozenset({JobStatus.FAILED.value, JobStatus.CANCELLED.value})

_select_by_id = select(*JOB_COLUMNS).where(jobs.c.id == bindparam("job_id"))
_select_by_id_for_update = _select_by_id.with_for_update()
# The same for a caller whose key it confirms live (KeyToConfirm).
_select_by_id_for_update_if_live = _select_by_id_for_update.where(live_key_condition())
_select_by_idempotency_key = select(*JOB_COLUMNS).where(
    jobs.c.producer == bindparam("producer"),
    jobs.c.idempotency_key == bindparam("idempotency_key"),
)
_select_unique_holder = select(*JOB_COLUMNS).where(
    jobs.c.producer == bindparam("producer"),
    jobs.c.unique_scope == bindparam("unique_scope"),
    UNIQUE_HOLDER,
)
_RESCUABLE_ROW = status_is_job(*Transition.RESCUE.from_statuses)
# SKIP LOCKED: a lease another claim is rescuing right now is simply left to that claim.
_select_expired_leases = DriverStatement(
    select(*JOB_COLUMNS)
    .where(_RESCUABLE_ROW, jobs.c.lease_expires_at <= bindparam("now"))
    .order_by(jobs.c.lease_expires_at)
    .limit(bindparam("limit"))
    .with_for_update(skip_locked=True)
)


def _count_ahead(restricted_to_one_type: bool) -> Any:
    # Before the job in claim order (priority DESC, created_at, id) is three ranges of the
    # claim-order index (of the type, when restricted): a higher priority; the same priority
    # and older; the same priority and age and a lower id. Read range by range, each from the
    # index's start to the job's place (one OR of them scans the index whole), and no further
    # than `cap_plus_one` pending rows in all: UNION ALL under a LIMIT stops reading its
    # branches once it has that many, on both engines. So the cost is bounded by the cap, not
    # by the backlog: `examined` above the cap says the count stopped there.
    priority: Any = bindparam("priority")
    created_at: Any = bindparam("created_at")
    ranges = (
        (jobs.c.priority > priority,),
        (jobs.c.priority == priority, jobs.c.created_at < created_at),
        (jobs.c.priority == priority, jobs.c.created_at == created_at,
         jobs.c.id < bindparam("job_id")),
    )
    branches = []
    for conditions in ranges:
        stmt = select(jobs.c.run_at).where(CLAIMABLE_ROW, *conditions)
        if restricted_to_one_type:
            stmt = stmt.where(jobs.c.type == bindparam("type"))
        # A LIMIT of its own per branch (SQLite accepts one only on a subquery): no branch
        # reads past the cap even where a planner does not stop the compound early.
        branches.append(select(stmt.limit(bindparam("cap_plus_one")).subquery().c.run_at))
    examined = union_all(*branches).limit(bindparam("cap_plus_one")).subquery()
    return select(func.count(),
                  func.coalesce(func.sum(case((examined.c.run_at <= bindparam("now"), 1),
                                              else_=0)), 0))


_ahead_any_type = _count_ahead(restricted_to_one_type=False)
_ahead_of_type = _count_ahead(restricted_to_one_type=True)

# Counted through the partial index of running rows by (type, concurrency_key). Every type
# at once: the running rows are as many as the workers hold, and a statement without an
# expanding IN is compiled once and served from the cache on every claim.
_count_running = (
    select(jobs.c.type, jobs.c.concurrency_key, func.count())
    .where(jobs.c.status == RUNNING)
    .group_by(jobs.c.type, jobs.c.concurrency_key)
)
# The same rows by worker and instance label (GET /workers, the dashboard, explain). As a
# plain GROUP BY worker_id, SQLite's planner walks the whole (worker_id, id) index to avoid a
# sort: half a second at a million stored jobs. Materialized first, the running rows come
# from a partial index and only they are grouped.
_running_workers = (select(jobs.c.worker_id, jobs.c.worker_instance)
                    .where(jobs.c.status == RUNNING)
                    .cte("running_workers").prefix_with("MATERIALIZED"))
_count_running_by_worker = (select(_running_workers.c.worker_id,
                                   _running_workers.c.worker_instance, func.count())
                            .group_by(_running_workers.c.worker_id,
                                      _running_workers.c.worker_instance))
# The running jobs' ids, for a listing of them: as many as the workers hold, read from their
# partial index and then looked up by id, rather than found by walking every id (they are
# the newest) or every job of a producer.
_running_ids = (select(jobs.c.id).where(jobs.c.status == RUNNING)
                .cte("running_ids").prefix_with("MATERIALIZED"))


def _keyset(after_id: int, descending: bool) -> Callable[[Any], Any] | None:
    """A listing's keyset bound on an id column: past the cursor's id, or none (descending
    from the newest, after_id 0)."""
    if descending:
        return (lambda ids: ids < after_id) if after_id else None
    return lambda ids: ids > after_id


@functools.cache
def _count_running_along(cte: Any) -> Any:
    return _count_running.add_cte(cte)


# The earliest lease of one type's running jobs: its running rows, through the same index.
_next_lease_expiry = (
    select(func.min(jobs.c.lease_expires_at))
    .where(jobs.c.status == RUNNING, jobs.c.type == bindparam("type"))
)
# Every type's pending jobs, its scheduled ones and its oldest due run_at, from the per-type
# claim-order index (run_at is its last column), grouped in the index's own type-first order:
# what the backlog counts (app/jobs/sql/counts.py) read, unconfigured types included.
_pending_by_type = (
    select(jobs.c.type, func.count(),
           func.coalesce(func.sum(case((jobs.c.run_at > bindparam("now"), 1), else_=0)), 0),
           func.min(case((jobs.c.run_at <= bindparam("now"), jobs.c.run_at))))
    .where(jobs.c.status == PENDING)
    .group_by(jobs.c.type)
)
# Every type's waiting jobs, from their partial index alone.
_count_waiting = (
    select(jobs.c.type, func.count())
    .where(jobs.c.status == WAITING)
    .group_by(jobs.c.type)
)
# Every type's suspended jobs, from their partial index alone.
_count_suspended = (
    select(jobs.c.type, func.count())
    .where(jobs.c.status == SUSPENDED)
    .group_by(jobs.c.type)
)
# Every type's reserved jobs, from their partial index alone.
_count_reserved = (
    select(jobs.c.type, func.count())
    .where(jobs.c.status == RESERVED)
    .group_by(jobs.c.type)
)
_count_finished = (
    select(jobs.c.type, jobs.c.status, func.count())
    .where(jobs.c.status.in_(FINISHED))
    .group_by(jobs.c.type, jobs.c.status)
)


# Unclaimed jobs past their expiry, through their partial index (its predicate's own text).
_select_expired_unclaimed = (
    select(jobs.c.id)
    .where(jobs.c.status.in_([PENDING, WAITING]),
           jobs.c.expires_at.is_not(None), jobs.c.expires_at <= bindparam("now"))
    .order_by(jobs.c.expires_at)
    .limit(bindparam("limit"))
    .with_for_update(skip_locked=True)
)


# The predicate of the finished jobs' partial index, as written there: a query that repeats it
# is matched to the index by both planners.
_FINISHED_ROW = jobs.c.status.in_(FINISHED)


@functools.cache
def _count_for_bulk(statuses: tuple[JobStatus, ...], of_one_type: bool) -> Any:
    """The jobs in `statuses` (of the type `type`, when `of_one_type`), counted up to
    `cap_plus_one`: a branch per status, each from that status's partial index (failed or
    cancelled jobs of one type through the finished jobs' (type, status) index, of any type
    through their status's index of ids; pending, waiting and suspended ones through theirs)
    and under a LIMIT of its own, as _count_ahead's branches are, so that the count stops at
    the cap however many jobs are stored (tests/test_db.py reads the plans)."""
    branches = []
    for status in statuses:
        conditions = [status_is_job(status)]
        if of_one_type and status in (JobStatus.FAILED, JobStatus.CANCELLED):
            # The status as a range of one value, not `= 'failed'`: an equality also matches
            # the status's index of ids, which PostgreSQL prefers while its statistics take a
            # type's share of the failed jobs for its share of all jobs, and then walks every
            # other type's failed jobs. A range proves only the finished jobs' predicate.
            literal = status_literal(status)
            conditions = [_FINISHED_ROW, jobs.c.status >= literal, jobs.c.status <= literal]
        if of_one_type:
            conditions.append(jobs.c.type == bindparam("type"))
        branch = select(jobs.c.id).where(*conditions).limit(bindparam("cap_plus_one"))
        branches.append(select(branch.subquery().c.id))
    counted = (union_all(*branches) if len(branches) > 1 else branches[0]).limit(
        bindparam("cap_plus_one")).subquery()
    return select(func.count()).select_from(counted)


class JobReads(ClaimRepository):
    """The jobs' reads on one connection."""


    def get_job(self, job_id: int, *, for_update: bool = False) -> Job | None:
        key = self.take_key_to_confirm() if for_update else None
        if key is None:
            stmt = _select_by_id_for_update if for_update else _select_by_id
            row = self.conn.execute(stmt, {"job_id": job_id}).first()
        else:
            row = self.conn.execute(_select_by_id_for_update_if_live,
                                    {"job_id": job_id, LIVE_KEY: key.digest}).first()
            key.answered(row is not None)
        return None if row is None else job_of(row)

    def jobs_by_ids(self, job_ids: Collection[int]) -> list[Job]:
        """These jobs (those that exist), by id."""
        found: list[Job] = []
        for chunk in chunked(sorted(job_ids)):
            stmt = select(*JOB_COLUMNS).where(jobs.c.id.in_(chunk)).order_by(jobs.c.id)
            found += [job_of(row) for row in self.conn.execute(stmt)]
        return found

    def find_by_idempotency_key(self, producer: str, idempotency_key: str) -> Job | None:
        row = self.conn.execute(
            _select_by_idempotency_key,
            {"producer": producer, "idempotency_key": idempotency_key},
        ).first()
        return None if row is None else job_of(row)

    def find_unique_holder(self, producer: str, unique_scope: str) -> Job | None:
        """The producer's job that holds this unique scope now (in one of its while
        statuses); None when no job does."""
        row = self.conn.execute(_select_unique_holder,
                                {"producer": producer, "unique_scope": unique_scope}).first()
        return None if row is None else job_of(row)

    def find_unique_holders(self, producer: str, scopes: Collection[str]) -> dict[str, Job]:
        """The producer's jobs holding these unique scopes now, by scope."""
        if not scopes:
            return {}
        stmt = select(*JOB_COLUMNS).where(jobs.c.producer == producer,
                                  jobs.c.unique_scope.in_(list(scopes)), UNIQUE_HOLDER)
        return {job.unique_scope or "": job for job in map(job_of, self.conn.execute(stmt))}

    def list_jobs(self, *, after_id: int, limit: int, producer: str | None = None,
                  worker: str | None = None, status: str | None = None,
                  job_type: str | None = None, run_after: int | None = None,
                  descending: bool = False, tag: str | None = None,
                  failure_groups: Collection[tuple[str, str]] | None = None) -> list[Job]:
        """Jobs with id > after_id in id order (`descending`: id < after_id, newest first;
        after_id 0 then means from the newest), narrowed by the filters that are not None;
        `run_after` keeps the jobs whose run_at is later, `tag` those tagged so,
        `failure_groups` ((type, fingerprint) pairs) those with an attempt in one of them."""
        stmt = select(*JOB_COLUMNS)
        # With a tag, the jobs come from the tag's entries of ix_job_tags_tag_job_id, walked
        # in id order from the cursor (the keyset bound and the order are the index's
        # columns), each job then looked up by id: never a scan of the jobs. With failure
        # groups, from the groups' attempts (their fingerprint index), each job then looked
        # up by id.
        ids: Any = jobs.c.id
        if failure_groups is not None:
            if not failure_groups:
                return []
            matched = jobs_in_groups(failure_groups, _keyset(after_id, descending))
            ids = matched.c.job_id
            stmt = stmt.select_from(matched.join(jobs, and_(jobs.c.id == ids,
                                                            jobs.c.type == matched.c.type)))
            if tag is not None:
                stmt = stmt.where(jobs.c.id.in_(select(job_tags.c.job_id)
                                                .where(job_tags.c.tag == tag)))
        elif tag is not None:
            ids = job_tags.c.job_id
            stmt = stmt.select_from(job_tags.join(jobs, jobs.c.id == job_tags.c.job_id)).where(
                job_tags.c.tag == tag)
        bound = _keyset(after_id, descending)
        if bound is not None:
            stmt = stmt.where(bound(ids))
        if run_after is not None:
            stmt = stmt.where(jobs.c.run_at > run_after)
        if producer is not None:
            stmt = stmt.where(jobs.c.producer == producer)
        if worker is not None:
            stmt = stmt.where(jobs.c.worker_id == worker)
        if status in _LISTED_THROUGH_PARTIAL_INDEX:
            stmt = stmt.where(status_is_job(JobStatus(status)))
        elif status == JobStatus.RUNNING.value:
            stmt = stmt.where(jobs.c.id.in_(select(_running_ids.c.id)))
        elif status is not None:
            stmt = stmt.where(jobs.c.status == status)
        if job_type is not None:
            stmt = stmt.where(jobs.c.type == job_type)
        stmt = stmt.order_by(ids.desc() if descending else ids).limit(limit)
        return [job_of(row) for row in self.conn.execute(stmt)]

    def find_by_idempotency_keys(self, producer: str, keys: Collection[str]) -> dict[str, Job]:
        """The producer's jobs with these idempotency keys, by key."""
        if not keys:
            return {}
        stmt = select(*JOB_COLUMNS).where(jobs.c.producer == producer,
                                  jobs.c.idempotency_key.in_(list(keys)))
        # Every row found has a key: it was found by its key.
        return {job.idempotency_key or "": job for job in map(job_of, self.conn.execute(stmt))}

    def count_running(self, along_with: tuple[Any, dict[str, Any]] | None = None,
                      ) -> dict[tuple[str, str | None], int]:
        """Running jobs by (type, concurrency_key). `along_with`: a data-modifying CTE
        (PostgreSQL) and its parameters, run in the same statement to save a round trip."""
        stmt, params = _count_running, {}
        if along_with is not None:
            stmt, params = _count_running_along(along_with[0]), along_with[1]
        return {(job_type, key): count
                for job_type, key, count in self.conn.execute(stmt, params)}

    def next_lease_expiry(self, job_type: str) -> int | None:
        """The earliest lease_expires_at of the type's running jobs; None when none runs."""
        value: int | None = self.conn.execute(
            _next_lease_expiry, {"type": job_type}).scalar()
        return value

    def pending_by_type(self, now_us: int) -> dict[str, PendingSummary]:
        """Every type's pending jobs, as pending_summary counts them, from the per-type
        claim-order index alone: one read of every pending row's entry."""
        return {job_type: PendingSummary(int(pending), int(scheduled), oldest)
                for job_type, pending, scheduled, oldest
                in self.conn.execute(_pending_by_type, {"now": now_us})}

    def count_waiting(self) -> dict[str, int]:
        """Waiting jobs by type, from their partial index."""
        return {job_type: count for job_type, count in self.conn.execute(_count_waiting)}

    def count_suspended(self) -> dict[str, int]:
        """Suspended jobs by type, from their partial index."""
        return {job_type: count for job_type, count in self.conn.execute(_count_suspended)}

    def count_reserved(self) -> dict[str, int]:
        """Reserved jobs by type, from their partial index."""
        return {job_type: count for job_type, count in self.conn.execute(_count_reserved)}

    def count_finished(self) -> dict[tuple[str, str], int]:
        """Completed, failed and cancelled jobs by (type, status), from their partial index."""
        return {(job_type, status): count
                for job_type, status, count in self.conn.execute(_count_finished)}

    def find_expired_leases(self, now_us: int, limit: int) -> list[Job]:
        """Running jobs whose lease ran out, oldest expiry first (locked on PostgreSQL)."""
        rows = _select_expired_leases.rows(self.conn, {"now": now_us, "limit": limit})
        return [job_of(row) for row in rows]

    def count_claimable_ahead(self, job: Job, now_us: int, *, same_type: bool,
                              cap: int, aging_us: int | None = None) -> BoundedCount:
        """How many jobs a claim would take before `job`: due pending jobs earlier in claim
        order (of its type alone when `same_type`), read through the claim-order index (of
        the type, when `same_type`), at most `cap` + 1 of its pending rows: exact when not
        `capped`; when capped, the due jobs among the first `cap` pending ones ahead (a lower
        bound, at most `cap`). With `aging_us` (`same_type` only: the type ages), in the aged
        order (app/jobs/domain/aging.py)."""
        stmt = _ahead_of_type if same_type else _ahead_any_type
        params = {"now": now_us, "priority": job.priority, "created_at": job.created_at,
                  "job_id": job.id, "type": job.type, "cap_plus_one": cap + 1}
        if same_type and aging_us is not None and level_index(job.priority) is not None:
            stmt = AHEAD_OF_TYPE_AGED
            params |= ahead_aged_params(job.priority, job.created_at, aging_us)
        examined, due = self.conn.execute(stmt, params).one()
        capped = int(examined) > cap
        return BoundedCount(min(int(due), cap) if capped else int(due), capped)

    def count_for_bulk(self, statuses: Collection[JobStatus], job_type: str | None,
                       cap: int) -> BoundedCount:
        """The jobs in `statuses` (of `job_type`, when given) as a bulk action would find
        them, counted up to `cap`: exact when not `capped`, `cap` otherwise."""
        if not statuses:
            return BoundedCount(0, capped=False)
        stmt = _count_for_bulk(tuple(sorted(statuses)), job_type is not None)
        counted = int(self.conn.execute(stmt, {"type": job_type, "cap_plus_one": cap + 1})
                      .scalar_one())
        return BoundedCount(min(counted, cap), capped=counted > cap)

    def count_running_by_worker(self) -> dict[tuple[str, str | None], int]:
        """How many jobs each worker holds now (running, its lease live or not yet rescued),
        by its name and the instance label its claims sent (None: none). Read through a
        partial index of the running rows (see _count_running_by_worker)."""
        return {(worker, instance): count for worker, instance, count
                in self.conn.execute(_count_running_by_worker)}

    # -- for maintenance and bulk actions ----------------------------------------------

    def find_expired_unclaimed(self, now_us: int, limit: int) -> list[int]:
        """Ids of pending or waiting jobs past their expires_at, soonest expired first
        (locked on PostgreSQL; those another transaction holds are left to it)."""
        return list(self.conn.execute(_select_expired_unclaimed,
                                      {"now": now_us, "limit": limit}).scalars())

    def highest_job_id(self) -> int:
        """The highest id given so far (0 with no job): where a bulk action's jobs end."""
        return int(self.conn.execute(select(func.max(jobs.c.id))).scalar() or 0)

    def find_ids_for_bulk(self, *, statuses: Collection[JobStatus], limit: int,
                          job_type: str | None = None, created_before: int | None = None,
                          created_after: int | None = None,
                          ids: Collection[int] | None = None, after_id: int = 0,
                          up_to_id: int | None = None,
                          fingerprint: str | None = None,
                          tag: str | None = None) -> list[int]:
        """Ids of up to `limit` jobs in `statuses` that every filter given matches, lowest
        first, above `after_id` and up to `up_to_id` (locked on PostgreSQL until the
        transaction ends)."""
        stmt = select(jobs.c.id).where(status_is_job(*statuses), jobs.c.id > after_id)
        if up_to_id is not None:
            stmt = stmt.where(jobs.c.id <= up_to_id)
        if job_type is not None:
            stmt = stmt.where(jobs.c.type == job_type)
        if created_before is not None:
            stmt = stmt.where(jobs.c.created_at < created_before)
        if created_after is not None:
            stmt = stmt.where(jobs.c.created_at > created_after)
        if ids is not None:
            stmt = stmt.where(jobs.c.id.in_(list(ids)))
        if fingerprint is not None:
            stmt = stmt.where(last_failed_with(fingerprint))
        if tag is not None:
            stmt = stmt.where(jobs.c.id.in_(select(job_tags.c.job_id)
                                            .where(job_tags.c.tag == tag)))
        stmt = stmt.order_by(jobs.c.id).limit(limit).with_for_update()
        return list(self.conn.execute(stmt).scalars())

    def expired_finished(self, *, job_type: str, status: JobStatus, updated_before_us: int,
                         keyed_created_before_us: int, after: tuple[int, int] | None,
                         limit: int) -> list[tuple[int, int]]:
        """Up to `limit` (updated_at, id) of the type's jobs in `status` last changed before
        the cutoff, oldest first, after the position `after`: read through the finished
        jobs' index (ix_jobs_finished_type_status_updated: its predicate is written out, so
        that both planners match it). A job with an idempotency key created since
        `keyed_created_before_us` is left (the idempotency floor). Locked on PostgreSQL,
        skipping rows another process's retention holds: two processes take disjoint
        batches."""
        stmt = select(jobs.c.updated_at, jobs.c.id).where(
            _FINISHED_ROW, status_is_job(status), jobs.c.type == job_type,
            jobs.c.updated_at < updated_before_us,
            or_(jobs.c.idempotency_key.is_(None),
                jobs.c.created_at < keyed_created_before_us))
        if after is not None:
            # The plain bound starts the index range at the position (the row comparison
            # alone is only a filter to PostgreSQL's planner: each batch would walk again
            # the entries of the rows deleted before it).
            stmt = stmt.where(jobs.c.updated_at >= after[0],
                              tuple_(jobs.c.updated_at, jobs.c.id) > tuple_(*after))
        stmt = (stmt.order_by(jobs.c.updated_at, jobs.c.id).limit(limit)
                .with_for_update(skip_locked=True))
        return [(updated_at, job_id) for updated_at, job_id in self.conn.execute(stmt)]
