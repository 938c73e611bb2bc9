"""What suspended jobs wait for, and the events producers post (docs/WAITS.md). Beside the
jobs table: only a job that suspends writes here. A suspended job's moment (its sleep's end
or its wait's timeout) is its wait's until_at, not its row's run_at: a million future run_at
values would skew PostgreSQL's estimate of the claim's `run_at <= now`."""

from __future__ import annotations

from sqlalchemy import Column, Index, Integer, String, Table, Text, text

from app.storage.schema.base import Id, Micros, metadata

# One row per job that ever suspended: its current (or last) wait. `kind` is time, event or
# token; an event wait names its producer (events are the producer's own), name and key; a
# token wait keeps the token's SHA-256 alone (the token is shown once, in the suspend's
# answer). Resolved once, by whichever of the moment, the event, the token or the timeout
# came first (`resolved_by`, `resolved_at`): a token answered twice is told when the first
# was. The job's next suspend replaces the row; retention removes it with its job.
job_waits = Table(
    "job_waits",
    metadata,
    Column("job_id", Id, primary_key=True),
    Column("kind", String(8), nullable=False),
    Column("producer", String(100), nullable=True),
    Column("event_name", String(200), nullable=True),
    Column("event_key", String(255), nullable=True),
    Column("token_hash", String(64), nullable=True),
    Column("until_at", Micros, nullable=False),
    Column("suspended_at", Micros, nullable=False),
    Column("resolved_by", String(8), nullable=True),
    Column("resolved_at", Micros, nullable=True),
)
# An event's waiters: the unresolved event waits of a producer's name and key.
Index("ix_job_waits_event", job_waits.c.producer, job_waits.c.event_name,
      job_waits.c.event_key, job_waits.c.job_id,
      sqlite_where=text("kind = 'event' AND resolved_at IS NULL"),
      postgresql_where=text("kind = 'event' AND resolved_at IS NULL"))
# The waits by their moment (a sleep's end, a timeout), while they last: maintenance reads
# the next one from here (docs/WAITS.md).
Index("ix_job_waits_until_at", job_waits.c.until_at,
      sqlite_where=text("resolved_at IS NULL"), postgresql_where=text("resolved_at IS NULL"))
# A token is looked up by its hash alone, and names one wait.
Index("uq_job_waits_token_hash", job_waits.c.token_hash, unique=True,
      sqlite_where=text("token_hash IS NOT NULL"),
      postgresql_where=text("token_hash IS NOT NULL"))

# Every event posted, for QUEUELOG_EVENT_KEEP_SECONDS: an Idempotency-Key makes a re-sent
# event the same one (its first answer is given again), and an event that woke nobody is kept
# for the first wait for it (`taken_by`, once one took it). `woken`: how many waits it ended.
posted_events = Table(
    "posted_events",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("producer", String(100), nullable=False),
    Column("name", String(200), nullable=False),
    Column("event_key", String(255), nullable=False),
    Column("data", Text, nullable=True),
    Column("idempotency_key", String(255), nullable=True),
    Column("posted_at", Micros, nullable=False),
    Column("keep_until", Micros, nullable=False),
    Column("woken", Integer, nullable=False),
    Column("taken_by", Id, nullable=True),
    sqlite_autoincrement=True,
)
Index("uq_posted_events_producer_idempotency_key", posted_events.c.producer,
      posted_events.c.idempotency_key, unique=True,
      sqlite_where=text("idempotency_key IS NOT NULL"),
      postgresql_where=text("idempotency_key IS NOT NULL"))
# The events kept for a later wait, oldest first per producer, name and key.
Index("ix_posted_events_kept", posted_events.c.producer, posted_events.c.name,
      posted_events.c.event_key, posted_events.c.id,
      sqlite_where=text("woken = 0 AND taken_by IS NULL"),
      postgresql_where=text("woken = 0 AND taken_by IS NULL"))
# What maintenance removes once kept long enough.
Index("ix_posted_events_keep_until", posted_events.c.keep_until)
