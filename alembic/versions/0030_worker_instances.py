"""Worker instances (docs/API.md, GET /workers): the label a worker sends with its claims and
heartbeats (host and pid, or one its operator sets), shown as reported.

- jobs.worker_instance: the label the current attempt's claim sent, set by the claim's own
  UPDATE (NULL on every stored job: nothing is written to them).
- job_attempts.worker_instance: the label of a stored attempt's claim (NULL on the stored
  ones).
- worker_instances: each key's instances, when each was last seen and last claimed, and the
  jobs it claimed in one whole minute, written at most once a minute per key, label and
  process; ix_worker_instances_last_seen_at finds the recent ones and the ones to forget.

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-08
"""

import sqlalchemy as sa
from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("worker_instance", sa.String(200), nullable=True))
    op.add_column("job_attempts", sa.Column("worker_instance", sa.String(200), nullable=True))
    op.create_table(
        "worker_instances",
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("instance", sa.String(200), nullable=False),
        sa.Column("last_seen_at", sa.BigInteger(), nullable=False),
        sa.Column("last_claim_at", sa.BigInteger(), nullable=True),
        sa.Column("minute", sa.BigInteger(), nullable=True),
        sa.Column("claimed", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("name", "instance", name=op.f("pk_worker_instances")),
    )
    op.create_index("ix_worker_instances_last_seen_at", "worker_instances", ["last_seen_at"])


def downgrade() -> None:
    op.drop_index("ix_worker_instances_last_seen_at", table_name="worker_instances")
    op.drop_table("worker_instances")
    with op.batch_alter_table("job_attempts") as batch:
        batch.drop_column("worker_instance")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("worker_instance")
