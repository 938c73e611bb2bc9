"""Fair share and ordered keys (docs/FLOW-CONTROL.md).

- jobs.fair_round (NULL but for a fair type's pending jobs; -1 for those not yet due) and its
  partial indexes: ix_jobs_fair_order, which a fair type's claims read in round order,
  ix_jobs_fair_key, where a key's next round starts, and ix_jobs_fair_deferred, the jobs to
  number once due. No stored job has a round, so all three start empty.
- ix_jobs_waiting_key: an ordered key's oldest waiting job, its next turn.
- key_turns: the job whose turn it is in each ordered key, and whether a failure blocks it.
- job_types.fairness, .ordering, .on_failure: NULL, the behaviour of every earlier release.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
FAIR_ROWS = sa.text("status = 'pending' AND fair_round >= 0")
DEFERRED_FAIR_ROWS = sa.text("status = 'pending' AND fair_round < 0")
WAITING_KEYED_ROWS = sa.text("status = 'waiting' AND concurrency_key IS NOT NULL")


def upgrade() -> None:
    # A nullable column without a default: SQLite adds it without rewriting the table.
    op.add_column("jobs", sa.Column("fair_round", sa.BigInteger(), nullable=True))
    op.create_index("ix_jobs_fair_order", "jobs",
                    ["type", sa.text("priority DESC"), "fair_round", "created_at", "id",
                     "run_at"], sqlite_where=FAIR_ROWS, postgresql_where=FAIR_ROWS)
    op.create_index("ix_jobs_fair_key", "jobs", ["type", "concurrency_key", "fair_round"],
                    sqlite_where=FAIR_ROWS, postgresql_where=FAIR_ROWS)
    op.create_index("ix_jobs_fair_deferred", "jobs", ["type", "run_at"],
                    sqlite_where=DEFERRED_FAIR_ROWS, postgresql_where=DEFERRED_FAIR_ROWS)
    op.create_index("ix_jobs_waiting_key", "jobs", ["type", "concurrency_key", "id"],
                    sqlite_where=WAITING_KEYED_ROWS, postgresql_where=WAITING_KEYED_ROWS)
    op.create_table(
        "key_turns",
        sa.Column("type", sa.String(100), nullable=False),
        sa.Column("concurrency_key", sa.String(255), nullable=False),
        sa.Column("job_id", Id, nullable=False),
        sa.Column("blocked", sa.SmallInteger(), nullable=False),
        sa.Column("since", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("type", "concurrency_key", name="pk_key_turns"),
    )
    op.create_index("ix_key_turns_job_id", "key_turns", ["job_id"])
    op.create_index("ix_key_turns_blocked", "key_turns", ["blocked", "type", "concurrency_key"],
                    sqlite_where=sa.text("blocked = 1"), postgresql_where=sa.text("blocked = 1"))
    for name in ("fairness", "ordering", "on_failure"):
        op.add_column("job_types", sa.Column(name, sa.String(8), nullable=True))


def downgrade() -> None:
    # An older release knows no turns: the jobs waiting only for their key's turn (waiting,
    # with no unfinished dependency) become pending, and every key runs as it did.
    op.execute(
        "UPDATE jobs SET status = 'pending' WHERE status = 'waiting' AND NOT EXISTS ("
        "SELECT 1 FROM job_dependencies d WHERE d.job_id = jobs.id AND d.resolved = 0)")
    with op.batch_alter_table("job_types") as batch:
        for name in ("on_failure", "ordering", "fairness"):
            batch.drop_column(name)
    op.drop_index("ix_key_turns_blocked", table_name="key_turns")
    op.drop_index("ix_key_turns_job_id", table_name="key_turns")
    op.drop_table("key_turns")
    op.drop_index("ix_jobs_waiting_key", table_name="jobs")
    op.drop_index("ix_jobs_fair_deferred", table_name="jobs")
    op.drop_index("ix_jobs_fair_key", table_name="jobs")
    op.drop_index("ix_jobs_fair_order", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("fair_round")
