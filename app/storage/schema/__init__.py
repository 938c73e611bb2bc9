"""The schema: one MetaData for the code and Alembic, its tables and the indexes the claim and
the reads are planned on, by what they hold:

- base.py: the MetaData, its naming convention, the shared column types;
- jobs.py: the jobs table and its indexes (the claim order, the fair order);
- beside_jobs.py: what only some jobs carry (checkpoints, reservations, key turns,
  dependencies and workflows, tags and trace context);
- history.py: attempts, failure groups, events, stats and depth;
- waits.py: what suspended jobs wait for, and the events producers post;
- settings.py: what operators set (job types, API keys, schedules) and the dashboard's
  sessions.

Every table is imported here, so that the MetaData holds them all once this package is."""

from app.storage.schema.base import NAMING_CONVENTION, Id, Micros, metadata
from app.storage.schema.beside_jobs import (
    dependency_cascades,
    job_checkpoints,
    job_dependencies,
    job_reservations,
    job_tags,
    job_traces,
    key_turns,
    workflow_jobs,
    workflows,
)
from app.storage.schema.history import (
    failure_groups,
    job_attempts,
    job_depth,
    job_events,
    job_stats,
    type_tallies,
)
from app.storage.schema.jobs import (
    UNIQUE_HOLDER_PREDICATE,
    claim_order_columns,
    fair_order_columns,
    jobs,
)
from app.storage.schema.settings import (
    api_keys,
    job_types,
    job_waiters,
    key_activity,
    push_origins,
    schedules,
    ui_sessions,
    ui_sign_in_failures,
    worker_instances,
)
from app.storage.schema.waits import job_waits, posted_events

__all__ = [
    "NAMING_CONVENTION",
    "UNIQUE_HOLDER_PREDICATE",
    "Id",
    "Micros",
    "api_keys",
    "claim_order_columns",
    "dependency_cascades",
    "failure_groups",
    "fair_order_columns",
    "job_attempts",
    "job_checkpoints",
    "job_dependencies",
    "job_depth",
    "job_events",
    "job_reservations",
    "job_stats",
    "job_tags",
    "job_traces",
    "job_types",
    "job_waiters",
    "job_waits",
    "jobs",
    "key_activity",
    "key_turns",
    "metadata",
    "posted_events",
    "push_origins",
    "schedules",
    "type_tallies",
    "ui_sessions",
    "ui_sign_in_failures",
    "worker_instances",
    "workflow_jobs",
    "workflows",
]
