"""The claim's SQL: which pending jobs a claim may take (its candidates, of any type or of one,
under a cap per key, in a fair type's round order), the claim's UPDATE, and the probes a
waiting claim polls. JobRepository (repository.py) is the rest of the jobs' SQL, on the same
connection."""

from __future__ import annotations

import functools
import heapq
import itertools
from collections.abc import Collection, Mapping, Sequence
from typing import Any, NamedTuple

from sqlalchemy import (
    Connection,
    String,
    bindparam,
    cast,
    literal_column,
    or_,
    select,
    tuple_,
    union_all,
    update,
)

from app.core.statuses import JobStatus
from app.core.tracecontext import Trace
from app.jobs.domain import aging
from app.jobs.domain.claim_positions import LEVELS, Position
from app.jobs.domain.flow import ClaimLimits
from app.jobs.domain.models import Job
from app.jobs.domain.transitions import Transition
from app.jobs.sql.aging_claims import CANDIDATE_COLUMNS, aged_any_type_candidates, aging_params
from app.jobs.sql.context_repository import TRACE, trace_of
from app.jobs.sql.control_repository import CHECKPOINT
from app.jobs.sql.job_rows import (
    CLAIM_ORDER,
    CLAIMABLE_BY_ID,
    CLAIMABLE_ROW,
    JOB_COLUMN_COUNT,
    JOB_COLUMNS,
    NOT_EXPIRED,
    TYPE_FREE,
    capped_lease,
    claim_limit,
    job_of,
    status_is_job_by_id,
)
from app.jobs.sql.statuses import PENDING
from app.keys.repository import LIVE_KEY, KeyToConfirm, live_key_condition
from app.storage.schema import fair_order_columns, jobs
from app.storage.statements import DriverStatement


def _pending_due(restricted_to_one_type: bool) -> Any:
    """Pending jobs that are due, in claim order (of one type: read through its own index)."""
    stmt = select(jobs.c.id, jobs.c.priority, jobs.c.created_at).where(
        CLAIMABLE_ROW, jobs.c.run_at <= bindparam("now"), NOT_EXPIRED)
    if restricted_to_one_type:
        stmt = stmt.where(jobs.c.type == bindparam("type"))
    return stmt.order_by(*CLAIM_ORDER)


_due_probe_any_type = _pending_due(restricted_to_one_type=False).limit(1)
_due_probe_one_type = _pending_due(restricted_to_one_type=True).limit(1)
_due_probe_any_free_type = _due_probe_any_type.where(TYPE_FREE)
_due_probe_one_free_type = _due_probe_one_type.where(TYPE_FREE)

# Candidates of one type for a claim; PostgreSQL locks them, skipping rows other claims hold.
# Each statement below whose LIMIT is claim_limit(one) comes in two: for a claim of one job
# and for a claim of :limit (app/jobs/sql/job_rows.py says why).
def _candidates_one_type(one: bool) -> Any:
    return (_pending_due(restricted_to_one_type=True)
            .limit(claim_limit(one))
            .with_for_update(skip_locked=True))


# Candidates of one type under a per-key cap: keys already at their cap are left out here, so
# a claim of one job always finds the first allowed one; a claim of several may still meet a
# key twice and pass over its second job (ClaimLimits.pick).
_not_a_full_key = or_(jobs.c.concurrency_key.is_(None),
                      jobs.c.concurrency_key.not_in(bindparam("full_keys", expanding=True)))
_candidates_one_type_by_key = (
    select(jobs.c.id, jobs.c.priority, jobs.c.created_at, jobs.c.concurrency_key)
    .where(jobs.c.status == PENDING, jobs.c.run_at <= bindparam("now"),
           jobs.c.type == bindparam("type"), _not_a_full_key, NOT_EXPIRED)
    .order_by(*CLAIM_ORDER)
    .limit(bindparam("limit"))
    .with_for_update(skip_locked=True)
)
# A fair type's candidates (docs/FLOW-CONTROL.md), in round order: priority, then round, then (keys
# per producer) the round among its producer's keys, then claim order, read through its own
# partial index (app/jobs/tx/key_rules.py gives the rounds).
_FAIR_ORDER = fair_order_columns(jobs)


def _fair_candidates(one: bool) -> Any:
    return (select(jobs.c.id, jobs.c.priority, jobs.c.created_at, jobs.c.concurrency_key)
            .where(jobs.c.status == PENDING, jobs.c.fair_round >= literal_column("0"),
                   jobs.c.run_at <= bindparam("now"), jobs.c.type == bindparam("type"),
                   NOT_EXPIRED)
            .order_by(*_FAIR_ORDER)
            .limit(claim_limit(one))
            .with_for_update(skip_locked=True))


