"""The only place the SQL of dependencies between jobs lives (table job_dependencies).

A finishing job flagged as depended on (jobs.has_dependents, set here with the edges that
point to it) asks here which waiting jobs its end concerns; a job no one waits on asks
nothing. An enqueue stores the edges of its new jobs and locks the dependencies it names,
so that a dependency finishing at the same moment is seen by one of the two transactions
(see lock_dependencies).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Connection,
    bindparam,
    delete,
    func,
    insert,
    literal_column,
    select,
    tuple_,
    update,
)

from app.core.clock import MICROS
from app.core.statuses import UNFINISHED_STATUSES
from app.storage.chunks import chunked
from app.storage.dialects import conflict_insert_for, writers_serialised
from app.storage.schema import dependency_cascades, job_dependencies, jobs
from app.storage.statements import DriverStatement

_UNRESOLVED: Any = literal_column("0")
_RESOLVED: Any = literal_column("1")
_FLAGGED: Any = literal_column("1")
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
    updated_at: int  # a finished job's: when it ended


_edge_columns = (job_dependencies.c.job_id, job_dependencies.c.depends_on_id,
                 job_dependencies.c.cancel_on_failure)


def _resolve_first(waits_on: Any) -> Any:
    """Mark applied, and return, the first `limit` unapplied edges that `waits_on` picks,
    in (dependency, dependent) order: a job's end applies a bounded share of its edges per
    transaction (app/jobs/tx/dependencies.py), through the index by dependency."""
    unresolved = job_dependencies.c.resolved == _UNRESOLVED
    first = (select(job_dependencies.c.job_id, job_dependencies.c.position)
             .where(waits_on, unresolved)
             .order_by(job_dependencies.c.depends_on_id, job_dependencies.c.job_id)
             .limit(bindparam("limit")))
    return (update(job_dependencies)
            .where(waits_on, unresolved,
                   tuple_(job_dependencies.c.job_id, job_dependencies.c.position).in_(first))
            .values(resolved=_RESOLVED)
            .returning(*_edge_columns))


# One finished job's edges, on the driver's cursor: this runs at the end of every job, and
# nearly always finds nothing.
_resolve_edges_of_one = DriverStatement(
    _resolve_first(job_dependencies.c.depends_on_id == bindparam("finished_id")))
_resolve_edges_of_many = _resolve_first(
    job_dependencies.c.depends_on_id.in_(bindparam("finished_ids", expanding=True)))
_insert_edges = DriverStatement(insert(job_dependencies))
# Cascades under way, oldest job first; those another process is stepping are skipped.
_take_cascades = (select(dependency_cascades.c.job_id, dependency_cascades.c.status)
                  .order_by(dependency_cascades.c.job_id)
                  .limit(bindparam("limit"))
                  .with_for_update(skip_locked=True))


@dataclass(frozen=True, slots=True)
class CascadeBacklog:
    """The cascades under way: how many jobs' ends have edges left, since when (None: none)."""

    jobs: int
    oldest_queued_at: int | None

    def age_seconds(self, now_us: int) -> float:
        """How long the oldest has been under way at `now_us` (0 when none is)."""
        if self.oldest_queued_at is None:
            return 0.0
        return max(0.0, (now_us - self.oldest_queued_at) / MICROS)


