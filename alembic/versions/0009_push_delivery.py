"""Push delivery: a type's endpoint, its timeout and its signing secret (docs/PUSH.md).

Nullable columns at the end of job_types: no table rewrite on either engine. A type is a
push type while push_url is set.

Revision ID: 0009
Revises: 0007
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("job_types", sa.Column("push_url", sa.Text(), nullable=True))
    op.add_column("job_types", sa.Column("push_timeout_seconds", sa.Integer(), nullable=True))
    op.add_column("job_types", sa.Column("push_secret", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_types") as batch:
        batch.drop_column("push_secret")
        batch.drop_column("push_timeout_seconds")
        batch.drop_column("push_url")
