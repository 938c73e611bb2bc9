"""Index only the jobs that have an idempotency key or a worker.

Every job was written into uq_jobs_producer_idempotency_key and ix_jobs_worker_id_id at its
enqueue, though most jobs have no idempotency key and no pending job has a worker: two of the
six index writes an enqueue made (each a page more in SQLite's write-ahead log, fsynced at the
commit). Both become partial. Nothing that reads them changes: the idempotency look-up and the
worker listing ask for one key or one worker by equality, which implies the NOT NULL both
planners need to choose a partial index; NULL keys never collided in the unique index anyway;
and the enqueue's ON CONFLICT names no index, so it still stops at this one.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# (index, columns, unique, the column that must be set)
_INDEXES = [
    ("uq_jobs_producer_idempotency_key", ["producer", "idempotency_key"], True,
     "idempotency_key"),
    ("ix_jobs_worker_id_id", ["worker_id", "id"], False, "worker_id"),
]


def upgrade() -> None:
    for name, columns, unique, column in _INDEXES:
        where = sa.text(f"{column} IS NOT NULL")
        op.drop_index(name, table_name="jobs")
        op.create_index(name, "jobs", columns, unique=unique, sqlite_where=where,
                        postgresql_where=where)


def downgrade() -> None:
    for name, columns, unique, _column in _INDEXES:
        op.drop_index(name, table_name="jobs")
        op.create_index(name, "jobs", columns, unique=unique)
