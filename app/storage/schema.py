"""The schema: one MetaData for the code and Alembic, its tables and the indexes the
claim and the reads are planned on."""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    text,
)

from app.core.statuses import CLAIM_ORDER, STATUS_BITS

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

T = TypeVar("T")

metadata = MetaData(naming_convention=NAMING_CONVENTION)

# SQLite only makes INTEGER PRIMARY KEY an alias of the rowid; PostgreSQL gets a bigint.
Id = BigInteger().with_variant(Integer(), "sqlite")
Micros = BigInteger  # microseconds since the epoch, see app.core.clock

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

# -- checkpoints (docs/JOBS.md) -----------------------------------------------------------------
# Beside the jobs table: a checkpoint may be as large as a payload, and most jobs never save
# one. The claim reads it for the job it hands out (one look-up by key, inside its UPDATE).
job_checkpoints = Table(
    "job_checkpoints",
    metadata,
    Column("job_id", Id, primary_key=True),
    Column("checkpoint", Text, nullable=False),
    Column("saved_at", Micros, nullable=False),
)

# The reserved jobs of each type, which GET /types counts (docs/JOBS.md, Reserved jobs).
Index("ix_jobs_reserved_type", jobs.c.type,
      sqlite_where=text("status = 'reserved'"), postgresql_where=text("status = 'reserved'"))

# -- reserved jobs (docs/JOBS.md) --------------------------------------------------------------
# A reservation of each job reserved, kept once it is resolved (its outcome, for a repeat of
# the confirm or release that resolved it). `check_url` is the reserve's own or its
# producer key's, as they were at the reserve; without one the ticker releases the job at
# `confirm_by`, with one the dispatcher asks it from then on, at `next_check_at`.
job_reservations = Table(
    "job_reservations",
    metadata,
    Column("job_id", Id, primary_key=True),
    Column("confirm_by", Micros, nullable=False),
    Column("check_url", Text, nullable=True),
    Column("checks", Integer, nullable=False),
    Column("next_check_at", Micros, nullable=False),
    Column("outcome", String(16), nullable=True),
    Column("resolved_at", Micros, nullable=True),
)
# The unresolved reservations, soonest due first: what the ticker and the dispatcher read.
Index("ix_job_reservations_due", job_reservations.c.next_check_at,
      sqlite_where=text("outcome IS NULL"), postgresql_where=text("outcome IS NULL"))

# -- ordered keys (docs/FLOW-CONTROL.md): the one job of each key whose turn it is -----------------
# One row per (type, producer, key) of an ordered type while the key has a job that is not
# finished, or a failed one that blocks it: `job_id` is the job whose turn it is (pending,
# running, waiting for its dependencies, or failed and `blocked`); the key's later jobs wait.
# `producer` is the producer key that enqueued the key's jobs, '' where the type's keys are
# shared (migration 0021). Every change of a key's turn takes this row's lock first
# (app/jobs/tx/key_rules.py).
key_turns = Table(
    "key_turns",
    metadata,
    Column("type", String(100), primary_key=True),
    Column("producer", String(100), primary_key=True),
    Column("concurrency_key", String(255), primary_key=True),
    Column("job_id", Id, nullable=False),
    Column("blocked", SmallInteger, nullable=False),
    Column("since", Micros, nullable=False),
)
Index("ix_key_turns_job_id", key_turns.c.job_id)
Index("ix_key_turns_blocked", key_turns.c.blocked, key_turns.c.type,
      key_turns.c.concurrency_key, sqlite_where=text("blocked = 1"),
      postgresql_where=text("blocked = 1"))

# -- workflows (docs/WORKFLOWS.md): dependencies between jobs, and the graphs enqueued together ---
# Kept beside the jobs table, not on it: the claim never reads them, so a job row stays as
# narrow as it was, and a job without dependencies has no row here at all.

# One row per (dependent job, dependency): `position` keeps depends_on's order. `resolved` is
# set once the dependency has finished and been applied to the dependent (released, counted,
# or cancelled): each edge is applied once, whatever the dependency does later (an admin's
# retry of a failed dependency revives nothing). `cancel_on_failure` is the dependent's
# on_dependency_failure, on each of its edges, where the dependency's end reads it.
job_dependencies = Table(
    "job_dependencies",
    metadata,
    Column("job_id", Id, primary_key=True),
    Column("position", SmallInteger, primary_key=True),
    Column("depends_on_id", Id, nullable=False),
    Column("cancel_on_failure", SmallInteger, nullable=False),
    Column("resolved", SmallInteger, nullable=False),
)
# A finishing job finds the edges that wait on it (each job's end probes this index once),
# and purge asks whether any unfinished job still depends on a job.
Index("ix_job_dependencies_depends_on_id", job_dependencies.c.depends_on_id,
      job_dependencies.c.job_id)
