"""Job history: attempts, the timeline of events, and when each key was last seen.

One row per attempt; the job's events (docs/API.md, GET /jobs/{id}/events); key activity for
/workers.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "job_attempts",
        sa.Column("id", _Id, primary_key=True, autoincrement=True),
        sa.Column("job_id", _Id, nullable=False),
        sa.Column("number", sa.Integer, nullable=False),
        sa.Column("worker_id", sa.String(100), nullable=False),
        sa.Column("claimed_at", sa.BigInteger, nullable=False),
        sa.Column("ended_at", sa.BigInteger, nullable=True),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("error", sa.Text, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_job_attempts"),
    )
    op.create_index("uq_job_attempts_job_id_number", "job_attempts", ["job_id", "number"],
                    unique=True)
    op.create_table(
        "job_events",
        sa.Column("id", _Id, primary_key=True, autoincrement=True),
        sa.Column("job_id", _Id, nullable=False),
        sa.Column("at", sa.BigInteger, nullable=False),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("actor", sa.String(120), nullable=False),
        sa.Column("detail", sa.Text, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_job_events"),
    )
    op.create_index("ix_job_events_job_id_id", "job_events", ["job_id", "id"])
    op.create_table(
        "key_activity",
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("last_seen_at", sa.BigInteger, nullable=False),
        sa.Column("last_claim_at", sa.BigInteger, nullable=True),
        sa.PrimaryKeyConstraint("name", name="pk_key_activity"),
    )


def downgrade() -> None:
    op.drop_table("key_activity")
    op.drop_index("ix_job_events_job_id_id", table_name="job_events")
    op.drop_table("job_events")
    op.drop_index("uq_job_attempts_job_id_number", table_name="job_attempts")
    op.drop_table("job_attempts")
