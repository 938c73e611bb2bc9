"""Job ids are never reused on SQLite: the jobs table is rebuilt with AUTOINCREMENT.

Without AUTOINCREMENT, SQLite gives a new row the highest rowid in the table plus one, so
once the newest jobs are purged their ids come back, and a stored `Location: /jobs/N` names
another job. With it, SQLite records the highest id ever used (in sqlite_sequence) and never
goes below it. The rebuild copies every row with its id, so the sequence starts at the
highest id the table holds: ids already freed by an earlier purge of the newest jobs are
unknowable and may be given once more, later ones never.

PostgreSQL's bigserial sequence never goes back, whatever is deleted. Rows inserted with
explicit ids (a copy from another database) do not move it, though, so its next id is set
past the highest id stored, never lower than it was.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_PENDING = "status = 'pending'"
_RUNNING = "status = 'running'"


def _drop_indexes() -> None:
    # Dropped before the rebuild and created again after it, from the definitions below:
    # batch mode would have to reflect them, and reflection loses the partial indexes'
    # WHERE clauses and the DESC of the claim order.
    for name in ("ix_jobs_claim_order", "ix_jobs_claim_order_by_type",
                 "ix_jobs_lease_expires_at", "uq_jobs_producer_idempotency_key",
                 "ix_jobs_producer_id", "ix_jobs_worker_id_id"):
        op.drop_index(name, table_name="jobs")


def _create_indexes() -> None:
    pending, running = sa.text(_PENDING), sa.text(_RUNNING)
    op.create_index("ix_jobs_claim_order", "jobs",
                    [sa.literal_column("priority DESC"), "created_at", "id"],
                    sqlite_where=pending)
    op.create_index("ix_jobs_claim_order_by_type", "jobs",
                    ["type", sa.literal_column("priority DESC"), "created_at", "id"],
                    sqlite_where=pending)
    op.create_index("ix_jobs_lease_expires_at", "jobs", ["lease_expires_at"],
                    sqlite_where=running)
    op.create_index("uq_jobs_producer_idempotency_key", "jobs",
                    ["producer", "idempotency_key"], unique=True)
    op.create_index("ix_jobs_producer_id", "jobs", ["producer", "id"])
    op.create_index("ix_jobs_worker_id_id", "jobs", ["worker_id", "id"])


def _rebuild_jobs(autoincrement: bool) -> None:
    _drop_indexes()
    # recreate="always": SQLite cannot add AUTOINCREMENT to a table in place. The copy is
    # INSERT … SELECT with every column, ids included, inside this migration's transaction.
    with op.batch_alter_table("jobs", recreate="always",
                              table_kwargs={"sqlite_autoincrement": autoincrement}):
        pass
    _create_indexes()


def _sequence_past_stored_ids() -> None:
    op.execute(
        "SELECT setval(pg_get_serial_sequence('jobs', 'id'), GREATEST("
        "(SELECT COALESCE(MAX(id), 0) FROM jobs), "
        "COALESCE(pg_sequence_last_value(pg_get_serial_sequence('jobs', 'id')::regclass), 0)"
        ") + 1, false)")


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_jobs(autoincrement=True)
    else:
        _sequence_past_stored_ids()


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_jobs(autoincrement=False)
