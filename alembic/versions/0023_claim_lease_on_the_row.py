"""A plain job's history told by its row.

- jobs.claimed_until: the lease the current attempt's claim granted (lease_expires_at moves
  on with each heartbeat, and is cleared at the attempt's end). An uneventful attempt's
  claim is no longer written to job_attempts and job_events: it is read from the row, and
  this is the claimed event's detail. NULL on every row an earlier release wrote: each of
  those claims has its attempt and its event stored already.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, without a default: SQLite adds it without rewriting the table.
    op.add_column("jobs", sa.Column("claimed_until", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    # An earlier release reads the history from job_attempts and job_events alone: the
    # attempts and events this one told from the rows are not written back.
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("claimed_until")
