"""Schedules: cron schedules that enqueue jobs, and on each job the schedule and slot it was
enqueued for, with the unique index that keeps one job per schedule and slot.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_HAS_SCHEDULE = sa.text("schedule IS NOT NULL")


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("cron", sa.String(200), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("job", sa.Text, nullable=False),
        sa.Column("catch_up", sa.String(8), nullable=False),
        sa.Column("paused", sa.Boolean, nullable=False),
        sa.Column("next_run_at", sa.BigInteger, nullable=False),
        sa.Column("last_run_at", sa.BigInteger, nullable=True),
        sa.Column("last_job_id", _Id, nullable=True),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_schedules"),
    )
    op.create_index("ix_schedules_next_run_at", "schedules", ["next_run_at"])
    # Appended at the end of the table, nullable: no table rebuild on either engine.
    op.add_column("jobs", sa.Column("schedule", sa.String(100), nullable=True))
    op.add_column("jobs", sa.Column("scheduled_for", sa.BigInteger, nullable=True))
    op.create_index("uq_jobs_schedule_scheduled_for", "jobs", ["schedule", "scheduled_for"],
                    unique=True, sqlite_where=_HAS_SCHEDULE, postgresql_where=_HAS_SCHEDULE)


def downgrade() -> None:
    op.drop_index("uq_jobs_schedule_scheduled_for", table_name="jobs")
    with op.batch_alter_table("jobs", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.drop_column("scheduled_for")
        batch.drop_column("schedule")
    op.drop_index("ix_schedules_next_run_at", table_name="schedules")
    op.drop_table("schedules")
