"""The claim order within each type, for claims limited to some types.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pending = sa.text("status = 'pending'")
    op.create_index(
        "ix_jobs_claim_order_by_type", "jobs",
        ["type", sa.literal_column("priority DESC"), "created_at", "id"],
        sqlite_where=pending, postgresql_where=pending,
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_claim_order_by_type", table_name="jobs")
