"""Job statuses as SQL literals: the one spelling of a status in a statement.

Statuses come from JobStatus, never from a request, and are written as literals rather than
bound: the planners use a partial index only when the query's WHERE repeats the index's own
literal ('pending', 'running'), and an IN list only in the index's own order.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import literal_column

from app.core.statuses import JobStatus


def status_literal(status: JobStatus) -> Any:
    """`status` as the SQL literal the partial indexes name."""
    return literal_column(f"'{status.value}'")


def status_is(table: Any, statuses: Collection[JobStatus]) -> Any:
    """`table.status` is one of `statuses`, written as literals, in the order given."""
    literals = [status_literal(status) for status in statuses]
    return table.c.status == literals[0] if len(literals) == 1 else table.c.status.in_(literals)


def status_is_by_id(table: Any, statuses: Collection[JobStatus]) -> Any:
    """As status_is, for a statement that finds its rows by id: written (`status || ''`) so
    that no planner can match it to a partial index of pending or running rows. Otherwise
    PostgreSQL may walk such an index whole instead of looking the id up, whenever its
    statistics call the index small (a plan made while few jobs ran, and kept): each walk
    steps over every entry the index holds, dead ones included, and under a held snapshot
    none can be removed (docs/SCALING.md, "A held snapshot")."""
    literals = [status_literal(status) for status in statuses]
    status = table.c.status.concat(literal_column("''"))
    return status == literals[0] if len(literals) == 1 else status.in_(literals)


PENDING = status_literal(JobStatus.PENDING)
RUNNING = status_literal(JobStatus.RUNNING)
WAITING = status_literal(JobStatus.WAITING)
RESERVED = status_literal(JobStatus.RESERVED)
SUSPENDED = status_literal(JobStatus.SUSPENDED)
# In the order of the partial index's own IN list, which is what the planners match.
FINISHED = [status_literal(status)
            for status in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)]
