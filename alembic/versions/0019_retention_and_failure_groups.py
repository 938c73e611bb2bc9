"""Retention and failure groups (docs/OPERATIONS.md).

- job_types.retention_{completed,failed,cancelled}_seconds: a type's own retention of its
  finished jobs (NULL: the QUEUELOG_RETENTION_… default, which every type stored before has).
- ix_jobs_finished_type_status gains updated_at (renamed ix_jobs_finished_type_status_updated):
  retention reads each type's finished jobs past their window in updated_at order from it.
  Same rows, same predicate: a finished job is still written to it once.
- job_attempts.fingerprint, and its partial index with ended_at: NULL for every attempt stored
  before (their errors were never grouped; GET /failures starts from the first failure after
  the upgrade).
- failure_groups: one row per (type, fingerprint), kept by the failing transactions. Starts
  empty.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

FINISHED_ROWS = sa.text("status IN ('completed', 'failed', 'cancelled')")
FINGERPRINTED = sa.text("fingerprint IS NOT NULL")
RETENTION_COLUMNS = ("retention_completed_seconds", "retention_failed_seconds",
                     "retention_cancelled_seconds")


def upgrade() -> None:
    # Nullable columns without a default: SQLite adds them without rewriting the table.
    for name in RETENTION_COLUMNS:
        op.add_column("job_types", sa.Column(name, sa.Integer(), nullable=True))
    op.create_index("ix_jobs_finished_type_status_updated", "jobs",
                    ["type", "status", "updated_at"],
                    sqlite_where=FINISHED_ROWS, postgresql_where=FINISHED_ROWS)
    op.drop_index("ix_jobs_finished_type_status", table_name="jobs")
    op.add_column("job_attempts", sa.Column("fingerprint", sa.String(16), nullable=True))
    op.create_index("ix_job_attempts_fingerprint_ended_at", "job_attempts",
                    ["fingerprint", "ended_at"],
                    sqlite_where=FINGERPRINTED, postgresql_where=FINGERPRINTED)
    op.create_table(
        "failure_groups",
        sa.Column("type", sa.String(100), nullable=False),
        sa.Column("fingerprint", sa.String(16), nullable=False),
        sa.Column("sample", sa.Text(), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("jobs_failed", sa.BigInteger(), nullable=False),
        sa.Column("first_seen", sa.BigInteger(), nullable=False),
        sa.Column("last_seen", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("type", "fingerprint", name="pk_failure_groups"),
    )
    op.create_index("ix_failure_groups_last_seen", "failure_groups", ["last_seen"])


def downgrade() -> None:
    op.drop_index("ix_failure_groups_last_seen", table_name="failure_groups")
    op.drop_table("failure_groups")
    op.drop_index("ix_job_attempts_fingerprint_ended_at", table_name="job_attempts")
    with op.batch_alter_table("job_attempts") as batch:
        batch.drop_column("fingerprint")
    op.create_index("ix_jobs_finished_type_status", "jobs", ["type", "status"],
                    sqlite_where=FINISHED_ROWS, postgresql_where=FINISHED_ROWS)
    op.drop_index("ix_jobs_finished_type_status_updated", table_name="jobs")
    with op.batch_alter_table("job_types") as batch:
        for name in RETENTION_COLUMNS:
            batch.drop_column(name)
