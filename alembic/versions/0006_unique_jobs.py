"""Unique jobs: each job's unique key, its scope digest and the statuses in which it holds it,
with the partial unique index that enforces one holder per (producer, scope).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# As app.db.UNIQUE_HOLDER_PREDICATE renders it today; a migration keeps its own copy so that
# it still means what it meant when a later revision changes the code.
HOLDER = sa.text(
    "unique_scope IS NOT NULL AND (unique_while & CASE status "
    "WHEN 'pending' THEN 1 WHEN 'running' THEN 2 WHEN 'completed' THEN 4 "
    "WHEN 'failed' THEN 8 WHEN 'cancelled' THEN 16 ELSE 0 END) <> 0"
)


def upgrade() -> None:
    # Appended at the end of the table, nullable: no table rebuild on either engine.
    op.add_column("jobs", sa.Column("unique_key", sa.String(255), nullable=True))
    op.add_column("jobs", sa.Column("unique_scope", sa.String(64), nullable=True))
    op.add_column("jobs", sa.Column("unique_while", sa.SmallInteger(), nullable=True))
    op.create_index("uq_jobs_producer_unique_scope", "jobs", ["producer", "unique_scope"],
                    unique=True, sqlite_where=HOLDER, postgresql_where=HOLDER)


def downgrade() -> None:
    op.drop_index("uq_jobs_producer_unique_scope", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("unique_while")
        batch.drop_column("unique_scope")
        batch.drop_column("unique_key")
