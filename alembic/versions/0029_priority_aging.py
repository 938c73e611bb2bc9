"""Priority aging (docs/FLOW-CONTROL.md, "Priority aging"): job_types.aging_seconds, the
interval after which a pending job of the type is claimed as if its priority rose one level
(NULL: off). Nothing is stored per job: a job's place in the aged order follows from its
priority and created_at, which the claim-order indexes already hold. On PostgreSQL the types'
trigger also tells 'types' when it changes, so every host's copy of the settings follows.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None

_SETTINGS_0028 = ("paused, max_running, max_running_per_key, rate_per_second, burst, push_url, "
                  "push_timeout_seconds, push_secret, fairness, ordering, on_failure, "
                  "retention_completed_seconds, retention_failed_seconds, "
                  "retention_cancelled_seconds, key_scope, circuit, circuit_state, retry_budget")
_SETTINGS_0029 = _SETTINGS_0028 + ", aging_seconds"


def _types_trigger(columns: str) -> None:
    op.execute(sa.text("DROP TRIGGER queuelog_types_changed ON job_types"))
    op.execute(sa.text(
        f"CREATE TRIGGER queuelog_types_changed AFTER INSERT OR DELETE OR UPDATE OF {columns} "
        "ON job_types FOR EACH ROW EXECUTE FUNCTION queuelog_notify_kind('types')"))


def upgrade() -> None:
    with op.batch_alter_table("job_types") as batch:
        batch.add_column(sa.Column("aging_seconds", sa.Integer(), nullable=True))
    if op.get_context().dialect.name == "postgresql":
        _types_trigger(_SETTINGS_0029)


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        _types_trigger(_SETTINGS_0028)
    with op.batch_alter_table("job_types") as batch:
        batch.drop_column("aging_seconds")
