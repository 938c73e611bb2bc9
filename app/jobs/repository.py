"""The only place job SQL lives. Every method runs on the connection (and transaction) it is given.

Values from requests are always bound parameters. The one literal is the status 'pending' or
'running' in the queries that must match a partial index, which the planners only use when
the query's WHERE repeats the index's own literal.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping
from typing import Any

from sqlalchemy import (
    Connection,
    String,
    bindparam,
    cast,
    delete,
    func,
    insert,
    literal_column,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from app.db import UNIQUE_HOLDER_PREDICATE, jobs
from app.jobs.models import Job, JobStatus

_PENDING = literal_column("'pending'")
_RUNNING = literal_column("'running'")
_CLAIM_ORDER = (jobs.c.priority.desc(), jobs.c.created_at, jobs.c.id)

_select_by_id = select(jobs).where(jobs.c.id == bindparam("job_id"))
_select_by_id_for_update = _select_by_id.with_for_update()
_select_by_idempotency_key = select(jobs).where(
    jobs.c.producer == bindparam("producer"),
    jobs.c.idempotency_key == bindparam("idempotency_key"),
)
# The predicate is the unique index's own text, so the look-up reads that index.
_unique_holder = text(UNIQUE_HOLDER_PREDICATE)
_select_unique_holder = select(jobs).where(
    jobs.c.producer == bindparam("producer"),
    jobs.c.unique_scope == bindparam("unique_scope"),
    _unique_holder,
)
# SKIP LOCKED: a lease another claim is rescuing right now is simply left to that claim.
_select_expired_leases = (
    select(jobs)
    .where(jobs.c.status == _RUNNING, jobs.c.lease_expires_at <= bindparam("now"))
    .order_by(jobs.c.lease_expires_at)
    .limit(bindparam("limit"))
    .with_for_update(skip_locked=True)
)


def _pending_due(restricted_to_one_type: bool) -> Any:
    """Pending jobs that are due, in claim order (of one type: read through its own index)."""
    stmt = select(jobs.c.id, jobs.c.priority, jobs.c.created_at).where(
        jobs.c.status == _PENDING, jobs.c.run_at <= bindparam("now"))
    if restricted_to_one_type:
        stmt = stmt.where(jobs.c.type == bindparam("type"))
    return stmt.order_by(*_CLAIM_ORDER)


_expired_lease_probe = select(jobs.c.id).where(
    jobs.c.status == _RUNNING, jobs.c.lease_expires_at <= bindparam("now")).limit(1)
_due_probe_any_type = _pending_due(restricted_to_one_type=False).limit(1)
_due_probe_one_type = _pending_due(restricted_to_one_type=True).limit(1)

# Candidates of one type for a claim; PostgreSQL locks them, skipping rows other claims hold.
_candidates_one_type = (
    _pending_due(restricted_to_one_type=True)
    .limit(bindparam("limit"))
    .with_for_update(skip_locked=True)
)

_CLAIMED_VALUES = {
    "status": JobStatus.RUNNING.value,
    "claimed_at": bindparam("now"),
    "worker_id": bindparam("worker"),
    "lease_expires_at": bindparam("lease_expires_at"),
    # One token per job and attempt: the claim's random nonce, then the job's id.
    "lease_token": bindparam("nonce", type_=String) + "." + cast(jobs.c.id, String),
    "updated_at": bindparam("now"),
}


def _claim_next_any_type() -> Any:
    # PostgreSQL renders FOR UPDATE SKIP LOCKED, so concurrent claims pass over each other's
    # rows instead of queueing on them; SQLite renders nothing and relies on BEGIN IMMEDIATE.
    # MATERIALIZED makes the candidates a fixed set: as a plain subquery PostgreSQL may
    # re-run it for each row it updates, and with SKIP LOCKED each re-run finds new rows,
    # so one claim would take more jobs than its LIMIT.
    candidates = (
        select(jobs.c.id)
        .where(jobs.c.status == _PENDING, jobs.c.run_at <= bindparam("now"))
        .order_by(*_CLAIM_ORDER)
        .limit(bindparam("limit"))
        .with_for_update(skip_locked=True)
        .cte("candidates")
        .prefix_with("MATERIALIZED")
    )
    return (
        update(jobs)
        .where(jobs.c.id.in_(select(candidates.c.id)), jobs.c.status == _PENDING)
        .values(_CLAIMED_VALUES)
        .returning(*jobs.c)
    )


_claim_any_type = _claim_next_any_type()
# Jobs already chosen (and, on PostgreSQL, locked) by id.
_claim_chosen = (
    update(jobs)
    .where(jobs.c.id.in_(bindparam("ids", expanding=True)), jobs.c.status == _PENDING)
    .values(_CLAIMED_VALUES)
    .returning(*jobs.c)
)


@functools.cache
def _job_update(columns: frozenset[str], *, from_statuses: frozenset[str] | None,
                fenced: bool) -> Any:
    """UPDATE of `columns` on one job, RETURNING it. With `from_statuses` None the job must be
    held: running, by the worker, under a live lease; otherwise its status must be one of
    them. `fenced` adds: its lease token matches. Built once per shape: building and hashing
    a statement costs more than running it on the hot paths."""
    if from_statuses is None:
        conditions = [jobs.c.status == _RUNNING,
                      jobs.c.worker_id == bindparam("worker"),
                      jobs.c.lease_expires_at > bindparam("now")]
    else:
        conditions = [jobs.c.status.in_(sorted(from_statuses))]
    if fenced:
        conditions.append(jobs.c.lease_token == bindparam("held_lease_token"))
    return (
        update(jobs)
        .where(jobs.c.id == bindparam("job_id"), *conditions)
        .values({name: bindparam(f"new_{name}") for name in sorted(columns)})
        .returning(*jobs.c)
    )


@functools.cache
def _insert_statement(dialect: str, skip_conflicts: bool) -> Any:
    stmt = (postgresql.insert(jobs) if dialect == "postgresql" else sqlite.insert(jobs))
    if skip_conflicts:
        stmt = stmt.on_conflict_do_nothing()
    return stmt.returning(*jobs.c)


def _new_values(values: Mapping[str, Any]) -> dict[str, Any]:
    return {f"new_{name}": value for name, value in values.items()}


def _job(row: Any) -> Job:
    return Job(*row)


class JobRepository:
    """Job SQL on one connection. Methods returning `Job | None` return None for "no such row"
    (or, for conditional updates, "the row was not in the expected state")."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    # -- creating -------------------------------------------------------------------------

    def insert_job(self, values: Mapping[str, Any]) -> Job | None:
        """Insert a job. None when (producer, idempotency_key) is taken, or its unique scope
        is held: the caller finds the job that stands in the way."""
        skip_conflicts = (values.get("idempotency_key") is not None
                          or values.get("unique_scope") is not None)
        stmt = _insert_statement(self.conn.dialect.name, skip_conflicts=skip_conflicts)
        row = self.conn.execute(stmt, values).first()
        return None if row is None else _job(row)

    def insert_jobs(self, rows: list[Mapping[str, Any]]) -> list[Job]:
        """Insert several jobs in one statement; the jobs come back in the rows' order.

        No ON CONFLICT here: the caller has looked up the idempotency keys in the same
        transaction, and a concurrent twin raises IntegrityError for it to retry.
        """
        if not rows:
            return []
        stmt = insert(jobs).returning(*jobs.c, sort_by_parameter_order=True)
        return [_job(row) for row in self.conn.execute(stmt, list(rows))]

    # -- reading --------------------------------------------------------------------------

    def get_job(self, job_id: int, *, for_update: bool = False) -> Job | None:
        stmt = _select_by_id_for_update if for_update else _select_by_id
        row = self.conn.execute(stmt, {"job_id": job_id}).first()
        return None if row is None else _job(row)

    def find_by_idempotency_key(self, producer: str, idempotency_key: str) -> Job | None:
        row = self.conn.execute(
            _select_by_idempotency_key,
            {"producer": producer, "idempotency_key": idempotency_key},
        ).first()
        return None if row is None else _job(row)

    def find_unique_holder(self, producer: str, unique_scope: str) -> Job | None:
        """The producer's job that holds this unique scope now (in one of its while
        statuses); None when no job does."""
        row = self.conn.execute(_select_unique_holder,
                                {"producer": producer, "unique_scope": unique_scope}).first()
        return None if row is None else _job(row)

    def find_unique_holders(self, producer: str, scopes: Collection[str]) -> dict[str, Job]:
        """The producer's jobs holding these unique scopes now, by scope."""
        if not scopes:
            return {}
        stmt = select(jobs).where(jobs.c.producer == producer,
                                  jobs.c.unique_scope.in_(list(scopes)), _unique_holder)
        return {job.unique_scope or "": job for job in map(_job, self.conn.execute(stmt))}

    def list_jobs(self, *, after_id: int, limit: int, producer: str | None = None,
                  worker: str | None = None, status: str | None = None,
                  job_type: str | None = None) -> list[Job]:
        """Jobs with id > after_id in id order, narrowed by the filters that are not None."""
        stmt = select(jobs).where(jobs.c.id > after_id)
        if producer is not None:
            stmt = stmt.where(jobs.c.producer == producer)
        if worker is not None:
            stmt = stmt.where(jobs.c.worker_id == worker)
        if status is not None:
            stmt = stmt.where(jobs.c.status == status)
        if job_type is not None:
            stmt = stmt.where(jobs.c.type == job_type)
        stmt = stmt.order_by(jobs.c.id).limit(limit)
        return [_job(row) for row in self.conn.execute(stmt)]

    def find_by_idempotency_keys(self, producer: str, keys: Collection[str]) -> dict[str, Job]:
        """The producer's jobs with these idempotency keys, by key."""
        if not keys:
            return {}
        stmt = select(jobs).where(jobs.c.producer == producer,
                                  jobs.c.idempotency_key.in_(list(keys)))
        return {job.idempotency_key: job for job in map(_job, self.conn.execute(stmt))}

    def has_claimable_work(self, now_us: int, types: Collection[str] | None) -> bool:
        """True when a claim now could find a job: a due pending one, or an expired lease.
        Index probes only; cheap enough to poll while claims wait."""
        if self.conn.execute(_expired_lease_probe, {"now": now_us}).first() is not None:
            return True
        if types is None:
            return self.conn.execute(_due_probe_any_type, {"now": now_us}).first() is not None
        return any(
            self.conn.execute(_due_probe_one_type, {"now": now_us, "type": job_type}).first()
            is not None
            for job_type in sorted(types))

    def find_expired_leases(self, now_us: int, limit: int) -> list[Job]:
        """Running jobs whose lease ran out, oldest expiry first (locked on PostgreSQL)."""
        rows = self.conn.execute(_select_expired_leases, {"now": now_us, "limit": limit})
        return [_job(row) for row in rows]

    def count_jobs_by_status_and_type(self) -> dict[tuple[str, str], int]:
        """How many jobs are stored in each (status, type). One scan of the table: metrics call
        it once per scrape, and purge keeps the table it scans bounded."""
        stmt = select(jobs.c.status, jobs.c.type, func.count()).group_by(jobs.c.status,
                                                                         jobs.c.type)
        return {(status, job_type): count for status, job_type, count in self.conn.execute(stmt)}

    def oldest_claimable_run_at(self, now_us: int) -> int | None:
        """The earliest `run_at` among the jobs a claim could take now; None when there are
        none. The literal status keeps the read inside the partial index of pending rows."""
        stmt = select(func.min(jobs.c.run_at)).where(jobs.c.status == _PENDING,
                                                     jobs.c.run_at <= bindparam("now"))
        return self.conn.execute(stmt, {"now": now_us}).scalar()

    # -- changing -------------------------------------------------------------------------

    def claim_next_jobs(self, *, now_us: int, worker: str, lease_expires_at: int, nonce: str,
                        limit: int, types: Collection[str] | None) -> list[Job]:
        """Mark up to `limit` claimable jobs running for `worker`, returned in claim order.

        `types=None` means any type. Must run in a write transaction (BEGIN IMMEDIATE on
        SQLite), which makes the read of the candidates and their update one step.
        """
        params: dict[str, Any] = {
            "now": now_us, "worker": worker, "lease_expires_at": lease_expires_at,
            "nonce": nonce, "limit": limit,
        }
        if types is None:
            rows = self.conn.execute(_claim_any_type, params)
        else:
            # Each type's candidates through its own index, then the most urgent of all of
            # them: one query over several types would have to read every pending job of
            # those types to sort them.
            candidates = [
                row for job_type in sorted(types)
                for row in self.conn.execute(_candidates_one_type, {**params, "type": job_type})
            ]
            candidates.sort(key=lambda row: (-row.priority, row.created_at, row.id))
            chosen = [row.id for row in candidates[:limit]]
            if not chosen:
                return []
            rows = self.conn.execute(_claim_chosen, {**params, "ids": chosen})
        claimed = [_job(row) for row in rows]
        # RETURNING gives no order; hand the jobs out in claim order.
        claimed.sort(key=lambda job: (-job.priority, job.created_at, job.id))
        return claimed

    def update_held_job(self, job_id: int, *, worker: str, now_us: int,
                        lease_token: str | None, values: Mapping[str, Any]) -> Job | None:
        """Apply `values` if `worker` holds a live lease on the job (named by `lease_token`
        when given). None when it does not, or when there is no such job."""
        stmt = _job_update(frozenset(values), from_statuses=None,
                           fenced=lease_token is not None)
        params = {"job_id": job_id, "worker": worker, "now": now_us,
                  "held_lease_token": lease_token, **_new_values(values)}
        row = self.conn.execute(stmt, params).first()
        return None if row is None else _job(row)

    def update_job_in_status(self, job_id: int, *, from_statuses: Collection[str],
                             values: Mapping[str, Any],
                             lease_token: str | None = None) -> Job | None:
        """Apply `values` if the job's status is one of `from_statuses` (and, when given, its
        lease token is `lease_token`). None when it is not, or when there is no such job."""
        stmt = _job_update(frozenset(values), from_statuses=frozenset(from_statuses),
                           fenced=lease_token is not None)
        params = {"job_id": job_id, "held_lease_token": lease_token, **_new_values(values)}
        row = self.conn.execute(stmt, params).first()
        return None if row is None else _job(row)

    # -- retention ------------------------------------------------------------------------

    def delete_finished_jobs(self, *, statuses: Collection[str], updated_before_us: int,
                             after_id: int, limit: int) -> tuple[int, int | None]:
        """Delete up to `limit` jobs in `statuses` last updated before the cutoff, scanning
        ids above `after_id`. Returns (deleted, last id scanned or None when done)."""
        batch = select(jobs.c.id).where(
            jobs.c.id > after_id,
            jobs.c.status.in_(list(statuses)),
            jobs.c.updated_at < updated_before_us,
        ).order_by(jobs.c.id).limit(limit)
        ids = list(self.conn.execute(batch).scalars())
        if not ids:
            return 0, None
        self.conn.execute(delete(jobs).where(jobs.c.id.in_(ids)))
        return len(ids), ids[-1]
