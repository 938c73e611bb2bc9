"""Types that protect themselves (docs/FLOW-CONTROL.md, "Circuit breaker", "Retry budget";
docs/PUSH.md, "Adaptive concurrency").

- job_types.circuit and job_types.retry_budget: a type's breaker and retry budget settings
  (compact JSON; NULL: off, as for every stored type).
- job_types.circuit_state, circuit_since, circuit_opened_by: where its breaker stands (NULL:
  closed), since when, and the failure group that opened it. A type whose circuit is open
  or half-open is under flow control: its claims read its row.
- job_types.retry_budget_at: the retry budget's schedule (when the next retry beyond the
  budget may run); NULL until one is held back.
- type_tallies: per type, process slot and second, the attempts that ended and failed and
  the first attempts started, written about once a second by each process for the
  types with a breaker or a retry budget alone, so that no job's request writes more; the
  breaker and the budget read their windows here.
- push_origins: per push origin, the deliveries the dispatcher lets run at once now (below
  the type's cap after the origin answered 429, 503 or timed out), and until when it holds
  them back (its Retry-After).
- On PostgreSQL the types' trigger also tells 'types' when a breaker or budget setting, or a
  circuit's state, changes: every host's copy of the settings follows at once.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

_SETTINGS_0025 = ("paused, max_running, max_running_per_key, rate_per_second, burst, push_url, "
                  "push_timeout_seconds, push_secret, fairness, ordering, on_failure, "
                  "retention_completed_seconds, retention_failed_seconds, "
                  "retention_cancelled_seconds, key_scope")
_SETTINGS_0028 = _SETTINGS_0025 + ", circuit, circuit_state, retry_budget"


def _types_trigger(columns: str) -> None:
    op.execute(sa.text("DROP TRIGGER queuelog_types_changed ON job_types"))
    op.execute(sa.text(
        f"CREATE TRIGGER queuelog_types_changed AFTER INSERT OR DELETE OR UPDATE OF {columns} "
        "ON job_types FOR EACH ROW EXECUTE FUNCTION queuelog_notify_kind('types')"))


def upgrade() -> None:
    with op.batch_alter_table("job_types") as batch:
        batch.add_column(sa.Column("circuit", sa.Text(), nullable=True))
        batch.add_column(sa.Column("circuit_state", sa.String(9), nullable=True))
        batch.add_column(sa.Column("circuit_since", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("circuit_opened_by", sa.Text(), nullable=True))
        batch.add_column(sa.Column("retry_budget", sa.Text(), nullable=True))
        batch.add_column(sa.Column("retry_budget_at", sa.BigInteger(), nullable=True))
    op.create_table(
        "type_tallies",
        sa.Column("type", sa.String(100), nullable=False),
        sa.Column("second", sa.BigInteger(), nullable=False),
        sa.Column("slot", sa.SmallInteger(), nullable=False),
        sa.Column("finished", sa.BigInteger(), nullable=False),
        sa.Column("failed", sa.BigInteger(), nullable=False),
        sa.Column("started_first", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("type", "second", "slot", name=op.f("pk_type_tallies")),
    )
    op.create_index("ix_type_tallies_second", "type_tallies", ["second"])
    op.create_table(
        "push_origins",
        sa.Column("origin", sa.String(300), nullable=False),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("cap", sa.Integer(), nullable=False),
        sa.Column("held_until", sa.BigInteger(), nullable=True),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("origin", name=op.f("pk_push_origins")),
    )
    if op.get_context().dialect.name == "postgresql":
        _types_trigger(_SETTINGS_0028)


def downgrade() -> None:
    if op.get_context().dialect.name == "postgresql":
        _types_trigger(_SETTINGS_0025)
    op.drop_table("push_origins")
    op.drop_table("type_tallies")
    with op.batch_alter_table("job_types") as batch:
        for column in ("retry_budget_at", "retry_budget", "circuit_opened_by", "circuit_since",
                       "circuit_state", "circuit"):
            batch.drop_column(column)