# The edges not yet applied, by dependency: a step of a cascade reads the next ones here
# (in the index above it would step over every edge applied before it, each step again).
Index("ix_job_dependencies_unresolved", job_dependencies.c.depends_on_id,
      job_dependencies.c.job_id, sqlite_where=text("resolved = 0"),
      postgresql_where=text("resolved = 0"))

# Jobs whose end has edges left to apply: a job's end applies a bounded share of its edges in
# its own transaction, and the rest (many dependents, a long chain of cancels) in bounded
# steps of maintenance (app/jobs/usecases/cascades.py). `status` is the one the job ended
# with, which its remaining edges apply whatever the job does later; `queued_at` says since
# when the cascade has been under way. A job without such edges (nearly every job) has no row here.
dependency_cascades = Table(
    "dependency_cascades",
    metadata,
    Column("job_id", Id, primary_key=True),
    Column("status", String(16), nullable=False),
    Column("queued_at", Micros, nullable=False),
)

workflows = Table(
    "workflows",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("name", String(100), nullable=True),
    Column("producer", String(100), nullable=False),
    Column("idempotency_key", String(255), nullable=True),
    Column("request_fingerprint", String(64), nullable=True),
    Column("created_at", Micros, nullable=False),
    sqlite_autoincrement=True,
)
# A workflow's Idempotency-Key, per producer, as for jobs.
Index("uq_workflows_producer_idempotency_key", workflows.c.producer,
      workflows.c.idempotency_key, unique=True,
      sqlite_where=text("idempotency_key IS NOT NULL"),
      postgresql_where=text("idempotency_key IS NOT NULL"))
Index("ix_workflows_producer_id", workflows.c.producer, workflows.c.id)

# A workflow's jobs by ref, in request order (`position`). `met` (1) marks a job the workflow
# did not create: its item met a stored job (an idempotency replay, a unique twin), which the
# workflow counts and waits on but never cancels.
workflow_jobs = Table(
    "workflow_jobs",
    metadata,
    Column("workflow_id", Id, primary_key=True),
    Column("position", SmallInteger, primary_key=True),
    Column("ref", String(100), nullable=False),
    Column("job_id", Id, nullable=False),
    Column("met", SmallInteger, nullable=False),
)
Index("ix_workflow_jobs_job_id", workflow_jobs.c.job_id)

# One row per job type whose settings were ever changed (a type without a row has the
# defaults: not paused, no limits). The token bucket's state lives on the row, so that every
# claim of a rate-limited type reads and spends it under the row's lock.
job_types = Table(
    "job_types",
    metadata,
    Column("type", String(100), primary_key=True),
    Column("paused", Boolean, nullable=False),
    Column("max_running", Integer, nullable=True),
    Column("max_running_per_key", Integer, nullable=True),
    Column("rate_per_second", Float, nullable=True),
    Column("burst", Integer, nullable=True),  # NULL: ceil(rate_per_second), at least 1
    Column("tokens", Float, nullable=True),  # the bucket as of tokens_at
    Column("tokens_at", Micros, nullable=True),
    Column("last_claim_at", Micros, nullable=True),
    Column("updated_at", Micros, nullable=False),
    # Push delivery (migration 0009): a push type while push_url is set. The url is stored
    # as the admin gave it, credentials included, and shown only redacted; the secret (the
    # HMAC key of every delivery's signature) is shown once, when it is made.
    Column("push_url", Text, nullable=True),
    Column("push_timeout_seconds", Integer, nullable=True),
    Column("push_secret", String(64), nullable=True),
    # Fair share and ordered keys (migration 0016, docs/FLOW-CONTROL.md): 'key' or NULL each, and
    # what a failed job does to its ordered key ('skip' or 'block'; NULL: skip).
    Column("fairness", String(8), nullable=True),
    Column("ordering", String(8), nullable=True),
    Column("on_failure", String(8), nullable=True),
    # Retention (migration 0019, docs/OPERATIONS.md): how long the type's finished jobs of each
    # status are kept, in seconds; NULL: the QUEUELOG_RETENTION_… default; 0: for ever.
    Column("retention_completed_seconds", Integer, nullable=True),
    Column("retention_failed_seconds", Integer, nullable=True),
    Column("retention_cancelled_seconds", Integer, nullable=True),
    # Keys per producer (migration 0021): 'shared' makes one (type, key) the same key for
    # every producer; NULL: each producer's keys are its own.
    Column("key_scope", String(8), nullable=True),
)