_fair_candidates_by_key = _fair_candidates(one=False).where(_not_a_full_key)


# An aging type's candidates (app/jobs/domain/aging.py): each priority level a range of its
# claim-order index, whose (created_at, id) order is the aged order within a level; the claim
# ranks them all (aging.claim_key).
@functools.cache
def _driver_aging_candidates(free_types_only: bool, one: bool) -> DriverStatement:
    due = (jobs.c.status == PENDING, jobs.c.run_at <= bindparam("now"),
           jobs.c.type == bindparam("type"), NOT_EXPIRED,
           *([TYPE_FREE] if free_types_only else []))
    ranges = [select(jobs.c.id, jobs.c.priority, jobs.c.created_at)
              .where(*due, jobs.c.priority == literal_column(str(level)))
              .order_by(jobs.c.created_at, jobs.c.id)
              .limit(claim_limit(one))
              .with_for_update(skip_locked=True)
              .subquery()
              for level in LEVELS]
    return DriverStatement(union_all(*(select(part) for part in ranges)))


class Candidate(NamedTuple):
    """A pending job a claim may take, with what choosing among candidates reads."""

    id: int
    priority: int
    created_at: int
    concurrency_key: str | None = None


# The same candidates read on SQLite's driver cursor (app/storage/statements.py): a claim of
# a type under flow control reads one per type, where the claim of any type runs one
# statement in all.
@functools.cache
def _driver_candidates_one_type(free_types_only: bool, one: bool) -> DriverStatement:
    stmt = _candidates_one_type(one)
    return DriverStatement(stmt.where(TYPE_FREE) if free_types_only else stmt)


@functools.cache
def _driver_fair_candidates(one: bool) -> DriverStatement:
    return DriverStatement(_fair_candidates(one))


def _candidates(conn: Connection, stmt: DriverStatement,
                params: Mapping[str, Any]) -> list[Candidate]:
    return [Candidate(*row) for row in stmt.rows(conn, params)]
_due_probe_one_type_by_key = (
    select(jobs.c.id)
    .where(jobs.c.status == PENDING, jobs.c.run_at <= bindparam("now"),
           jobs.c.type == bindparam("type"), _not_a_full_key, NOT_EXPIRED)
    .order_by(*CLAIM_ORDER)
    .limit(1)
)
# A claim-many under per-key caps reads further down a type's claim order while the keys it
# meets are full, up to this many candidates, so that one busy key cannot make it scan the
# whole backlog.
MAX_GATED_CANDIDATES = 1024

_CLAIMED_VALUES = Transition.CLAIM.values(
    now_us=bindparam("now"),
    worker=bindparam("worker"),
    lease_expires_at=capped_lease(bindparam("now"), bindparam("lease_expires_at")),
    # One token per job and attempt: the claim's random nonce, then the job's id.
    lease_token=bindparam("nonce", type_=String) + "." + cast(jobs.c.id, String),
    # The worker's instance label, a value bound into the claim's own UPDATE.
    instance=bindparam("instance", type_=String),
)


@functools.cache
def _due_any_type(free_types_only: bool) -> tuple[Any, ...]:
    """What makes a job a candidate of a claim of any type."""
    return (CLAIMABLE_ROW, jobs.c.run_at <= bindparam("now"), NOT_EXPIRED,
            *([TYPE_FREE] if free_types_only else []))


@functools.cache
def _usual_any_type(free_types_only: bool, positioned: bool, columns: tuple[Any, ...],
                    one: bool) -> Any:
    """The candidates of a claim of any type, as a Select of `columns` with its LIMIT: read
    from the front of the pending jobs in claim order, or (`positioned`) each priority level
    from its position first (app/jobs/domain/claim_positions.py), then from the front should
    those give too few."""
    # PostgreSQL renders FOR UPDATE SKIP LOCKED, so concurrent claims pass over each other's
    # rows instead of queueing on them; SQLite renders nothing and relies on BEGIN IMMEDIATE.
    due = _due_any_type(free_types_only)
    front = (select(*columns).where(*due).order_by(*CLAIM_ORDER).limit(claim_limit(one))
             .with_for_update(skip_locked=True))
    if not positioned:
        return front
    # One part per level, highest first, each a range of the claim index that starts at
    # its position; the front last. PostgreSQL runs the parts of a UNION ALL in order and
    # stops once the LIMIT has its rows, locking only the rows it returns: a claim whose
    # positions find a job reads nothing else.
    parts = [
        select(*columns)
        .where(*due, jobs.c.priority == literal_column(str(level)),
               tuple_(jobs.c.created_at, jobs.c.id)
               >= tuple_(bindparam(f"created_{level}"), bindparam(f"id_{level}")))
        .order_by(jobs.c.created_at, jobs.c.id)
        .limit(claim_limit(one))
        .with_for_update(skip_locked=True)
        .subquery()
        for level in LEVELS
    ]
    every = union_all(*(select(part) for part in [*parts, front.subquery()])).subquery()
    return select(every).limit(claim_limit(one))


