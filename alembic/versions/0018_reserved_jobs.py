"""Reserved jobs (docs/JOBS.md): a job stored by a producer's reserve, pending once confirmed,
cancelled once released, resolved by its check url or its deadline when left unanswered.

- job_reservations: each reserved job's deadline, check url and checks, kept once resolved
  (its outcome answers a repeat of the confirm or release). Starts empty.
- ix_jobs_reserved_type: the reserved jobs of each type (GET /types counts them), a partial
  index that holds no other row.
- api_keys.check_url and api_keys.check_secret: a producer key's check, NULL for every key
  stored before (no check: its reservations are released at their deadline).

The status 'reserved' needs no change of the table: status is a string column, and the
unique index's predicate gives a reserved job no bit (a reserve names no unique key).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
RESERVED_ROWS = sa.text("status = 'reserved'")
UNRESOLVED = sa.text("outcome IS NULL")


def upgrade() -> None:
    op.create_table(
        "job_reservations",
        sa.Column("job_id", Id, nullable=False),
        sa.Column("confirm_by", sa.BigInteger(), nullable=False),
        sa.Column("check_url", sa.Text(), nullable=True),
        sa.Column("checks", sa.Integer(), nullable=False),
        sa.Column("next_check_at", sa.BigInteger(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=True),
        sa.Column("resolved_at", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("job_id", name="pk_job_reservations"),
    )
    op.create_index("ix_job_reservations_due", "job_reservations", ["next_check_at"],
                    sqlite_where=UNRESOLVED, postgresql_where=UNRESOLVED)
    op.create_index("ix_jobs_reserved_type", "jobs", ["type"],
                    sqlite_where=RESERVED_ROWS, postgresql_where=RESERVED_ROWS)
    # Nullable columns without a default: SQLite adds them without rewriting the table.
    op.add_column("api_keys", sa.Column("check_url", sa.Text(), nullable=True))
    op.add_column("api_keys", sa.Column("check_secret", sa.String(64), nullable=True))


def downgrade() -> None:
    # An older release knows no reserved job: one still unresolved is released (cancelled),
    # as its deadline would have done.
    op.execute("UPDATE jobs SET status = 'cancelled' WHERE status = 'reserved'")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("check_secret")
        batch.drop_column("check_url")
    op.drop_index("ix_jobs_reserved_type", table_name="jobs")
    op.drop_index("ix_job_reservations_due", table_name="job_reservations")
    op.drop_table("job_reservations")