# No AUTOINCREMENT here: a key's row is never deleted (revocation keeps it, so that its name
# is never reused), hence its id is never freed; and the id is shown nowhere.
api_keys = Table(
    "api_keys",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("name", String(100), nullable=False, unique=True),
    Column("role", String(16), nullable=False),
    Column("token_digest", String(64), nullable=False, unique=True),
    Column("max_priority", SmallInteger, nullable=False),
    Column("job_types", Text, nullable=True),  # comma-separated; NULL means every type
    Column("created_at", Micros, nullable=False),
    Column("revoked_at", Micros, nullable=True),
    # Appended by migration 0018 (reserved jobs): a producer key's check url, asked about its
    # reservations left unanswered, and the secret its checks are signed with (kept to sign,
    # as a push type's secret is; shown once, by `queuelog keys check-secret`).
    Column("check_url", Text, nullable=True),
    Column("check_secret", String(64), nullable=True),
)


# -- history (app/jobs/timeline): attempts and events, written in the job's own transactions
# No foreign keys to jobs: `queuelog purge` deletes a job's history with it, in the same
# transaction, and a rebuild of the jobs table (SQLite batch migrations) stays free of them.

job_attempts = Table(
    "job_attempts",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("job_id", Id, nullable=False),
    Column("number", Integer, nullable=False),  # 1, 2, … per job
    Column("worker_id", String(100), nullable=False),
    Column("claimed_at", Micros, nullable=False),
    Column("ended_at", Micros, nullable=True),
    Column("outcome", String(16), nullable=False),
    Column("error", Text, nullable=True),
    # The failure group of an attempt that ended with an error (migration 0019): what its
    # group's chart counts and its retry finds the jobs by.
    Column("fingerprint", String(16), nullable=True),
)
# A job's attempts in order; closing an attempt finds the job's open one through it too.
Index("uq_job_attempts_job_id_number", job_attempts.c.job_id, job_attempts.c.number,
      unique=True)
# A failure group's attempts in time order (its chart, its newest jobs). Partial: an attempt
# that completes, and every claim, writes nothing here.
Index("ix_job_attempts_fingerprint_ended_at", job_attempts.c.fingerprint,
      job_attempts.c.ended_at, sqlite_where=text("fingerprint IS NOT NULL"),
      postgresql_where=text("fingerprint IS NOT NULL"))

# Failure groups (docs/OPERATIONS.md): per type, the failed attempts whose errors share a
# fingerprint (app/core/fingerprint.py), kept up to date by the failing transactions
# themselves, so that GET /failures reads a few rows rather than scanning attempts.
failure_groups = Table(
    "failure_groups",
    metadata,
    Column("type", String(100), primary_key=True),
    Column("fingerprint", String(16), primary_key=True),
    Column("sample", Text, nullable=False),  # the newest error of the group, redacted
    Column("count", BigInteger, nullable=False),  # failed attempts
    Column("jobs_failed", BigInteger, nullable=False),  # jobs that ended failed with it
    Column("first_seen", Micros, nullable=False),
    Column("last_seen", Micros, nullable=False),
)
Index("ix_failure_groups_last_seen", failure_groups.c.last_seen)

# -- tags and trace context (docs/API.md) -------------------------------------------------------
# Beside the jobs table, as checkpoints are: most jobs have neither, and the claim never reads
# a tag. A job without tags writes no row here; GET /jobs?tag= walks (tag, job_id) newest
# first, the order of the listing.
job_tags = Table(
    "job_tags",
    metadata,
    Column("job_id", Id, primary_key=True),
    Column("tag", String(64), primary_key=True),
)
Index("ix_job_tags_tag_job_id", job_tags.c.tag, job_tags.c.job_id)

# The W3C trace context the job was enqueued with (a job sent without one has no row): the
# claim reads it for the job it hands out by key, inside its UPDATE, as it reads a checkpoint.
job_traces = Table(
    "job_traces",
    metadata,
    Column("job_id", Id, primary_key=True),
    Column("traceparent", String(55), nullable=False),
    Column("tracestate", String(512), nullable=True),
)

