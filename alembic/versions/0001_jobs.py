"""The jobs table and the indexes the claim, the lease rescue and the listings read.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("type", sa.String(length=100), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("priority", sa.SmallInteger(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("retry_count", sa.Integer(), nullable=False),
        sa.Column("max_retries", sa.Integer(), nullable=False),
        sa.Column("producer", sa.String(length=100), nullable=False),
        sa.Column("idempotency_key", sa.String(length=255), nullable=True),
        sa.Column("request_fingerprint", sa.String(length=64), nullable=True),
        sa.Column("run_at", sa.BigInteger(), nullable=False),
        sa.Column("claimed_at", sa.BigInteger(), nullable=True),
        sa.Column("worker_id", sa.String(length=100), nullable=True),
        sa.Column("lease_expires_at", sa.BigInteger(), nullable=True),
        sa.Column("lease_token", sa.String(length=64), nullable=True),
        sa.Column("result", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    pending = sa.text("status = 'pending'")
    running = sa.text("status = 'running'")
    op.create_index(
        "ix_jobs_claim_order", "jobs",
        [sa.literal_column("priority DESC"), "created_at", "id"],
        sqlite_where=pending, postgresql_where=pending,
    )
    op.create_index(
        "ix_jobs_lease_expires_at", "jobs", ["lease_expires_at"],
        sqlite_where=running, postgresql_where=running,
    )
    op.create_index("uq_jobs_producer_idempotency_key", "jobs",
                    ["producer", "idempotency_key"], unique=True)
    op.create_index("ix_jobs_producer_id", "jobs", ["producer", "id"])
    op.create_index("ix_jobs_worker_id_id", "jobs", ["worker_id", "id"])


def downgrade() -> None:
    op.drop_table("jobs")
