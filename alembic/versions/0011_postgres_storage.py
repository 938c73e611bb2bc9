"""PostgreSQL storage parameters of the tables a queue churns: jobs, job_attempts, job_events.

PostgreSQL only; on SQLite this revision changes nothing (SQLite has no per-table storage
parameters, and VACUUM there is whole-file). The reasons, column by column (docs/SCALING.md
has the measurements):

- jobs, fillfactor 90. The claim writes status, claimed_at, worker_id, lease_expires_at,
  lease_token and updated_at; the completion status, result, lease_expires_at and updated_at.
  Neither can be a HOT update: worker_id and lease_expires_at are indexed, and status is read
  by the predicate of every partial index (claim order, running, finished, failed,
  cancelled, unique holders), and PostgreSQL counts predicate columns as indexed. What the
  free tenth of each page buys is that the new row version lands on the same page as the old
  one (one page dirtied and logged per claim or completion, not two, and the job's versions
  pruned together), instead of a freshly filled page sending every claim to the end of the
  table.
- job_attempts, fillfactor 80. The completion closes the attempt the claim opened by writing
  ended_at, outcome and error, none of them indexed (its only index is (job_id, number)):
  that update is HOT whenever the page has room, which an append-only page at 100 never has.
- Autovacuum per table. The defaults (vacuum once dead rows exceed 50 + 20 % of the table)
  let a million-row jobs table gather 200,000 dead versions, most of them in the claim-order
  index's leading edge, which every claim walks, before anything is cleaned. 1,000 + 2 %
  vacuums a busy queue about once a minute (autovacuum_naptime) and a large retained table
  after 2 % of it has changed; analyze follows the same churn, since the pending share of the
  table (what the planner weighs for the claim) moves with every batch. job_events is only
  inserted and purged: 5 % keeps purge's space reused without vacuuming it for nothing.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-30
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# table: its storage parameters. Kept here, not on the Table objects: SQLAlchemy renders no
# table storage parameters, and autogenerate does not compare them.
STORAGE = {
    "jobs": {
        "fillfactor": "90",
        "autovacuum_vacuum_scale_factor": "0.02",
        "autovacuum_vacuum_threshold": "1000",
        "autovacuum_analyze_scale_factor": "0.02",
        "autovacuum_analyze_threshold": "1000",
    },
    "job_attempts": {
        "fillfactor": "80",
        "autovacuum_vacuum_scale_factor": "0.02",
        "autovacuum_vacuum_threshold": "1000",
    },
    "job_events": {
        "autovacuum_vacuum_scale_factor": "0.05",
        "autovacuum_vacuum_threshold": "1000",
    },
}


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, parameters in STORAGE.items():
        settings = ", ".join(f"{name} = {value}" for name, value in parameters.items())
        op.execute(f"ALTER TABLE {table} SET ({settings})")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, parameters in STORAGE.items():
        op.execute(f"ALTER TABLE {table} RESET ({', '.join(parameters)})")
