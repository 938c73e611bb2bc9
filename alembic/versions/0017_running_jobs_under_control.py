"""Running jobs under control (docs/JOBS.md): deadlines, expiry, cancel requests, progress and
checkpoints.

- jobs.timeout_seconds and jobs.expires_at, which the claim reads (NULL: no limit, the
  behaviour of every earlier release), and ix_jobs_expires_at, the unclaimed jobs with an
  expiry, which each claim sweeps. No stored job has one, so it starts empty.
- jobs.cancel_requested_at/_by and jobs.progress_done/_total/_message/_at: a running job's
  cancel request and last progress, which the claim never reads; on the row, since a
  heartbeat rewrites it anyway (its progress then costs no page more).
- job_checkpoints: a job's last checkpoint, beside the row. Starts empty. On PostgreSQL,
  fillfactor 70: a checkpoint saved again rewrites no indexed column, so the update is HOT
  (in place, no index touched) while the page has room; and autovacuum after 2 % of it
  changed, as for the tables 0011 tuned.

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
CONTROL_COLUMNS = (("cancel_requested_at", sa.BigInteger()),
                   ("cancel_requested_by", sa.String(100)),
                   ("progress_done", sa.BigInteger()), ("progress_total", sa.BigInteger()),
                   ("progress_message", sa.Text()), ("progress_at", sa.BigInteger()))
UNCLAIMED_WITH_EXPIRY = sa.text("status IN ('pending', 'waiting') AND expires_at IS NOT NULL")


def upgrade() -> None:
    # Nullable columns without a default: SQLite adds them without rewriting the table.
    op.add_column("jobs", sa.Column("timeout_seconds", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("expires_at", sa.BigInteger(), nullable=True))
    for name, kind in CONTROL_COLUMNS:
        op.add_column("jobs", sa.Column(name, kind, nullable=True))
    op.create_index("ix_jobs_expires_at", "jobs", ["expires_at"],
                    sqlite_where=UNCLAIMED_WITH_EXPIRY, postgresql_where=UNCLAIMED_WITH_EXPIRY)
    op.create_table(
        "job_checkpoints",
        sa.Column("job_id", Id, nullable=False),
        sa.Column("checkpoint", sa.Text(), nullable=False),
        sa.Column("saved_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name="pk_job_checkpoints"),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE job_checkpoints SET (fillfactor = 70, "
                   "autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000)")


def downgrade() -> None:
    # An older release knows no cancel requests: a running job whose cancel was asked for
    # runs to its end as any other would.
    op.drop_table("job_checkpoints")
    op.drop_index("ix_jobs_expires_at", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        for name, _kind in reversed(CONTROL_COLUMNS):
            batch.drop_column(name)
        batch.drop_column("expires_at")
        batch.drop_column("timeout_seconds")
