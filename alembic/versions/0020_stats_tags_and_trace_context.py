"""The queue over time, tags and trace context (docs/OPERATIONS.md, docs/TRACING.md).

- job_tags: a job's tags, beside the row (a job without tags has none); indexed by
  (tag, job_id) for GET /jobs?tag=. Starts empty: no job stored before has tags.
- job_traces: the W3C trace context a job was enqueued with. Starts empty.
- schedules.traceparent / tracestate: the context of the request that created the schedule,
  carried by each job it enqueues. NULL for every schedule stored before.
- job_stats and job_depth: per type and minute, what the job transactions counted and the
  pending depth the ticker saw. Start empty: the charts begin at the upgrade.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
COUNTS = ("enqueued", "claimed", "completed", "failed")


def upgrade() -> None:
    op.create_table(
        "job_tags",
        sa.Column("job_id", Id, nullable=False),
        sa.Column("tag", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "tag", name="pk_job_tags"),
    )
    op.create_index("ix_job_tags_tag_job_id", "job_tags", ["tag", "job_id"])
    op.create_table(
        "job_traces",
        sa.Column("job_id", Id, nullable=False),
        sa.Column("traceparent", sa.String(55), nullable=False),
        sa.Column("tracestate", sa.String(512), nullable=True),
        sa.PrimaryKeyConstraint("job_id", name="pk_job_traces"),
    )
    # Nullable columns without a default: SQLite adds them without rewriting the table.
    op.add_column("schedules", sa.Column("traceparent", sa.String(55), nullable=True))
    op.add_column("schedules", sa.Column("tracestate", sa.String(512), nullable=True))
    op.create_table(
        "job_stats",
        sa.Column("type", sa.String(100), nullable=False),
        sa.Column("minute", sa.BigInteger(), nullable=False),
        sa.Column("slot", sa.SmallInteger(), nullable=False),
        *(sa.Column(name, sa.BigInteger(), nullable=False) for name in COUNTS),
        sa.PrimaryKeyConstraint("type", "minute", "slot", name="pk_job_stats"),
    )
    op.create_index("ix_job_stats_minute", "job_stats", ["minute"])
    op.create_table(
        "job_depth",
        sa.Column("type", sa.String(100), nullable=False),
        sa.Column("minute", sa.BigInteger(), nullable=False),
        sa.Column("pending", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("type", "minute", name="pk_job_depth"),
    )
    op.create_index("ix_job_depth_minute", "job_depth", ["minute"])


def downgrade() -> None:
    op.drop_index("ix_job_depth_minute", table_name="job_depth")
    op.drop_table("job_depth")
    op.drop_index("ix_job_stats_minute", table_name="job_stats")
    op.drop_table("job_stats")
    with op.batch_alter_table("schedules") as batch:
        batch.drop_column("tracestate")
        batch.drop_column("traceparent")
    op.drop_table("job_traces")
    op.drop_index("ix_job_tags_tag_job_id", table_name="job_tags")
    op.drop_table("job_tags")
