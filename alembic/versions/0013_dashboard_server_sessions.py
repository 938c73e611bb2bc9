"""The dashboard's sessions move into the database, and its failed sign-ins are counted there.

ui_sessions: one row per signed-in session, keyed by the SHA-256 digest of the random id its
cookie holds (section 14). Sign-out, a revoked key and expiry delete the row, and a reader of
the database learns no id a browser could present.
ui_sign_in_failures: failed sign-ins per fixed window, per client address and overall, shared
by every process that throttles them.
service_secrets goes, with the session key 0010 kept there in plain text: whoever could read
that row could sign an admin's session cookie and its CSRF tokens. Nothing signs with it now.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_table("service_secrets")
    op.create_table(
        "ui_sessions",
        sa.Column("id_digest", sa.String(64), nullable=False),
        sa.Column("key_id", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("expires_at", sa.BigInteger, nullable=False),
        sa.Column("data", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("id_digest", name="pk_ui_sessions"),
    )
    op.create_index("ix_ui_sessions_key_id", "ui_sessions", ["key_id"])
    op.create_index("ix_ui_sessions_expires_at", "ui_sessions", ["expires_at"])
    op.create_table(
        "ui_sign_in_failures",
        sa.Column("scope", sa.String(100), nullable=False),
        sa.Column("window_start", sa.BigInteger, nullable=False),
        sa.Column("failures", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("scope", name="pk_ui_sign_in_failures"),
    )


def downgrade() -> None:
    op.drop_table("ui_sign_in_failures")
    op.drop_index("ix_ui_sessions_expires_at", table_name="ui_sessions")
    op.drop_index("ix_ui_sessions_key_id", table_name="ui_sessions")
    op.drop_table("ui_sessions")
    # Empty: the first process to need a session key after the downgrade makes a new one.
    op.create_table(
        "service_secrets",
        sa.Column("name", sa.String(40), nullable=False),
        sa.Column("value", sa.String(200), nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_service_secrets"),
    )
