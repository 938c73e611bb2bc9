"""Cascades of a job's end in bounded steps.

- dependency_cascades: the finished jobs whose edges are not all applied yet (a job's end
  applies a bounded share of them in its own transaction, maintenance the rest in bounded
  steps). Starts empty: every job finished before the upgrade had its edges applied in its
  own transaction.
- ix_job_dependencies_unresolved: the edges not yet applied, by dependency (partial: an
  applied edge leaves it), which each step of a cascade reads its next edges from.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "dependency_cascades",
        sa.Column("job_id", Id, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("queued_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name="pk_dependency_cascades"),
    )
    op.create_index("ix_job_dependencies_unresolved", "job_dependencies",
                    ["depends_on_id", "job_id"], sqlite_where=sa.text("resolved = 0"),
                    postgresql_where=sa.text("resolved = 0"))


def downgrade() -> None:
    op.drop_index("ix_job_dependencies_unresolved", table_name="job_dependencies")
    op.drop_table("dependency_cascades")
