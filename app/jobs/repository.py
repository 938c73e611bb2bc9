"""The only place job SQL lives. Every method runs on the connection (and transaction) it is given.

Values from requests are always bound parameters. The one literal is the status 'pending' or
'running' in the queries that must match a partial index, which the planners only use when
the query's WHERE repeats the index's own literal.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from sqlalchemy import (
    Connection,
    String,
    bindparam,
    cast,
    delete,
    literal_column,
    select,
    update,
)

from app.db import dialect_insert, jobs
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
# SKIP LOCKED: a lease another claim is rescuing right now is simply left to that claim.
_select_expired_leases = (
    select(jobs)
    .where(jobs.c.status == _RUNNING, jobs.c.lease_expires_at <= bindparam("now"))
    .order_by(jobs.c.lease_expires_at)
    .limit(bindparam("limit"))
    .with_for_update(skip_locked=True)
)


def _claim_statement(restricted_to_types: bool) -> Any:
    candidates = select(jobs.c.id).where(
        jobs.c.status == _PENDING, jobs.c.run_at <= bindparam("now")
    )
    if restricted_to_types:
        candidates = candidates.where(jobs.c.type.in_(bindparam("types", expanding=True)))
    # PostgreSQL renders FOR UPDATE SKIP LOCKED, so concurrent claims pass over each other's
    # rows instead of queueing on them; SQLite renders nothing and relies on BEGIN IMMEDIATE.
    # The candidates are a MATERIALIZED CTE, read once: as a plain `IN (subquery)` PostgreSQL
    # may plan a semi join that runs the LIMIT subquery again for every outer row, and with
    # SKIP LOCKED each run finds the next row, so one claim took every claimable job.
    candidates = (
        candidates.order_by(*_CLAIM_ORDER)
        .limit(bindparam("limit"))
        .with_for_update(skip_locked=True)
        .cte("claim_candidates")
        .prefix_with("MATERIALIZED", dialect="postgresql")
    )
    return (
        update(jobs)
        .where(jobs.c.id.in_(select(candidates.c.id)), jobs.c.status == _PENDING)
        .values(
            status=JobStatus.RUNNING.value,
            claimed_at=bindparam("now"),
            worker_id=bindparam("worker"),
            lease_expires_at=bindparam("lease_expires_at"),
            # One token per job and attempt: the claim's random nonce, then the job's id.
            lease_token=bindparam("nonce", type_=String) + "." + cast(jobs.c.id, String),
            updated_at=bindparam("now"),
        )
        .returning(*jobs.c)
    )


_claim_any_type = _claim_statement(restricted_to_types=False)
_claim_some_types = _claim_statement(restricted_to_types=True)

_update_held_job = (
    update(jobs)
    .where(
        jobs.c.id == bindparam("job_id"),
        jobs.c.status == _RUNNING,
        jobs.c.worker_id == bindparam("worker"),
        jobs.c.lease_expires_at > bindparam("now"),
    )
    .returning(*jobs.c)
)


def _job(row: Any) -> Job:
    return Job(*row)


class JobRepository:
    """Job SQL on one connection. Methods returning `Job | None` return None for "no such row"
    (or, for conditional updates, "the row was not in the expected state")."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    # -- creating -------------------------------------------------------------------------

    def insert_job(self, values: Mapping[str, Any]) -> Job | None:
        """Insert a job. None when (producer, idempotency_key) is taken: the caller replays."""
        stmt = dialect_insert(self.conn, jobs).values(**values)
        if values.get("idempotency_key") is not None:
            stmt = stmt.on_conflict_do_nothing()
        row = self.conn.execute(stmt.returning(*jobs.c)).first()
        return None if row is None else _job(row)

    def insert_jobs(self, rows: list[Mapping[str, Any]]) -> list[Job | None]:
        """Insert several jobs, each as `insert_job` would, answers in the same order."""
        return [self.insert_job(values) for values in rows]

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

    def find_expired_leases(self, now_us: int, limit: int) -> list[Job]:
        """Running jobs whose lease ran out, oldest expiry first (locked on PostgreSQL)."""
        rows = self.conn.execute(_select_expired_leases, {"now": now_us, "limit": limit})
        return [_job(row) for row in rows]

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
            stmt = _claim_any_type
        else:
            stmt, params["types"] = _claim_some_types, list(types)
        claimed = [_job(row) for row in self.conn.execute(stmt, params)]
        # RETURNING gives no order; hand the jobs out in claim order.
        claimed.sort(key=lambda job: (-job.priority, job.created_at, job.id))
        return claimed

    def update_held_job(self, job_id: int, *, worker: str, now_us: int,
                        lease_token: str | None, values: Mapping[str, Any]) -> Job | None:
        """Apply `values` if `worker` holds a live lease on the job (named by `lease_token`
        when given). None when it does not, or when there is no such job."""
        stmt = _update_held_job.values(**values)
        params = {"job_id": job_id, "worker": worker, "now": now_us}
        if lease_token is not None:
            stmt = stmt.where(jobs.c.lease_token == bindparam("held_lease_token"))
            params["held_lease_token"] = lease_token
        row = self.conn.execute(stmt, params).first()
        return None if row is None else _job(row)

    def update_job_in_status(self, job_id: int, *, from_statuses: Collection[str],
                             values: Mapping[str, Any],
                             lease_token: str | None = None) -> Job | None:
        """Apply `values` if the job's status is one of `from_statuses` (and, when given, its
        lease token is `lease_token`). None when it is not, or when there is no such job."""
        stmt = (
            update(jobs)
            .where(jobs.c.id == job_id, jobs.c.status.in_(list(from_statuses)))
            .values(**values)
            .returning(*jobs.c)
        )
        if lease_token is not None:
            stmt = stmt.where(jobs.c.lease_token == lease_token)
        row = self.conn.execute(stmt).first()
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
