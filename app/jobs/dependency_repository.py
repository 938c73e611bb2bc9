"""The only place the SQL of dependencies between jobs lives (table job_dependencies).

A finishing job asks here which waiting jobs its end concerns (one probe of an index by
dependency, which finds nothing for the jobs no one waits on); an enqueue stores the edges
of its new jobs and locks the dependencies it names, so that a dependency finishing at the
same moment is seen by one of the two transactions (see lock_dependencies).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, delete, insert, literal_column, select, update

from app.core.statuses import UNFINISHED_STATUSES
from app.storage.dialects import writers_serialised
from app.storage.schema import job_dependencies, jobs
from app.storage.statements import DriverStatement

_UNRESOLVED: Any = literal_column("0")
_RESOLVED: Any = literal_column("1")
_UNFINISHED: list[Any] = [literal_column(f"'{status.value}'") for status in
                          sorted(UNFINISHED_STATUSES)]


@dataclass(frozen=True, slots=True)
class Edge:
    """One dependency of a waiting job that its dependency's end applies."""

    job_id: int  # the dependent
    depends_on_id: int
    cancel_on_failure: bool


@dataclass(frozen=True, slots=True)
class DependencyRow:
    """A job named as a dependency, as an enqueue sees it under its lock."""

    id: int
    producer: str
    status: str


_edge_columns = (job_dependencies.c.job_id, job_dependencies.c.depends_on_id,
                 job_dependencies.c.cancel_on_failure)
# One finished job's edges, on the driver's cursor: this runs at the end of every job, and
# nearly always finds nothing.
_resolve_edges_of_one = DriverStatement(
    update(job_dependencies)
    .where(job_dependencies.c.depends_on_id == bindparam("finished_id"),
           job_dependencies.c.resolved == _UNRESOLVED)
    .values(resolved=_RESOLVED)
    .returning(*_edge_columns)
)
_insert_edges = DriverStatement(insert(job_dependencies))


class DependencyRepository:
    """Dependency SQL on one connection."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def lock_dependencies(self, ids: Collection[int]) -> dict[int, DependencyRow]:
        """The jobs `ids` name that exist, by id, each locked FOR SHARE until the transaction
        ends (PostgreSQL; SQLite's BEGIN IMMEDIATE serialises writers anyway).

        The lock is what makes an enqueue and a dependency's end see each other: a
        dependency finishing now holds its row, so this waits for its commit and reads it
        finished; one finishing later waits for this enqueue's commit, and then finds the
        edges it stored. Locked in id order, so two enqueues never deadlock."""
        if not ids:
            return {}
        stmt = (select(jobs.c.id, jobs.c.producer, jobs.c.status)
                .where(jobs.c.id.in_(sorted(set(ids))))
                .order_by(jobs.c.id)
                .with_for_update(read=True))
        return {row.id: DependencyRow(row.id, row.producer, row.status)
                for row in self.conn.execute(stmt)}

    def add_edges(self, rows: Sequence[dict[str, Any]]) -> None:
        """Store edges: each row's job_id, position, depends_on_id, cancel_on_failure (0/1)
        and resolved (0/1: the dependency had finished when it was stored)."""
        if rows:
            _insert_edges.execute_many(self.conn, rows)

    def resolve_edges(self, finished_ids: Collection[int]) -> list[Edge]:
        """Mark applied, and return, the edges not yet applied that wait on these jobs, which
        have just finished. Each edge is returned once, ever."""
        if not finished_ids:
            return []
        if len(finished_ids) == 1:
            [job_id] = finished_ids
            rows: Sequence[Any] = _resolve_edges_of_one.rows(self.conn, {"finished_id": job_id})
        else:
            rows = self.conn.execute(
                update(job_dependencies)
                .where(job_dependencies.c.depends_on_id.in_(sorted(finished_ids)),
                       job_dependencies.c.resolved == _UNRESOLVED)
                .values(resolved=_RESOLVED)
                .returning(*_edge_columns)).all()
        return [Edge(int(job_id), int(depends_on_id), bool(cancel))
                for job_id, depends_on_id, cancel in rows]

    def lock_dependents(self, ids: Collection[int]) -> None:
        """Lock these jobs (dependents of jobs that just finished) FOR UPDATE, in id order,
        before their release is decided (PostgreSQL; SQLite's writers are serialised).

        Two dependencies of one job finishing at once each resolve their own edge; without
        this lock each would still see the other's edge unresolved (its change not yet
        committed), and neither would release the job. Under it, the later one waits for
        the earlier one's commit, and its next statement reads both edges resolved."""
        if ids and not writers_serialised(self.conn):
            self.conn.execute(select(jobs.c.id).where(jobs.c.id.in_(sorted(ids)))
                              .order_by(jobs.c.id).with_for_update()).all()

    def dependencies_of(self, ids: Collection[int]) -> dict[int, list[tuple[int, bool, bool]]]:
        """Each of these jobs' dependencies in depends_on order: (id, cancel_on_failure,
        resolved); jobs without any are not in the answer."""
        if not ids:
            return {}
        stmt = (select(job_dependencies.c.job_id, job_dependencies.c.depends_on_id,
                       job_dependencies.c.cancel_on_failure, job_dependencies.c.resolved)
                .where(job_dependencies.c.job_id.in_(sorted(ids)))
                .order_by(job_dependencies.c.job_id, job_dependencies.c.position))
        found: dict[int, list[tuple[int, bool, bool]]] = {}
        for job_id, depends_on_id, cancel, resolved in self.conn.execute(stmt):
            found.setdefault(int(job_id), []).append(
                (int(depends_on_id), bool(cancel), bool(resolved)))
        return found

    def depended_on_by_unfinished(self, ids: Collection[int]) -> set[int]:
        """Of these jobs, the ones an unfinished job (waiting, pending or running) depends
        on: purge keeps them, so that the dependent still finds what they produced."""
        if not ids:
            return set()
        dependent = jobs.alias("dependent")
        stmt = (select(job_dependencies.c.depends_on_id).distinct()
                .join(dependent, dependent.c.id == job_dependencies.c.job_id)
                .where(job_dependencies.c.depends_on_id.in_(sorted(ids)),
                       dependent.c.status.in_(_UNFINISHED)))
        return {int(job_id) for job_id in self.conn.execute(stmt).scalars()}

    def delete_edges_of(self, job_ids: Collection[int]) -> None:
        """Forget the dependencies of these jobs (purged with them)."""
        if job_ids:
            self.conn.execute(delete(job_dependencies).where(
                job_dependencies.c.job_id.in_(sorted(job_ids))))
