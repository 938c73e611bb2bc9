"""Waits (docs/WAITS.md): a running job may suspend until a moment, an event or a waitpoint
token, holding no lease and no slot meanwhile.

- jobs.resumed: how the job's last wait ended, carried by its claims until it suspends again
  (NULL on every job that never waited, so nothing is written to the stored jobs).
- ix_jobs_suspended_type: GET /types counts the suspended jobs per type from it alone.
- uq_jobs_producer_unique_scope is made again with a predicate in which a suspended job holds
  its unique key as a running one does. No stored job is suspended before this revision, so
  the index holds exactly the rows it held.
- job_waits: each suspended job's wait (what it waits for, until when, how it ended), with
  ix_job_waits_until_at, where maintenance finds the next moment (a sleep's end, a timeout).
- posted_events: the events producers post, kept for a while (idempotency, early events).

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

# As app.storage.schema.UNIQUE_HOLDER_PREDICATE renders it before and from this revision; a
# migration keeps its own copies so that it still means what it meant when the code changes.
HOLDER_0015 = sa.text(
    "unique_scope IS NOT NULL AND (unique_while & CASE status "
    "WHEN 'waiting' THEN 1 WHEN 'pending' THEN 1 WHEN 'running' THEN 2 WHEN 'completed' THEN 4 "
    "WHEN 'failed' THEN 8 WHEN 'cancelled' THEN 16 ELSE 0 END) <> 0"
)
HOLDER_0026 = sa.text(
    "unique_scope IS NOT NULL AND (unique_while & CASE status "
    "WHEN 'waiting' THEN 1 WHEN 'pending' THEN 1 WHEN 'running' THEN 2 "
    "WHEN 'suspended' THEN 2 WHEN 'completed' THEN 4 "
    "WHEN 'failed' THEN 8 WHEN 'cancelled' THEN 16 ELSE 0 END) <> 0"
)
_SUSPENDED = sa.text("status = 'suspended'")


def _holder_index(predicate: sa.TextClause) -> None:
    op.drop_index("uq_jobs_producer_unique_scope", table_name="jobs")
    op.create_index("uq_jobs_producer_unique_scope", "jobs", ["producer", "unique_scope"],
                    unique=True, sqlite_where=predicate, postgresql_where=predicate)


def upgrade() -> None:
    op.add_column("jobs", sa.Column("resumed", sa.Text(), nullable=True))
    op.create_index("ix_jobs_suspended_type", "jobs", ["type"],
                    sqlite_where=_SUSPENDED, postgresql_where=_SUSPENDED)
    _holder_index(HOLDER_0026)
    op.create_table(
        "job_waits",
        sa.Column("job_id", Id, nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("producer", sa.String(100), nullable=True),
        sa.Column("event_name", sa.String(200), nullable=True),
        sa.Column("event_key", sa.String(255), nullable=True),
        sa.Column("token_hash", sa.String(64), nullable=True),
        sa.Column("until_at", sa.BigInteger(), nullable=False),
        sa.Column("suspended_at", sa.BigInteger(), nullable=False),
        sa.Column("resolved_by", sa.String(8), nullable=True),
        sa.Column("resolved_at", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_job_waits")),
    )
    unended = sa.text("resolved_at IS NULL")
    op.create_index("ix_job_waits_until_at", "job_waits", ["until_at"],
                    sqlite_where=unended, postgresql_where=unended)
    waiting = sa.text("kind = 'event' AND resolved_at IS NULL")
    op.create_index("ix_job_waits_event", "job_waits",
                    ["producer", "event_name", "event_key", "job_id"],
                    sqlite_where=waiting, postgresql_where=waiting)
    tokens = sa.text("token_hash IS NOT NULL")
    op.create_index("uq_job_waits_token_hash", "job_waits", ["token_hash"], unique=True,
                    sqlite_where=tokens, postgresql_where=tokens)
    op.create_table(
        "posted_events",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("producer", sa.String(100), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("event_key", sa.String(255), nullable=False),
        sa.Column("data", sa.Text(), nullable=True),
        sa.Column("idempotency_key", sa.String(255), nullable=True),
        sa.Column("posted_at", sa.BigInteger(), nullable=False),
        sa.Column("keep_until", sa.BigInteger(), nullable=False),
        sa.Column("woken", sa.Integer(), nullable=False),
        sa.Column("taken_by", Id, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_posted_events")),
        sqlite_autoincrement=True,
    )
    keyed = sa.text("idempotency_key IS NOT NULL")
    op.create_index("uq_posted_events_producer_idempotency_key", "posted_events",
                    ["producer", "idempotency_key"], unique=True,
                    sqlite_where=keyed, postgresql_where=keyed)
    kept = sa.text("woken = 0 AND taken_by IS NULL")
    op.create_index("ix_posted_events_kept", "posted_events",
                    ["producer", "name", "event_key", "id"],
                    sqlite_where=kept, postgresql_where=kept)
    op.create_index("ix_posted_events_keep_until", "posted_events", ["keep_until"])


def downgrade() -> None:
    # An older release knows no suspended job and would never run one: each becomes pending,
    # claimable at once, its wait forgotten (its handler runs again from its checkpoint).
    op.execute("UPDATE jobs SET status = 'pending' WHERE status = 'suspended'")
    op.drop_table("posted_events")
    op.drop_table("job_waits")
    _holder_index(HOLDER_0015)
    op.drop_index("ix_jobs_suspended_type", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("resumed")
