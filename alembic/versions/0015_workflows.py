"""Workflows (docs/WORKFLOWS.md): the waiting status, dependencies between jobs, and workflows.

- job_dependencies: one row per (dependent, dependency), with the dependent's
  on_dependency_failure and whether the edge was applied; indexed by dependency, which a
  finishing job probes.
- workflows and workflow_jobs: a graph enqueued in one request, its jobs by ref.
- ix_jobs_waiting_type: GET /types counts waiting jobs per type from it alone.
- uq_jobs_producer_unique_scope is made again with a predicate in which a waiting job holds
  its unique key as a pending one does. No stored job is waiting before this revision, so
  the index holds exactly the rows it held.

Nothing is added to the jobs table: the claim never reads a dependency.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

# As app.storage.schema.UNIQUE_HOLDER_PREDICATE renders it in each revision; a migration keeps
# its own copies so that it still means what it meant when the code changes again.
HOLDER_0006 = sa.text(
    "unique_scope IS NOT NULL AND (unique_while & CASE status "
    "WHEN 'pending' THEN 1 WHEN 'running' THEN 2 WHEN 'completed' THEN 4 "
    "WHEN 'failed' THEN 8 WHEN 'cancelled' THEN 16 ELSE 0 END) <> 0"
)
HOLDER_0015 = sa.text(
    "unique_scope IS NOT NULL AND (unique_while & CASE status "
    "WHEN 'waiting' THEN 1 WHEN 'pending' THEN 1 WHEN 'running' THEN 2 WHEN 'completed' THEN 4 "
    "WHEN 'failed' THEN 8 WHEN 'cancelled' THEN 16 ELSE 0 END) <> 0"
)


def _holder_index(predicate: sa.TextClause) -> None:
    op.create_index("uq_jobs_producer_unique_scope", "jobs", ["producer", "unique_scope"],
                    unique=True, sqlite_where=predicate, postgresql_where=predicate)


def upgrade() -> None:
    op.create_table(
        "job_dependencies",
        sa.Column("job_id", Id, nullable=False),
        sa.Column("position", sa.SmallInteger(), nullable=False),
        sa.Column("depends_on_id", Id, nullable=False),
        sa.Column("cancel_on_failure", sa.SmallInteger(), nullable=False),
        sa.Column("resolved", sa.SmallInteger(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "position", name="pk_job_dependencies"),
    )
    op.create_index("ix_job_dependencies_depends_on_id", "job_dependencies",
                    ["depends_on_id", "job_id"])
    op.create_table(
        "workflows",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("name", sa.String(100), nullable=True),
        sa.Column("producer", sa.String(100), nullable=False),
        sa.Column("idempotency_key", sa.String(255), nullable=True),
        sa.Column("request_fingerprint", sa.String(64), nullable=True),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_workflows"),
        sqlite_autoincrement=True,
    )
    op.create_index("uq_workflows_producer_idempotency_key", "workflows",
                    ["producer", "idempotency_key"], unique=True,
                    sqlite_where=sa.text("idempotency_key IS NOT NULL"),
                    postgresql_where=sa.text("idempotency_key IS NOT NULL"))
    op.create_index("ix_workflows_producer_id", "workflows", ["producer", "id"])
    op.create_table(
        "workflow_jobs",
        sa.Column("workflow_id", Id, nullable=False),
        sa.Column("position", sa.SmallInteger(), nullable=False),
        sa.Column("ref", sa.String(100), nullable=False),
        sa.Column("job_id", Id, nullable=False),
        sa.Column("met", sa.SmallInteger(), nullable=False),
        sa.PrimaryKeyConstraint("workflow_id", "position", name="pk_workflow_jobs"),
    )
    op.create_index("ix_workflow_jobs_job_id", "workflow_jobs", ["job_id"])
    op.create_index("ix_jobs_waiting_type", "jobs", ["type"],
                    sqlite_where=sa.text("status = 'waiting'"),
                    postgresql_where=sa.text("status = 'waiting'"))
    op.drop_index("uq_jobs_producer_unique_scope", table_name="jobs")
    _holder_index(HOLDER_0015)


def downgrade() -> None:
    # Jobs still waiting cannot be told apart from pending ones by an older release, which
    # would never run them: they become pending, their dependencies forgotten.
    op.execute("UPDATE jobs SET status = 'pending' WHERE status = 'waiting'")
    op.drop_index("uq_jobs_producer_unique_scope", table_name="jobs")
    _holder_index(HOLDER_0006)
    op.drop_index("ix_jobs_waiting_type", table_name="jobs")
    op.drop_index("ix_workflow_jobs_job_id", table_name="workflow_jobs")
    op.drop_table("workflow_jobs")
    op.drop_index("ix_workflows_producer_id", table_name="workflows")
    op.drop_index("uq_workflows_producer_idempotency_key", table_name="workflows")
    op.drop_table("workflows")
    op.drop_index("ix_job_dependencies_depends_on_id", table_name="job_dependencies")
    op.drop_table("job_dependencies")
