"""The dashboard: its session secret, and indexes for listing the failed and cancelled jobs.

service_secrets: one row per named secret; the first process to need one inserts it unless a
row is there already, and every process then reads the row that won (section 14).
ix_jobs_failed_id, ix_jobs_cancelled_id: partial indexes of those jobs' ids, so that a filter on
them (a few thousand among a million) finds its rows at once.

Revision ID: 0010
Revises: 0007
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "service_secrets",
        sa.Column("name", sa.String(40), nullable=False),
        sa.Column("value", sa.String(200), nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_service_secrets"),
    )
    for status in ("failed", "cancelled"):
        where = sa.text(f"status = '{status}'")
        op.create_index(f"ix_jobs_{status}_id", "jobs", ["id"], sqlite_where=where,
                        postgresql_where=where)


def downgrade() -> None:
    for status in ("failed", "cancelled"):
        op.drop_index(f"ix_jobs_{status}_id", table_name="jobs")
    op.drop_table("service_secrets")