def _candidates_any_type(free_types_only: bool, positioned: bool, aging_types: int,
                         one: bool) -> Any:
    """The candidates of a claim of any type, as a CTE: the usual ones, or with `aging_types`
    types that age, the best of them and of those types' levels in the aged order
    (app/jobs/sql/aging_claims.py)."""
    if aging_types:
        usual = _usual_any_type(free_types_only, positioned, CANDIDATE_COLUMNS, one)
        return aged_any_type_candidates(usual, _due_any_type(free_types_only), aging_types,
                                        one)
    # MATERIALIZED makes the candidates a fixed set: as a plain subquery PostgreSQL may
    # re-run it for each row it updates, and with SKIP LOCKED each re-run finds new rows,
    # so one claim would take more jobs than its LIMIT.
    return (_usual_any_type(free_types_only, positioned, (jobs.c.id,), one)
            .cte("candidates").prefix_with("MATERIALIZED"))


@functools.cache
def _claim_any_type(key_to_confirm: bool, free_types_only: bool, positioned: bool,
                    aging_types: int, one: bool) -> DriverStatement:
    candidates = _candidates_any_type(free_types_only, positioned, aging_types, one)
    # The claim of one job updates the row whose id its candidate names: a look-up by the
    # primary key whatever the statistics say. Joined (IN) to the candidates, the table
    # counted nearly empty (after a purge, before the next ANALYZE) is read whole instead.
    chosen = (jobs.c.id == select(candidates.c.id).scalar_subquery() if one
              else jobs.c.id.in_(select(candidates.c.id)))
    claim = update(jobs).where(chosen, CLAIMABLE_BY_ID)
    if key_to_confirm:
        claim = claim.where(live_key_condition())
    return DriverStatement(claim.values(_CLAIMED_VALUES).returning(*_CLAIMED_COLUMNS))


# A claimed job comes back with the checkpoint its previous attempt saved (docs/JOBS.md) and
# the trace context it was enqueued with (docs/TRACING.md), in this order after its columns.
_CLAIMED_COLUMNS = (*JOB_COLUMNS, CHECKPOINT, *TRACE)
# Jobs already chosen (and, on PostgreSQL, locked) by id.
# One job chosen (a claim of one): on SQLite's driver cursor, as the claim of any type is.
_claim_chosen_one = DriverStatement(
    update(jobs)
    .where(jobs.c.id == bindparam("chosen_id"), CLAIMABLE_BY_ID, NOT_EXPIRED)
    .values(_CLAIMED_VALUES)
    .returning(*_CLAIMED_COLUMNS)
)
_claim_chosen = (
    update(jobs)
    .where(jobs.c.id.in_(bindparam("ids", expanding=True)), CLAIMABLE_BY_ID, NOT_EXPIRED)
    .values(_CLAIMED_VALUES)
    .returning(*_CLAIMED_COLUMNS)
)
# The same claims, made only while the caller's key is live (KeyToConfirm).
_claim_chosen_one_if_live = DriverStatement(
    _claim_chosen_one.statement.where(live_key_condition()))
_claim_chosen_if_live = _claim_chosen.where(live_key_condition())

# The claim's own stamps moved to the moment it held its locks (JobService.claim).
_restamp_claimed = (
    update(jobs)
    .where(jobs.c.id.in_(bindparam("ids", expanding=True)),
           status_is_job_by_id(JobStatus.RUNNING))
    .values(claimed_at=bindparam("now"),
            lease_expires_at=capped_lease(bindparam("now"), bindparam("lease_expires_at")),
            claimed_until=capped_lease(bindparam("now"), bindparam("lease_expires_at")),
            updated_at=bindparam("now"))
    .returning(*JOB_COLUMNS)
)



class ClaimedRows(NamedTuple):
    """What a claim took: its jobs in claim order, the checkpoints their previous attempts
    saved (compact JSON, by job id; a job without one is not in it), and the trace contexts
    they were enqueued with (by job id; likewise)."""

    jobs: list[Job]
    checkpoints: dict[int, str]
    traces: dict[int, Trace]


