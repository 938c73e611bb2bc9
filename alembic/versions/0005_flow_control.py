"""Flow control: per-type settings (pause, running caps, token-bucket rate) and the jobs'
concurrency_key, with the partial indexes the claim and GET /types read.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_types",
        sa.Column("type", sa.String(length=100), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("max_running", sa.Integer(), nullable=True),
        sa.Column("max_running_per_key", sa.Integer(), nullable=True),
        sa.Column("rate_per_second", sa.Float(), nullable=True),
        sa.Column("burst", sa.Integer(), nullable=True),
        sa.Column("tokens", sa.Float(), nullable=True),
        sa.Column("tokens_at", sa.BigInteger(), nullable=True),
        sa.Column("last_claim_at", sa.BigInteger(), nullable=True),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("type", name=op.f("pk_job_types")),
    )
    # A nullable column at the end: no table rewrite on either engine.
    op.add_column("jobs", sa.Column("concurrency_key", sa.String(length=255), nullable=True))
    running = sa.text("status = 'running'")
    op.create_index("ix_jobs_running_type_key", "jobs", ["type", "concurrency_key"],
                    sqlite_where=running, postgresql_where=running)
    finished = sa.text("status IN ('completed', 'failed', 'cancelled')")
    op.create_index("ix_jobs_finished_type_status", "jobs", ["type", "status"],
                    sqlite_where=finished, postgresql_where=finished)
    # The per-type claim order gains run_at at its end (see app/db.py).
    op.drop_index("ix_jobs_claim_order_by_type", table_name="jobs")
    _claim_order_by_type(["type", sa.literal_column("priority DESC"), "created_at", "id",
                          "run_at"])


def downgrade() -> None:
    op.drop_index("ix_jobs_finished_type_status", table_name="jobs")
    op.drop_index("ix_jobs_claim_order_by_type", table_name="jobs")
    _claim_order_by_type(["type", sa.literal_column("priority DESC"), "created_at", "id"])
    op.drop_index("ix_jobs_running_type_key", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("concurrency_key")
    op.drop_table("job_types")


def _claim_order_by_type(columns: list[object]) -> None:
    pending = sa.text("status = 'pending'")
    op.create_index("ix_jobs_claim_order_by_type", "jobs", columns,
                    sqlite_where=pending, postgresql_where=pending)
