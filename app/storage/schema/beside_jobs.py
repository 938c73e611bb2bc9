"""The tables beside the jobs table, each for what few jobs carry: checkpoints,
reservations, ordered keys' turns, dependencies and workflows, tags and trace context."""

from __future__ import annotations

from sqlalchemy import (
    Column,
    Index,
    Integer,
    SmallInteger,
    String,
    Table,
    Text,
    text,
)

from app.storage.schema.base import Id, Micros, metadata

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
