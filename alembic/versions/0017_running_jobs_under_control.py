"""Running jobs under control (contract §17): deadlines, expiry, cancel requests, progress and
checkpoints.

- jobs.timeout_seconds and jobs.expires_at, which the claim reads (NULL: no limit, the
  behaviour of every earlier release), and ix_jobs_expires_at, the unclaimed jobs with an
  expiry, which each claim sweeps. No stored job has one, so it starts empty.
- job_controls: a job's cancel request, its last progress and its checkpoint, beside the job
  row (the claim never reads them). Starts empty. On PostgreSQL, fillfactor 70: a heartbeat
  rewrites its job's progress, no indexed column of it, so the update is HOT (in place, no
  index touched) while the page has room; and autovacuum after 2 % of it changed, as for the
  tables 0011 tuned.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
UNCLAIMED_WITH_EXPIRY = sa.text("status IN ('pending', 'waiting') AND expires_at IS NOT NULL")


def upgrade() -> None:
    # Nullable columns without a default: SQLite adds them without rewriting the table.
    op.add_column("jobs", sa.Column("timeout_seconds", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("expires_at", sa.BigInteger(), nullable=True))
    op.create_index("ix_jobs_expires_at", "jobs", ["expires_at"],
                    sqlite_where=UNCLAIMED_WITH_EXPIRY, postgresql_where=UNCLAIMED_WITH_EXPIRY)
    op.create_table(
        "job_controls",
        sa.Column("job_id", Id, nullable=False),
        sa.Column("cancel_requested_at", sa.BigInteger(), nullable=True),
        sa.Column("cancel_requested_by", sa.String(100), nullable=True),
        sa.Column("progress_done", sa.BigInteger(), nullable=True),
        sa.Column("progress_total", sa.BigInteger(), nullable=True),
        sa.Column("progress_message", sa.Text(), nullable=True),
        sa.Column("progress_at", sa.BigInteger(), nullable=True),
        sa.Column("checkpoint", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("job_id", name="pk_job_controls"),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE job_controls SET (fillfactor = 70, "
                   "autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000)")


def downgrade() -> None:
    # An older release knows no cancel requests: a running job whose cancel was asked for
    # runs to its end as any other would.
    op.drop_table("job_controls")
    op.drop_index("ix_jobs_expires_at", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("expires_at")
        batch.drop_column("timeout_seconds")