class DependencyRepository:
    """Dependency SQL on one connection."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        # The jobs this transaction flagged as depended on already (lock_dependencies).
        self._flagged: set[int] = set()

    def lock_dependencies(self, ids: Collection[int]) -> dict[int, DependencyRow]:
        """The jobs `ids` name that exist, by id, each locked FOR SHARE until the transaction
        ends (PostgreSQL; SQLite's BEGIN IMMEDIATE serialises writers anyway), the
        unfinished ones flagged first as having dependents (jobs.has_dependents).

        The lock is what makes an enqueue and a dependency's end see each other: a
        dependency finishing now holds its row, so this waits for its commit and reads it
        finished; one finishing later waits for this enqueue's commit, and then finds the
        edges it stored (its end's own statement returns the flag set here). Locked in id
        order, so two enqueues never deadlock; flagged before the share lock is taken, since
        two enqueues holding one row's share lock could not both write it."""
        self._flag(ids, unfinished_only=True)
        found: dict[int, DependencyRow] = {}
        for chunk in chunked(sorted(set(ids))):
            stmt = (select(jobs.c.id, jobs.c.producer, jobs.c.status, jobs.c.updated_at)
                    .where(jobs.c.id.in_(chunk))
                    .order_by(jobs.c.id)
                    .with_for_update(read=True))
            found.update((row.id, DependencyRow(row.id, row.producer, row.status,
                                                row.updated_at))
                         for row in self.conn.execute(stmt))
        return found

    def add_edges(self, rows: Sequence[dict[str, Any]]) -> None:
        """Store edges: each row's job_id, position, depends_on_id, cancel_on_failure (0/1)
        and resolved (0/1: the dependency had finished when it was stored)."""
        if rows:
            _insert_edges.execute_many(self.conn, rows)
            self._flag({row["depends_on_id"] for row in rows if not row["resolved"]})

    def _flag(self, ids: Collection[int], *, unfinished_only: bool = False) -> None:
        """Mark these jobs as having dependents whose edges their end must apply: the flag
        that lets the end of a job nobody depends on skip dependencies altogether. Rows
        flagged already are left unwritten (and unlocked)."""
        wanted = sorted(set(ids) - self._flagged)
        for chunk in chunked(wanted):
            # The rows to write are locked in id order by the sub-select first: an UPDATE
            # alone locks them in the order its plan reads them, and two transactions
            # taking the same rows in different orders deadlock (a workflow's enqueue against
            # the completes of its dependencies, seen under load).
            chosen = (select(jobs.c.id)
                      .where(jobs.c.id.in_(chunk), jobs.c.has_dependents.is_(None))
                      .order_by(jobs.c.id).with_for_update(key_share=True))
            if unfinished_only:
                chosen = chosen.where(jobs.c.status.in_(_UNFINISHED))
            self.conn.execute(update(jobs).where(jobs.c.id.in_(chosen.scalar_subquery()))
                              .values(has_dependents=_FLAGGED))
        self._flagged.update(wanted)

    def resolve_edges(self, finished_ids: Collection[int], limit: int) -> list[Edge]:
        """Mark applied, and return, up to `limit` of the edges not yet applied that wait on
        these jobs, which have finished (lowest dependency, then dependent, first). Each
        edge is returned once, ever; fewer than `limit` means none is left."""
        if not finished_ids or limit <= 0:
            return []
        if len(finished_ids) == 1:
            [job_id] = finished_ids
            rows: list[Sequence[Any]] = list(_resolve_edges_of_one.rows(
                self.conn, {"finished_id": job_id, "limit": limit}))
        else:
            rows = []
            for chunk in chunked(sorted(finished_ids)):
                rows += self.conn.execute(_resolve_edges_of_many, {
                    "finished_ids": chunk, "limit": limit - len(rows)}).all()
                if len(rows) >= limit:
                    break
        return [Edge(int(job_id), int(depends_on_id), bool(cancel))
                for job_id, depends_on_id, cancel in rows]

    def with_edges_left(self, ids: Collection[int]) -> set[int]:
        """Of these jobs, the ones some edge not yet applied waits on."""
        found: set[int] = set()
        # One probe of the unapplied edges' index per job: a job with thousands left costs
        # what one with a single edge does.
        waits = (select(job_dependencies.c.job_id)
                 .where(job_dependencies.c.depends_on_id == jobs.c.id,
                        job_dependencies.c.resolved == _UNRESOLVED).exists())
        for chunk in chunked(sorted(ids)):
            found.update(int(job_id) for job_id in self.conn.execute(
                select(jobs.c.id).where(jobs.c.id.in_(chunk), waits)).scalars())
        return found

    def queue_cascades(self, ended: Mapping[int, str], now_us: int) -> None:
        """Remember these finished jobs (id: the status they ended with) as having edges
        left to apply; a job remembered already keeps its row."""
        if not ended:
            return
        stmt = conflict_insert_for(self.conn.dialect.name, dependency_cascades)
        for chunk in chunked(sorted(ended)):
            self.conn.execute(stmt.on_conflict_do_nothing(), [
                {"job_id": job_id, "status": ended[job_id], "queued_at": now_us}
                for job_id in chunk])

    def take_cascades(self, limit: int) -> dict[int, str]:
        """Up to `limit` cascades under way (job id: the status it ended with), locked
        until the transaction ends (PostgreSQL: those another process holds are skipped)."""
        return {int(job_id): status for job_id, status in
                self.conn.execute(_take_cascades, {"limit": limit})}

    def forget_cascades(self, job_ids: Collection[int]) -> None:
        """These jobs' edges are all applied."""
        for chunk in chunked(sorted(job_ids)):
            self.conn.execute(delete(dependency_cascades).where(
                dependency_cascades.c.job_id.in_(chunk)))

    def cascade_backlog(self) -> CascadeBacklog:
        count, oldest = self.conn.execute(select(
            func.count(), func.min(dependency_cascades.c.queued_at))).one()
        return CascadeBacklog(int(count), None if oldest is None else int(oldest))

    def lock_dependents(self, ids: Collection[int]) -> None:
        """Lock these jobs (dependents of jobs that just finished) FOR UPDATE, in id order,
        before their release is decided (PostgreSQL; SQLite's writers are serialised).

        Two dependencies of one job finishing at once each resolve their own edge; without
        this lock each would still see the other's edge unresolved (its change not yet
        committed), and neither would release the job. Under it, the later one waits for
        the earlier one's commit, and its next statement reads both edges resolved."""
        if ids and not writers_serialised(self.conn):
            for chunk in chunked(sorted(ids)):
                self.conn.execute(select(jobs.c.id).where(jobs.c.id.in_(chunk))
                                  .order_by(jobs.c.id).with_for_update()).all()

    def dependencies_of(self, ids: Collection[int]) -> dict[int, list[tuple[int, bool, bool]]]:
        """Each of these jobs' dependencies in depends_on order: (id, cancel_on_failure,
        resolved); jobs without any are not in the answer."""
        found: dict[int, list[tuple[int, bool, bool]]] = {}
        for chunk in chunked(sorted(ids)):
            stmt = (select(job_dependencies.c.job_id, job_dependencies.c.depends_on_id,
                           job_dependencies.c.cancel_on_failure, job_dependencies.c.resolved)
                    .where(job_dependencies.c.job_id.in_(chunk))
                    .order_by(job_dependencies.c.job_id, job_dependencies.c.position))
            for job_id, depends_on_id, cancel, resolved in self.conn.execute(stmt):
                found.setdefault(int(job_id), []).append(
                    (int(depends_on_id), bool(cancel), bool(resolved)))
        return found

    def depended_on_by_unfinished(self, ids: Collection[int]) -> set[int]:
        """Of these jobs, the ones an unfinished job (waiting, pending or running) depends
        on: purge keeps them, so that the dependent still finds what they produced."""
        dependent = jobs.alias("dependent")
        kept: set[int] = set()
        for chunk in chunked(sorted(ids)):
            stmt = (select(job_dependencies.c.depends_on_id).distinct()
                    .join(dependent, dependent.c.id == job_dependencies.c.job_id)
                    .where(job_dependencies.c.depends_on_id.in_(chunk),
                           dependent.c.status.in_(_UNFINISHED)))
            kept.update(int(job_id) for job_id in self.conn.execute(stmt).scalars())
        return kept

    def delete_edges_of(self, job_ids: Collection[int]) -> None:
        """Forget the dependencies of these jobs (purged with them)."""
        for chunk in chunked(sorted(job_ids)):
            self.conn.execute(delete(job_dependencies).where(
                job_dependencies.c.job_id.in_(chunk)))
