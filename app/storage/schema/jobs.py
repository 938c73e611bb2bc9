"""The jobs table, and the indexes the claim, the lease rescue, flow control and the
listings are planned on."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Index,
    Integer,
    SmallInteger,
    String,
    Table,
    Text,
    text,
)

from app.core.statuses import CLAIM_ORDER, STATUS_BITS
from app.storage.schema.base import Id, Micros, metadata

jobs = Table(
    "jobs",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("type", String(100), nullable=False),
    Column("payload", Text, nullable=False),
    Column("priority", SmallInteger, nullable=False),
    Column("status", String(16), nullable=False),
    Column("retry_count", Integer, nullable=False),
    Column("max_retries", Integer, nullable=False),
    Column("producer", String(100), nullable=False),
    Column("idempotency_key", String(255), nullable=True),
    Column("request_fingerprint", String(64), nullable=True),
    Column("run_at", Micros, nullable=False),
    Column("claimed_at", Micros, nullable=True),
    Column("worker_id", String(100), nullable=True),
    Column("lease_expires_at", Micros, nullable=True),
    Column("lease_token", String(64), nullable=True),
    Column("result", Text, nullable=True),
    Column("error", Text, nullable=True),
    Column("created_at", Micros, nullable=False),
    Column("updated_at", Micros, nullable=False),
    # Appended by migration 0005 (flow control): columns are added at the end of the table,
    # and the Job record keeps this order.
    Column("concurrency_key", String(255), nullable=True),
    Column("unique_key", String(255), nullable=True),
    Column("unique_scope", String(64), nullable=True),
    Column("unique_while", SmallInteger, nullable=True),
    # Appended by migration 0008 (schedules): the schedule that enqueued the job, and its slot.
    Column("schedule", String(100), nullable=True),
    Column("scheduled_for", Micros, nullable=True),
    # Appended by migration 0016 (fair share): a fair type's pending job's round, which its
    # claims take in order (app/jobs/tx/key_rules.py); NULL for every other job.
    Column("fair_round", BigInteger, nullable=True),
    # Appended by migration 0017 (running jobs, docs/JOBS.md): read by the claim, which caps
    # an attempt's lease at claimed_at + timeout_seconds and never hands out a job past its
    # expires_at.
    Column("timeout_seconds", Integer, nullable=True),
    Column("expires_at", Micros, nullable=True),
    # Appended by migration 0023: the lease the current attempt's claim granted, which
    # heartbeats move on in lease_expires_at. The claim's event is told from the row
    # (docs/API.md, a job's history), and this is its detail.
    Column("claimed_until", Micros, nullable=True),
    # Appended by migration 0024, and part of the Job record (hence here, after the record's
    # other columns): 1 when a stored dependency edge waits on the job, NULL otherwise. Set
    # in the transaction that stores the edge; a job's end settles dependents only when set
    # (app/jobs/tx/dependencies.py), so the end of a job nobody depends on costs nothing more.
    Column("has_dependents", SmallInteger, nullable=True),
    # Appended by migration 0026 (waits, docs/WAITS.md), part of the Job record: how the job's
    # last wait ended, which its claims carry until it suspends again. NULL on every job that
    # never waited.
    Column("resumed", Text, nullable=True),
    # Appended by migration 0030, part of the Job record: the instance label (host and pid,
    # or the operator's) the worker sent with the current attempt's claim, shown as reported
    # (docs/API.md, GET /workers) and never read for ownership, which is worker_id's and the
    # lease token's. Set by the claim's own UPDATE; NULL when the claim sent none.
    Column("worker_instance", String(200), nullable=True),
    # Also 0017, and never read by the claim (nor part of the Job record): a running job's
    # cancel request and its last progress. On the row, because a heartbeat writes the row
    # anyway: progress reported with it costs no page and no statement more (a table beside
    # it cost a heartbeat a third more WAL). The checkpoint, larger and rarer, is beside it
    # (job_checkpoints).
    Column("cancel_requested_at", Micros, nullable=True),
    Column("cancel_requested_by", String(100), nullable=True),
    Column("progress_done", BigInteger, nullable=True),
    Column("progress_total", BigInteger, nullable=True),
    Column("progress_message", Text, nullable=True),
    Column("progress_at", Micros, nullable=True),
    # Appended by migration 0021 (keys per producer): a fair type's pending job's round among
    # its own producer's keys; `fair_round` is then its round among the producers
    # (app/jobs/tx/key_rules.py). NULL for every other job, and for a type whose keys are shared.
    Column("fair_key_round", BigInteger, nullable=True),
    # SQLite: never reuse an id, not even after the newest jobs are purged (the highest id
    # ever given is kept in sqlite_sequence). PostgreSQL's sequence never goes back anyway.
    sqlite_autoincrement=True,
)

# The claim reads this index in claim order; it holds only pending rows, so its size and the
# claim's cost do not grow with the finished jobs kept beside them. The literal status
# matches the claim's WHERE, which is what lets both planners use a partial index.


def claim_order_columns(table: Table) -> tuple[Any, ...]:
    """The jobs table's columns in claim order (app.jobs.domain.models.CLAIM_ORDER), for ORDER
    BY and the indexes that serve it."""
    return tuple(table.c[name].desc() if descending else table.c[name]
                 for name, descending in CLAIM_ORDER)


Index(
    "ix_jobs_claim_order",
    *claim_order_columns(jobs),
    sqlite_where=text("status = 'pending'"),
    postgresql_where=text("status = 'pending'"),
)
# The same order within each type, for claims limited to some types (workers whose keys
# list types, and every claim while flow control holds a type back): without it such a claim
# walks past every pending job of the other types. run_at comes last (migration 0005): the
# claim checks it without reading the row, and GET /types counts each type's pending and
# scheduled jobs and finds its oldest claimable one from this index alone. (A separate
# (type, run_at) index would not do: without statistics SQLite's planner prefers it for the
# claim, whose type = ? AND run_at <= ? it matches better, and then sorts every due row.)
Index(
    "ix_jobs_claim_order_by_type",
    jobs.c.type,
    *claim_order_columns(jobs),
    jobs.c.run_at,
    sqlite_where=text("status = 'pending'"),
    postgresql_where=text("status = 'pending'"),
)
# Expired leases are found through this one, again holding only the running rows.
Index(
    "ix_jobs_lease_expires_at",
    jobs.c.lease_expires_at,
    sqlite_where=text("status = 'running'"),
    postgresql_where=text("status = 'running'"),
)
# Flow control counts the running jobs of a type, and of each (type, concurrency_key), inside
# every claim of a limited type: through this index the count costs as many entries as jobs
# run (bounded by the workers), never the stored ones.
Index(
    "ix_jobs_running_type_key",
    jobs.c.type,
    jobs.c.concurrency_key,
    sqlite_where=text("status = 'running'"),
    postgresql_where=text("status = 'running'"),
)
# GET /types counts the finished jobs of each type from this index alone (a full scan of the
# table takes seconds at a million rows), and retention finds each type's jobs past their
# window in updated_at order through it (migration 0019 appended updated_at: a finished job
# is written here once, when it finishes, as before). Its literal statuses keep it out of
# every other query: the listings bind their status as a parameter, which the planners
# cannot match to a partial index.
Index(
    "ix_jobs_finished_type_status_updated",
    jobs.c.type,
    jobs.c.status,
    jobs.c.updated_at,
    sqlite_where=text("status IN ('completed', 'failed', 'cancelled')"),
    postgresql_where=text("status IN ('completed', 'failed', 'cancelled')"),
)
# The idempotency guard: one job per (producer, key). Partial (migration 0012): most jobs
# have no key, and an index entry they would never be looked up by is one more page written
# at every enqueue; the look-up asks for one key by equality, which implies the predicate.
Index("uq_jobs_producer_idempotency_key", jobs.c.producer, jobs.c.idempotency_key, unique=True,
      sqlite_where=text("idempotency_key IS NOT NULL"),
      postgresql_where=text("idempotency_key IS NOT NULL"))
# Unique jobs: one job per (producer, scope) among the jobs whose status is in their own
# `while` set. The predicate reads the row itself, so a transition that moves a job out of
# its while statuses frees its key in the same statement, with no code of its own. Holder
# look-ups repeat this text: both planners use a partial index only for a WHERE that
# implies the index's own.
UNIQUE_HOLDER_PREDICATE = (
    "unique_scope IS NOT NULL AND (unique_while & CASE status "
    + " ".join(f"WHEN '{status.value}' THEN {bit}" for status, bit in STATUS_BITS.items())
    + " ELSE 0 END) <> 0"
)
Index(
    "uq_jobs_producer_unique_scope",
    jobs.c.producer,
    jobs.c.unique_scope,
    unique=True,
    sqlite_where=text(UNIQUE_HOLDER_PREDICATE),
    postgresql_where=text(UNIQUE_HOLDER_PREDICATE),
)
# Listing a producer's or a worker's own jobs. There is deliberately no index on status
# alone: without statistics SQLite's planner prefers it for the claim's status = 'pending'
# and then sorts every pending row, where the partial index above needs no sort at all.
Index("ix_jobs_producer_id", jobs.c.producer, jobs.c.id)
# One job per schedule and slot, however many processes and hosts fire schedules: the
# database, not the firing code, is the last guard (app/schedules/service.py).
Index(
    "uq_jobs_schedule_scheduled_for",
    jobs.c.schedule,
    jobs.c.scheduled_for,
    unique=True,
    sqlite_where=text("schedule IS NOT NULL"),
    postgresql_where=text("schedule IS NOT NULL"),
)
# Listing the failed or the cancelled jobs in id order (GET /jobs?status=…, the dashboard's
# filters): a few thousand among a million stored are found at once rather than by walking
# every id. Partial, so that only a job entering or leaving those statuses writes them (never
# a claim or a completion), and matched only by a query that writes the status as a literal:
# the listing does, for these two statuses alone.
Index("ix_jobs_failed_id", jobs.c.id, sqlite_where=text("status = 'failed'"),
      postgresql_where=text("status = 'failed'"))
Index("ix_jobs_cancelled_id", jobs.c.id, sqlite_where=text("status = 'cancelled'"),
      postgresql_where=text("status = 'cancelled'"))
# A worker's jobs, for GET /jobs?worker_id=…; partial for the same reason (0012): no
# pending job has a worker, so an enqueue writes nothing here.
Index("ix_jobs_worker_id_id", jobs.c.worker_id, jobs.c.id,
      sqlite_where=text("worker_id IS NOT NULL"), postgresql_where=text("worker_id IS NOT NULL"))

# Jobs waiting for their dependencies, counted per type by GET /types from this index alone.
# Partial: only a job entering or leaving waiting writes it, never an enqueue without
# dependencies, a claim or a completion.
Index("ix_jobs_waiting_type", jobs.c.type, sqlite_where=text("status = 'waiting'"),
      postgresql_where=text("status = 'waiting'"))

# A fair type's claims read its pending jobs in round order (docs/FLOW-CONTROL.md): priority first,
# then the round, then (keys per producer, migration 0021) the round among its producer's
# keys, then claim order. Partial on the round: only a fair type's numbered pending jobs have
# one (>= 0), so no other enqueue writes here.
def fair_order_columns(table: Table) -> tuple[Any, ...]:
    """The jobs table's columns in a fair type's round order, for ORDER BY and the index that
    serves it."""
    c = table.c
    return (c.priority.desc(), c.fair_round, c.fair_key_round, c.created_at, c.id)


Index(
    "ix_jobs_fair_order",
    jobs.c.type,
    *fair_order_columns(jobs),
    jobs.c.run_at,
    sqlite_where=text("status = 'pending' AND fair_round >= 0"),
    postgresql_where=text("status = 'pending' AND fair_round >= 0"),
)
# A key's last round among its pending jobs: where its next job's round starts.
Index(
    "ix_jobs_fair_key",
    jobs.c.type,
    jobs.c.concurrency_key,
    jobs.c.fair_round,
    sqlite_where=text("status = 'pending' AND fair_round >= 0"),
    postgresql_where=text("status = 'pending' AND fair_round >= 0"),
)
# Where keys are per producer (migration 0021): a producer's key's last round among its
# producer's keys, and the producer's jobs in that order (where its next job's round starts).
Index(
    "ix_jobs_fair_producer_key",
    jobs.c.type,
    jobs.c.producer,
    jobs.c.concurrency_key,
    jobs.c.fair_key_round,
    sqlite_where=text("status = 'pending' AND fair_round >= 0"),
    postgresql_where=text("status = 'pending' AND fair_round >= 0"),
)
Index(
    "ix_jobs_fair_producer_order",
    jobs.c.type,
    jobs.c.producer,
    jobs.c.fair_key_round,
    jobs.c.id,
    jobs.c.fair_round,
    sqlite_where=text("status = 'pending' AND fair_round >= 0"),
    postgresql_where=text("status = 'pending' AND fair_round >= 0"),
)
# A fair type's jobs that were not due when they entered pending wait unnumbered (round -1)
# until they are: a claim of the type numbers those now due, in run_at order, at the round
# then served (app/jobs/tx/key_rules.py), so a key's jobs scheduled for later take their turns
# when they come due rather than with the rounds of when they were enqueued.
Index(
    "ix_jobs_fair_deferred",
    jobs.c.type,
    jobs.c.run_at,
    sqlite_where=text("status = 'pending' AND fair_round < 0"),
    postgresql_where=text("status = 'pending' AND fair_round < 0"),
)
# An ordered key's next job: its oldest waiting one (docs/FLOW-CONTROL.md). Waiting rows only.
Index(
    "ix_jobs_waiting_key",
    jobs.c.type,
    jobs.c.concurrency_key,
    jobs.c.id,
    sqlite_where=text("status = 'waiting' AND concurrency_key IS NOT NULL"),
    postgresql_where=text("status = 'waiting' AND concurrency_key IS NOT NULL"),
)
# The same per producer, where keys are (migration 0021): the first one serves types whose
# keys are shared.
Index(
    "ix_jobs_waiting_producer_key",
    jobs.c.type,
    jobs.c.producer,
    jobs.c.concurrency_key,
    jobs.c.id,
    sqlite_where=text("status = 'waiting' AND concurrency_key IS NOT NULL"),
    postgresql_where=text("status = 'waiting' AND concurrency_key IS NOT NULL"),
)

# Jobs with an expiry that no claim has taken yet: each claim cancels those past it
# (docs/JOBS.md, Expiry) through this index, which holds no other row.
Index(
    "ix_jobs_expires_at",
    jobs.c.expires_at,
    sqlite_where=text("status IN ('pending', 'waiting') AND expires_at IS NOT NULL"),
    postgresql_where=text("status IN ('pending', 'waiting') AND expires_at IS NOT NULL"),
)

# Suspended jobs, counted per type by GET /types from this index alone.
Index("ix_jobs_suspended_type", jobs.c.type, sqlite_where=text("status = 'suspended'"),
      postgresql_where=text("status = 'suspended'"))

# The reserved jobs of each type, which GET /types counts (docs/JOBS.md, Reserved jobs).
Index("ix_jobs_reserved_type", jobs.c.type,
      sqlite_where=text("status = 'reserved'"), postgresql_where=text("status = 'reserved'"))

# Pending jobs due later than they were made (delayed, retried, released with a backoff):
# the maintenance leader reads from it when the next one comes due, to wake the waiting
# claims then (docs/SCALING.md, "The database tells every host"). An immediate enqueue
# (run_at = created_at) writes nothing here.
Index(
    "ix_jobs_delayed_run_at",
    jobs.c.run_at,
    sqlite_where=text("status = 'pending' AND run_at > created_at"),
    postgresql_where=text("status = 'pending' AND run_at > created_at"),
)
