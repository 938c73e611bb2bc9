"""The due schedules are read through an index of the active ones only (paused first in the
key, then next_run_at and name): a paused schedule costs nothing per slot, neither a write
nor an index entry the tickers walk past.

Until 0013 every paused schedule was fired like the others (a write moving its next_run_at
on, once a slot), and the due query, on next_run_at alone, read the paused rows in order to
skip them. Now the due query asks for `paused = false`, and a resumed schedule has its next
slot computed when it is resumed (the PATCH computes next_run_at again from now anyway).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_schedules_next_run_at", table_name="schedules")
    op.create_index("ix_schedules_due", "schedules", ["paused", "next_run_at", "name"])


def downgrade() -> None:
    op.drop_index("ix_schedules_due", table_name="schedules")
    op.create_index("ix_schedules_next_run_at", "schedules", ["next_run_at"])
