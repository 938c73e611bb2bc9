"""The dashboard's session secret, generated once and shared by every process and host.

One row per named secret: the first process to need one inserts it unless a row is there
already, and every process then reads the row that won (section 14).

Revision ID: 0010
Revises: 0007
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "service_secrets",
        sa.Column("name", sa.String(40), nullable=False),
        sa.Column("value", sa.String(200), nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_service_secrets"),
    )


def downgrade() -> None:
    op.drop_table("service_secrets")