class ClaimRepository:
    """The claim's SQL on one connection (JobRepository, its subclass, adds the rest)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        # The caller's key, to be confirmed live by the next statement of a step that folds
        # it in (insert_job, claim_next_jobs, apply_transition, extend_lease, get_job for
        # update); None once confirmed, or when nobody asked.
        self.key_to_confirm: KeyToConfirm | None = None

    def take_key_to_confirm(self) -> KeyToConfirm | None:
        """The caller's key for the statement about to fold it in (see key_to_confirm),
        which then tells it what it found (KeyToConfirm.answered)."""
        key, self.key_to_confirm = self.key_to_confirm, None
        return key

    def has_claimable_work(self, now_us: int, types: Collection[str] | None,
                           limits: ClaimLimits | None = None, *,
                           free_types_only: bool = False) -> bool:
        """True when a claim now could find a job: a due pending one (a job whose lease ran
        out is pending again once the maintenance loop rescues it). Index probes only;
        cheap enough to poll while claims wait. `types=None` means any type. Under `limits`
        (with `types` then the wanted ones, every configured type when any is), only work
        they allow counts: a waiting claim must not wake for jobs it may not take.
        `free_types_only`: only jobs of types under no flow control now count (the claim's
        condition when it read no type's row)."""
        any_type, one_type = ((_due_probe_any_free_type, _due_probe_one_free_type)
                              if free_types_only else (_due_probe_any_type, _due_probe_one_type))
        if types is None:
            return self.conn.execute(any_type, {"now": now_us}).first() is not None
        if limits is not None:
            types = limits.allowed(types)
        for job_type in sorted(types):
            full_keys = limits.full_keys(job_type) if limits is not None else []
            stmt, params = one_type, {"now": now_us, "type": job_type}
            if full_keys:
                stmt, params = _due_probe_one_type_by_key, {**params, "full_keys": full_keys}
            if self.conn.execute(stmt, params).first() is not None:
                return True
        return False

    def has_due_work_of(self, job_type: str, now_us: int,
                        concurrency_keys: Collection[str] | None = None) -> bool:
        """True when a job of this type (and, when given, of one of these keys) is due."""
        if concurrency_keys is None:
            return self.conn.execute(
                _due_probe_one_type, {"now": now_us, "type": job_type}).first() is not None
        stmt = (select(jobs.c.id)
                .where(jobs.c.status == PENDING, jobs.c.run_at <= now_us,
                       or_(jobs.c.expires_at.is_(None), jobs.c.expires_at > now_us),
                       jobs.c.type == job_type,
                       jobs.c.concurrency_key.in_(sorted(concurrency_keys)))
                .limit(1))
        return self.conn.execute(stmt).first() is not None

    # -- claiming ---------------------------------------------------------------------------

    def claim_next_jobs(self, *, now_us: int, worker: str, lease_expires_at: int, nonce: str,
                        limit: int, types: Collection[str] | None,
                        instance: str | None = None,
                        limits: ClaimLimits | None = None,
                        free_types_only: bool = False,
                        positions: Mapping[int, Position] | None = None,
                        aging_us: Mapping[str, int] | None = None) -> ClaimedRows:
        """Mark up to `limit` claimable jobs running for `worker`, returned in claim order
        with their checkpoints, each carrying `instance` (the worker's label, None: none).

        `types=None` means any type. Under flow control's `limits` (with `types` then the
        wanted ones, every configured type when any is), each of the types they allow is
        read within its budget, its full keys left out and no key taken beyond its cap.
        Must run in a write transaction (BEGIN IMMEDIATE on SQLite), which makes the read of
        the candidates and their update one step. `free_types_only` (a claim that read no
        type's row): only jobs of types under no flow control now are taken. `positions` (a
        claim of any type, while the horizon is held): the (created_at, id) each priority
        level is read from before the front (app/jobs/domain/claim_positions.py).
        `aging_us`: the types that age, with their interval (app/jobs/domain/aging.py), whose
        jobs are taken in the aged order.
        """
        aging_us = aging_us or {}
        params: dict[str, Any] = {
            "now": now_us, "worker": worker, "lease_expires_at": lease_expires_at,
            "nonce": nonce, "limit": limit, "instance": instance,
        }
        rows: Sequence[Any]
        if types is None:
            key = self.take_key_to_confirm()
            if key is not None:
                params[LIVE_KEY] = key.digest
            for level, (created_at, job_id) in (positions or {}).items():
                params.update({f"created_{level}": created_at, f"id_{level}": job_id})
            params.update(aging_params(aging_us))
            claim = _claim_any_type(key is not None, free_types_only, positions is not None,
                                    len(aging_us), limit == 1)
            rows = claim.rows(self.conn, params)
            if key is not None:
                key.answered(bool(rows))
        else:
            if limits is not None:
                types = limits.allowed(types)
            # Each type's candidates through its own index, then the most urgent of all of
            # them: one query over several types would have to read every pending job of
            # those types to sort them. Merged, not sorted: a fair type's candidates keep
            # their round order among themselves.
            candidates = heapq.merge(*(
                [(aging.order_key(row.priority, row.created_at, row.id,
                                  aging_us.get(job_type), now_us), row.id)
                 for row in self._candidates_of(job_type, params, limits, free_types_only,
                                                aging_us.get(job_type))]
                for job_type in sorted(types)))
            chosen = [job_id for _key, job_id in itertools.islice(candidates, limit)]
            if not chosen:
                return ClaimedRows([], {}, {})
            key = self.take_key_to_confirm()
            if key is not None:
                params[LIVE_KEY] = key.digest
            if len(chosen) == 1:
                claim_one = _claim_chosen_one if key is None else _claim_chosen_one_if_live
                rows = claim_one.rows(self.conn, {**params, "chosen_id": chosen[0]})
            else:
                rows = self.conn.execute(_claim_chosen if key is None else _claim_chosen_if_live,
                                         {**params, "ids": chosen}).all()
            if key is not None:
                key.answered(bool(rows))
        claimed = [job_of(row) for row in rows]
        # RETURNING gives no order; hand the jobs out in claim order (aged, where types age).
        claimed.sort(key=lambda job: aging.claim_key(job, aging_us, now_us))
        checkpoint = JOB_COLUMN_COUNT
        traceparent, tracestate = checkpoint + 1, checkpoint + 2
        return ClaimedRows(
            claimed,
            {row[0]: row[checkpoint] for row in rows if row[checkpoint] is not None},
            {row[0]: trace for row in rows
             if (trace := trace_of(row[traceparent], row[tracestate])) is not None})

    def restamp_claimed(self, claimed: list[Job], *, now_us: int,
                        lease_expires_at: int) -> list[Job]:
        """The jobs this transaction just claimed, claimed at `now_us` instead, with their
        lease from then (a claim that waited for a lock before its commit), in their order."""
        if not claimed:
            return []
        rows = self.conn.execute(_restamp_claimed, {
            "ids": [job.id for job in claimed], "now": now_us,
            "lease_expires_at": lease_expires_at}).all()
        by_id = {row.id: job_of(row) for row in rows}
        return [by_id[job.id] for job in claimed]

    def _candidates_of(self, job_type: str, params: dict[str, Any],
                       limits: ClaimLimits | None, free_types_only: bool = False,
                       aging_us: int | None = None) -> list[Any]:
        """One type's candidates in claim order (aged, with `aging_us`): within its budget,
        as LIMIT; without its full keys, as a condition; a key met more often than its cap
        allows passed over."""
        if limits is None:
            one = params["limit"] == 1
            if aging_us is not None:
                return self._aged_candidates(_driver_aging_candidates(free_types_only, one),
                                             {**params, "type": job_type}, aging_us)
            return _candidates(self.conn, _driver_candidates_one_type(free_types_only, one),
                               {**params, "type": job_type})
        budget = limits.budget(job_type, params["limit"])
        if budget <= 0:
            return []
        full_keys = limits.full_keys(job_type)
        fair = job_type in limits.fair
        if job_type not in limits.key_caps:
            one = budget == 1
            if aging_us is not None and not fair:
                return self._aged_candidates(_driver_aging_candidates(False, one),
                                             {**params, "type": job_type, "limit": budget},
                                             aging_us)
            return _candidates(
                self.conn, _driver_fair_candidates(one) if fair
                else _driver_candidates_one_type(False, one),
                {**params, "type": job_type, "limit": budget})
        by_key = _fair_candidates_by_key if fair else _candidates_one_type_by_key
        fetch = budget
        while True:
            rows = list(self.conn.execute(by_key, {
                **params, "type": job_type, "limit": fetch, "full_keys": full_keys}))
            chosen = limits.pick(job_type, rows, budget)
            if len(chosen) >= budget or len(rows) < fetch or fetch >= MAX_GATED_CANDIDATES:
                return chosen
            fetch = min(fetch * 4, MAX_GATED_CANDIDATES)

    def _aged_candidates(self, stmt: DriverStatement, params: dict[str, Any],
                         aging_us: int) -> list[Candidate]:
        """An aging type's first :limit candidates in the aged order, from its levels."""
        rows = _candidates(self.conn, stmt, params)
        rows.sort(key=lambda row: aging.order_key(row.priority, row.created_at, row.id,
                                                  aging_us, params["now"]))
        return rows[:params["limit"]]
