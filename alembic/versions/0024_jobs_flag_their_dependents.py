"""Jobs flag their dependents: jobs.has_dependents is 1 on a job some stored dependency edge
waits on (docs/WORKFLOWS.md), NULL on every other job, so that the end of a job nobody
depends on sends no statement about dependencies. Set in the transaction that stores an
edge; back-filled here from the edges not yet applied (an applied edge's dependency has
ended already, and a job ends once).

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("has_dependents", sa.SmallInteger(), nullable=True))
    op.execute(sa.text(
        "UPDATE jobs SET has_dependents = 1 WHERE id IN "
        "(SELECT depends_on_id FROM job_dependencies WHERE resolved = 0)"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("has_dependents")
