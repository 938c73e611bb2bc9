"""What operators and admins set: the job types' settings, the API keys, cron schedules,
the keys' last activity and the dashboard's sessions."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    SmallInteger,
    String,
    Table,
    Text,
)

from app.storage.schema.base import Id, Micros, metadata

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
    # A type that protects itself (migration 0028, docs/FLOW-CONTROL.md): its circuit breaker
    # and retry budget (compact JSON; NULL: off); where its circuit stands (NULL: closed, else
    # 'open' or 'half_open'), since when and opened by which failure group (JSON); and the
    # retry budget's schedule (when the next retry held back may run).
    Column("circuit", Text, nullable=True),
    Column("circuit_state", String(9), nullable=True),
    Column("circuit_since", Micros, nullable=True),
    Column("circuit_opened_by", Text, nullable=True),
    Column("retry_budget", Text, nullable=True),
    Column("retry_budget_at", Micros, nullable=True),
    # Priority aging (migration 0029, docs/FLOW-CONTROL.md): a pending job of the type is
    # claimed as if its priority rose one level per this many seconds (NULL: off).
    Column("aging_seconds", Integer, nullable=True),
)

# Per push origin (scheme://host:port), the deliveries the dispatcher lets run at once now:
# `cap` is its types' cap, `concurrency` what it has adapted to (halved on a 429, a 503 or a
# timeout, grown back by one per window of successes), `held_until` the end of the origin's
# last Retry-After (docs/PUSH.md, "Adaptive concurrency"). Written by the dispatcher when the
# figure changes; GET /types shows it.
push_origins = Table(
    "push_origins",
    metadata,
    Column("origin", String(300), primary_key=True),
    Column("concurrency", Integer, nullable=False),
    Column("cap", Integer, nullable=False),
    Column("held_until", Micros, nullable=True),
    Column("updated_at", Micros, nullable=False),
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

# Each key's instances (migration 0030): the labels its workers send with their claims and
# heartbeats, shown as reported. Counted in each process's memory and written at most once a
# minute per key, label and process (app/jobs/timeline/instances.py), never once per request:
# when last seen and last claimed, to about a minute, and the jobs claimed in one whole
# minute (`minute`, its first microsecond), the sum of what each process counted of it.
# Forgotten a day after they were last seen.
worker_instances = Table(
    "worker_instances",
    metadata,
    Column("name", String(100), primary_key=True),
    Column("instance", String(200), primary_key=True),
    Column("last_seen_at", Micros, nullable=False),
    Column("last_claim_at", Micros, nullable=True),
    Column("minute", Micros, nullable=True),
    Column("claimed", Integer, nullable=False),
)
Index("ix_worker_instances_last_seen_at", worker_instances.c.last_seen_at)

# The processes whose requests wait for jobs, each until when and for what (PostgreSQL with
# notices: docs/SCALING.md, "The database tells every host"). The jobs' triggers send a notice
# only while a row here waits for it: an enqueue of a type nobody waits for takes no notice
# lock at its commit.
# Unlogged on PostgreSQL (migration 0025): lost in a crash, rewritten by the next wait.
job_waiters = Table(
    "job_waiters",
    metadata,
    Column("waiter", String(200), primary_key=True),
    # 'claims' (its waiting claims, of `types`: comma-separated, NULL for any) or 'reads'
    # (its reads waiting for a job's end, of any type).
    Column("waits_for", String(8), primary_key=True),
    Column("types", Text, nullable=True),
    Column("until_at", Micros, nullable=False),
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