# -- the queue over time (docs/OPERATIONS.md) ------------------------------------------------------
# Per type and minute (`minute`: the minute's first microsecond), what the job transactions
# counted: each process adds its committed transactions' counts about once a second
# (app/jobs/timeline/stats_buffer.py). On PostgreSQL a process adds to the row of its own
# `slot`, so that processes seldom wait on one row's lock; a read sums the slots.
job_stats = Table(
    "job_stats",
    metadata,
    Column("type", String(100), primary_key=True),
    Column("minute", Micros, primary_key=True),
    Column("slot", SmallInteger, primary_key=True),
    Column("enqueued", BigInteger, nullable=False),
    Column("claimed", BigInteger, nullable=False),
    Column("completed", BigInteger, nullable=False),
    Column("failed", BigInteger, nullable=False),
)
# Every type's minutes at once (the overview), and the ticker's removal of the old ones.
Index("ix_job_stats_minute", job_stats.c.minute)

# Per type and minute, the pending jobs the ticker counted in that minute (the last count of
# the minute wins).
job_depth = Table(
    "job_depth",
    metadata,
    Column("type", String(100), primary_key=True),
    Column("minute", Micros, primary_key=True),
    Column("pending", BigInteger, nullable=False),
)
Index("ix_job_depth_minute", job_depth.c.minute)

job_events = Table(
    "job_events",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("job_id", Id, nullable=False),
    Column("at", Micros, nullable=False),
    Column("event", String(32), nullable=False),
    Column("actor", String(120), nullable=False),
    Column("detail", Text, nullable=True),  # compact JSON object
)
Index("ix_job_events_job_id_id", job_events.c.job_id, job_events.c.id)

# -- schedules (app/schedules): cron schedules that enqueue jobs -----------------------------

schedules = Table(
    "schedules",
    metadata,
    Column("name", String(100), primary_key=True),
    Column("cron", String(200), nullable=False),
    Column("timezone", String(64), nullable=False),
    Column("job", Text, nullable=False),  # the job template: compact JSON of a POST /jobs body
    Column("catch_up", String(8), nullable=False),
    Column("paused", Boolean, nullable=False),
    # The next slot to fire; a slot is due once the clock reaches it. Firing moves it on in the
    # same transaction that inserts the slot's job, the row locked (or SQLite's write lock
    # held). A paused schedule's is left as it was: resuming computes it again.
    Column("next_run_at", Micros, nullable=False),
    Column("last_run_at", Micros, nullable=True),  # the newest slot enqueued
    Column("last_job_id", Id, nullable=True),
    Column("created_at", Micros, nullable=False),
    Column("updated_at", Micros, nullable=False),
    # The trace context of the request that created the schedule (docs/TRACING.md): every job
    # it enqueues carries it.
    Column("traceparent", String(55), nullable=True),
    Column("tracestate", String(512), nullable=True),
)
# Each server process asks for the due schedules about twice a second: an index read of the
# active ones alone, in firing order (migration 0014), never walking past the paused ones.
Index("ix_schedules_due", schedules.c.paused, schedules.c.next_run_at, schedules.c.name)

# When each key last claimed or reported, to a minute: written at most once a minute per key
# and process (app/jobs/timeline/recorder.py), never once per heartbeat.
key_activity = Table(
    "key_activity",
    metadata,
    Column("name", String(100), primary_key=True),
    Column("last_seen_at", Micros, nullable=False),
    Column("last_claim_at", Micros, nullable=True),
)

# The dashboard's signed-in sessions (section 14), one row each. The browser's cookie holds a
# random id; only its SHA-256 digest is kept here, as for API tokens: nothing readable from the
# database lets anyone present a session, and deleting the row (sign-out, the key revoked,
# expiry) ends it. The CSRF secret is derived from the id (app/ui/session.py), never stored.
ui_sessions = Table(
    "ui_sessions",
    metadata,
    Column("id_digest", String(64), primary_key=True),
    Column("key_id", BigInteger, nullable=False),
    Column("created_at", Micros, nullable=False),
    Column("expires_at", Micros, nullable=False),
    # What a page leaves for the next one (Flask's flashed messages), as JSON.
    Column("data", Text, nullable=False),
)
# Sign-out of every session of a revoked key, and the purge of expired ones.
Index("ix_ui_sessions_key_id", ui_sessions.c.key_id)
Index("ix_ui_sessions_expires_at", ui_sessions.c.expires_at)

# Failed dashboard sign-ins per fixed window, by scope (one client address, or every client):
# kept in the database so that every gunicorn process and host throttles against one count.
ui_sign_in_failures = Table(
    "ui_sign_in_failures",
    metadata,
    Column("scope", String(100), primary_key=True),
    Column("window_start", Micros, nullable=False),
    Column("failures", Integer, nullable=False),
)
