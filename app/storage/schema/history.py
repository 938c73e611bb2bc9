"""A job's history and the queue over time: attempts, failure groups, events, stats and
depth."""

from __future__ import annotations

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

from app.storage.schema.base import Id, Micros, metadata

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
    # The instance label its claim sent (migration 0030), as the job's row held it; NULL
    # when it sent none.
    Column("worker_instance", String(200), nullable=True),
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

# Per type, second and process slot, what the job transactions of the types with a circuit
# breaker or a retry budget ended and started (migration 0028): each process adds its counts
# about once a second, sooner after failures (app/types/protection/tallies.py), so that no
# job's request writes more, and the breaker's and the budget's windows (10 s to an hour)
# read them summed.
type_tallies = Table(
    "type_tallies",
    metadata,
    Column("type", String(100), primary_key=True),
    Column("second", BigInteger, primary_key=True),
    Column("slot", SmallInteger, primary_key=True),
    Column("finished", BigInteger, nullable=False),  # attempts that ended (completed or failed)
    Column("failed", BigInteger, nullable=False),
    Column("started_first", BigInteger, nullable=False),  # claims of a job's first attempt
)
Index("ix_type_tallies_second", type_tallies.c.second)

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
