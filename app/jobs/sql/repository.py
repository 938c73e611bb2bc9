"""The jobs' writes: inserts, a job's transitions, releases, bulk actions and deletes.
JobRepository extends the reads (read_repository.py) and the claim (claim_repository.py),
all on the connection (and transaction) it is given; job_rows.py holds what the statements
share.

Values from requests are always bound parameters. Statuses, which come from JobStatus and
never from a request, are written as literals: the planners only use a partial index when
the query's WHERE repeats the index's own literal ('pending', 'running'). Every change of a
job's status goes through apply_transition or the claim, each made from its Transition.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import (
    and_,
    bindparam,
    case,
    delete,
    exists,
    func,
    insert,
    literal_column,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.exc import DBAPIError

from app.core.statuses import STATUS_BITS, JobStatus
from app.jobs.domain.models import Job, JobControls
from app.jobs.domain.report_pace import HEARTBEAT_SPACING_US
from app.jobs.domain.transitions import Transition
from app.jobs.sql.control_repository import CONTROL_COLUMNS, controls_from
from app.jobs.sql.job_rows import (
    JOB_COLUMN_COUNT,
    JOB_COLUMNS,
    NO_KEY_TO_SETTLE,
    NOT_UNIQUE_HOLDER,
    UNIQUE_HOLDER,
    capped_lease,
    job_of,
    status_is_job_by_id,
)
from app.jobs.sql.read_repository import JobReads
from app.jobs.sql.statuses import PENDING, WAITING, status_is
from app.keys.repository import LIVE_KEY, live_key_condition
from app.storage.chunks import chunked
from app.storage.dialects import conflict_insert_for, writers_serialised
from app.storage.engine import need_transaction, undone_to_run_again
from app.storage.integrity import refused_in_savepoint, unique_indexes_translated
from app.storage.schema import (
    job_dependencies,
    jobs,
    key_turns,
)
from app.storage.statements import DriverStatement

# A waiting job whose every dependency has finished becomes pending (Transition.RELEASE): the
# condition and the change in one statement, built once. No unique check is needed: a waiting
# job holds its unique key exactly when a pending one would (app/core/statuses.py).
_no_unfinished_dependency = ~(select(job_dependencies.c.job_id)
                              .where(job_dependencies.c.job_id == jobs.c.id,
                                     job_dependencies.c.resolved == literal_column("0"))
                              .exists())
# Nor is a job of an ordered key released while its key's turn is another job's
# (docs/FLOW-CONTROL.md, Ordered keys): it waits for its turn, which app/jobs/tx/key_rules.py
# passes on. Jobs of other types and keyless jobs have no turn: the look-up by the table's
# key finds nothing. A type's keys are its producers' own or shared (producer ''), never
# both: one of the two probes finds it.
_not_behind_a_turn = ~(select(key_turns.c.job_id)
                       .where(key_turns.c.type == jobs.c.type,
                              key_turns.c.producer.in_([jobs.c.producer, literal_column("''")]),
                              key_turns.c.concurrency_key == jobs.c.concurrency_key,
                              key_turns.c.job_id != jobs.c.id)
                       .exists())


def _release(ids: Any) -> Any:
    """The waiting jobs `ids` picks that nothing holds back any more made pending
    (Transition.RELEASE), due now at the earliest, RETURNING them."""
    return (
        update(jobs)
        .where(ids, status_is_job_by_id(*Transition.RELEASE.from_statuses),
               _no_unfinished_dependency, _not_behind_a_turn)
        .values(Transition.RELEASE.values(
            now_us=bindparam("now"),
            run_at=case((jobs.c.run_at < bindparam("now"), bindparam("now")),
                        else_=jobs.c.run_at)))
        .returning(*JOB_COLUMNS)
    )


# One job (a dependency's end releases its one dependent, mostly) on the driver's cursor;
# several in chunks of expanded ids.
_release_one = DriverStatement(_release(jobs.c.id == bindparam("released_id")))
_release_many = _release(jobs.c.id.in_(bindparam("released_ids", expanding=True)))

# A job an admin's retry made pending, with a dependency still unfinished (it was cancelled
# by another one's failure): waiting again, in the retry's own transaction.
_wait_again = (
    update(jobs)
    .where(jobs.c.id.in_(bindparam("retried_ids", expanding=True)),
           jobs.c.status == PENDING, ~_no_unfinished_dependency)
    .values(status=WAITING)
    .returning(*JOB_COLUMNS)
)

# A heartbeat is taken when it is due (app/jobs/domain/report_pace.py): the first of its attempt
# (updated_at is still the claim's: a heartbeat cannot reach the server within its claim's
# microsecond), a second after the previous one, or once half the lease that one granted has
# passed. Written on the bind parameters the heartbeat passes
# (spaced_before: now less a second; twice_now) so that no arithmetic touches a parameter.
_HEARTBEAT_DUE = or_(
    jobs.c.updated_at == jobs.c.claimed_at,
    jobs.c.updated_at <= bindparam("spaced_before"),
    jobs.c.lease_expires_at + jobs.c.updated_at <= bindparam("twice_now"),
)


def transition_conditions(transition: Transition, fenced: bool, key_to_confirm: bool = False,
                          alone: bool = False, lease_token: Any = None) -> list[Any]:
    """The conditions, besides its id, under which a row of `jobs` may take `transition`
    (the flags as _transition_update's): one of the statuses it starts from and, for a
    worker's report, the job held by the worker (parameter `worker`) under a lease live at
    `now` (and `held_lease_token`, when `fenced`: or the expression `lease_token`, each
    row's own in a statement of several jobs), its cancel not requested for a complete or a
    fail. For the statements that move a job one way or another (app/jobs/sql/
    fail_repository.py, complete_many.py) as for the UPDATE here."""
    conditions = [status_is_job_by_id(*transition.from_statuses)]
    if key_to_confirm:
        conditions.append(live_key_condition())
    if transition.by_lease_holder:
        conditions += [jobs.c.worker_id == bindparam("worker"),
                       jobs.c.lease_expires_at > bindparam("now")]
    if fenced:
        conditions.append(jobs.c.lease_token == (
            bindparam("held_lease_token") if lease_token is None else lease_token))
    if transition in (Transition.COMPLETE, Transition.FAIL):
        # A job whose cancel was requested ends cancelled, whatever its holder reports
        # (Transition.STOP).
        conditions.append(jobs.c.cancel_requested_at.is_(None))
    if alone:
        conditions += [jobs.c.has_dependents.is_(None), NO_KEY_TO_SETTLE]
    return conditions


@functools.cache
def _transition_update(transition: Transition, columns: frozenset[str],
                       fenced: bool, key_to_confirm: bool = False,
                       alone: bool = False) -> DriverStatement:
    """UPDATE of `columns` on one job in one of the transition's from-statuses, RETURNING it.
    A worker's report also needs the job held: by the worker, under a live lease. `fenced`
    adds: its lease token matches; `key_to_confirm`: the caller's key is live (KeyToConfirm);
    `alone`: the job's end touches no other row (no dependents to settle, no key's turn to
    pass on: no concurrency key, or one of a type without key modes), so the UPDATE is all
    the step writes. Built once per shape: building and
    hashing a statement costs more than running it on the hot paths."""
    conditions = transition_conditions(transition, fenced, key_to_confirm, alone)
    values: dict[str, Any] = {name: bindparam(f"new_{name}") for name in sorted(columns)}
    returned: tuple[Any, ...] = JOB_COLUMNS
    if transition is Transition.HEARTBEAT:
        # Its lease capped at the attempt's deadline; its progress, if any, among `columns`;
        # and its controls returned (its cancel requested?).
        values["lease_expires_at"] = capped_lease(jobs.c.claimed_at,
                                                   bindparam("new_lease_expires_at"))
        returned += CONTROL_COLUMNS
        conditions.append(_HEARTBEAT_DUE)
    return DriverStatement(
        update(jobs)
        .where(jobs.c.id == bindparam("job_id"), *conditions)
        .values(values)
        .returning(*returned)
    )


@functools.cache
def _insert_statement(dialect: str, skip_conflicts: bool) -> DriverStatement:
    stmt = conflict_insert_for(dialect, jobs)
    if skip_conflicts:
        stmt = stmt.on_conflict_do_nothing()
    return DriverStatement(stmt.returning(*JOB_COLUMNS))


@functools.cache
def _insert_if_key_live(dialect: str, skip_conflicts: bool,
                        columns: tuple[str, ...]) -> DriverStatement:
    """The INSERT of one job of `columns` (its values the parameters of those names), made
    only while the caller's key is live (KeyToConfirm): INSERT … SELECT … WHERE, which inserts
    nothing for a revoked key. Built once per shape of values."""
    values = select(*(bindparam(name, type_=jobs.c[name].type) for name in columns)
                    ).where(live_key_condition())
    stmt = conflict_insert_for(dialect, jobs).from_select(list(columns), values)
    if skip_conflicts:
        stmt = stmt.on_conflict_do_nothing()
    return DriverStatement(stmt.returning(*JOB_COLUMNS))


def _new_values(values: Mapping[str, Any]) -> dict[str, Any]:
    return {f"new_{name}": value for name, value in values.items()}


# The columns that tell a batch's rows apart, checked against the rows sent.
_TELLING_COLUMNS = ("type", "payload", "priority", "run_at", "idempotency_key")


def _in_row_order(returned: Sequence[Any], rows: Sequence[Mapping[str, Any]]) -> list[Job]:
    """The jobs a multi-row INSERT … RETURNING made, in the order of `rows`.

    Neither engine promises RETURNING's order, but each inserts the rows in order (SQLite its
    rows of VALUES, PostgreSQL its arrays' ORDER BY ordinality) and gives each an id above
    every id before it (AUTOINCREMENT, a sequence): in id order they are in `rows`' order.
    That is checked on the columns that tell rows apart; should it ever not hold, each row is
    matched with a job holding every one of its values instead.
    """
    made = sorted(map(job_of, returned), key=lambda job: job.id)
    if len(made) == len(rows) and all(
            getattr(job, name) == row.get(name)
            for job, row in zip(made, rows, strict=True) for name in _TELLING_COLUMNS):
        return made
    by_values: dict[tuple[Any, ...], list[Job]] = {}
    names = sorted(rows[0])
    for job in reversed(made):
        by_values.setdefault(tuple(getattr(job, name) for name in names), []).append(job)
    return [by_values[tuple(row[name] for name in names)].pop() for row in rows]


class WriteConflict(Exception):
    """A concurrent transaction collided with this one (PostgreSQL undid it); run it again."""


# Transaction-scoped advisory locks on hashes of (producer, key), taken in hash order. A
# producer's name has no space, so "producer key" names one pair. (Two pairs sharing a hash
# merely wait for each other.)
_lock_keys_in_order = text(
    "SELECT pg_advisory_xact_lock(h) FROM ("
    " SELECT DISTINCT hashtextextended(:producer || ' ' || k, 0) AS h"
    " FROM unnest(CAST(:keys AS text[])) AS k ORDER BY h) AS ordered")


def _enters_key(table: Any, status: JobStatus) -> Any:
    """The row has a unique key that it holds in `status` (NULL-safe: false without one)."""
    bit: Any = literal_column(str(STATUS_BITS[status]))
    return and_(table.c.unique_scope.is_not(None),
                func.coalesce(table.c.unique_while, 0).op("&")(bit) != 0)


def _takes_a_held_key(transition: Transition, status: JobStatus, batch: Any) -> Any:
    """A job of `batch` (the expanding bind of its ids) that moving to `status` would bring
    into a unique key already taken: held by another job, or entered first by a job of the
    batch with a lower id. (A job that holds its key now keeps it: no other job holds it.)"""
    twin, others = jobs.alias("twin"), jobs.alias("batch")
    # Unqualified, the predicate names the innermost table of its subquery, `twin`; it is the
    # partial unique index's own text, so the look-up reads that index.
    held_by_a_twin = exists().where(
        twin.c.producer == jobs.c.producer, twin.c.unique_scope == jobs.c.unique_scope,
        twin.c.id != jobs.c.id, UNIQUE_HOLDER)
    # The batch's jobs that would enter a key, numbered per key in id order (read by id,
    # once for the statement): all but the first of each key are left as they are.
    entering = select(
        others.c.id,
        func.row_number().over(partition_by=[others.c.producer, others.c.unique_scope],
                               order_by=others.c.id).label("n"),
    ).where(others.c.id.in_(batch), status_is(others, transition.from_statuses),
            _enters_key(others, status), NOT_UNIQUE_HOLDER).subquery("entering")
    return or_(and_(_enters_key(jobs, status), NOT_UNIQUE_HOLDER, held_by_a_twin),
               jobs.c.id.in_(select(entering.c.id).where(entering.c.n > 1)))


@functools.cache
def _transition_many(transition: Transition, status: JobStatus,
                     columns: frozenset[str]) -> Any:
    """apply_transition_to_many's UPDATE, built once per transition, status and columns
    written (its ids an expanding bind, `ids`; its values `new_<column>`): built afresh, its
    aliased subqueries cost an ordered key's enqueue more than the rest of it."""
    ids: Any = bindparam("ids", expanding=True)
    return (update(jobs)
            .where(jobs.c.id.in_(ids), status_is_job_by_id(*transition.from_statuses),
                   ~_takes_a_held_key(transition, status, ids))
            .values({name: bindparam(f"new_{name}") for name in sorted(columns)})
            .returning(*JOB_COLUMNS))


class JobRepository(JobReads):
    """Job SQL on one connection. Methods returning `Job | None` return None for "no such row"
    (or, for conditional updates, "the row was not in the expected state")."""

    # -- creating -------------------------------------------------------------------------

    def insert_job(self, values: Mapping[str, Any]) -> Job:
        """Insert a job. Raises IdempotencyKeyTaken when (producer, idempotency_key) is taken,
        UniqueScopeHeld when its unique scope is held, SlotTaken when its (schedule,
        scheduled_for) slot has its job: the caller finds the job that stands in the way.
        The transaction goes on after any of them."""
        keyed = (values.get("idempotency_key") is not None
                 or values.get("unique_scope") is not None
                 or values.get("schedule") is not None)
        key = self.take_key_to_confirm()
        if key is None:
            row = _insert_statement(self.conn.dialect.name, skip_conflicts=keyed
                                    ).first(self.conn, values)
        else:
            row = _insert_if_key_live(self.conn.dialect.name, keyed, tuple(values)
                                      ).first(self.conn, {**values, LIVE_KEY: key.digest})
            key.answered(row is not None)
        if row is not None:
            return job_of(row)
        # Skipped for a conflict (ON CONFLICT DO NOTHING names no index): once more without
        # the skip, in a savepoint, for the index to name itself. Only a job that meets a
        # twin pays for it; should the twin have gone meanwhile, this inserts the job. In
        # one-statement work, nothing was written: the enqueue runs again in a transaction.
        need_transaction(self.conn)
        with refused_in_savepoint(self.conn):
            row = _insert_statement(self.conn.dialect.name, skip_conflicts=False
                                    ).first(self.conn, values)
        if row is None:
            raise RuntimeError("an INSERT … RETURNING returned no row")
        return job_of(row)

    def savepoint(self) -> AbstractContextManager[None]:
        """A savepoint for the block: a unique index's refusal (IdempotencyKeyTaken,
        UniqueScopeHeld, SlotTaken) undoes the block alone, and the transaction goes on."""
        return refused_in_savepoint(self.conn)

    def insert_jobs(self, rows: Sequence[Mapping[str, Any]]) -> list[Job]:
        """Insert several jobs in one statement; the jobs come back in the rows' order.

        No ON CONFLICT here: the caller has locked and looked up the idempotency keys in the
        same transaction; a concurrent twin raises its index's error (IdempotencyKeyTaken,
        UniqueScopeHeld, SlotTaken) and a deadlock or a serialization failure
        WriteConflict, for it to retry.
        """
        if not rows:
            return []
        try:
            with unique_indexes_translated():
                returned = _insert_statement(self.conn.dialect.name, skip_conflicts=False
                                             ).insert_many(self.conn, rows)
                if returned is not None:
                    return _in_row_order(returned, rows)
                stmt = insert(jobs).returning(*jobs.c, sort_by_parameter_order=True)
                return [job_of(row) for row in self.conn.execute(stmt, list(rows))]
        except DBAPIError as exc:
            if undone_to_run_again(exc):
                raise WriteConflict() from exc
            raise

    def lock_idempotency_keys(self, producer: str, keys: Collection[str]) -> None:
        """Take the producer's keys for the rest of the transaction, in one fixed order
        (PostgreSQL; SQLite's BEGIN IMMEDIATE already serialises writers).

        Two batches sharing keys would otherwise insert them in their requests' orders and
        each wait on a key the other inserted first: a deadlock. Locked in sorted order,
        the later batch waits for the earlier one whole, then finds its jobs and replays
        them. Rows still go in in request order, so ids and claim order follow it.
        """
        if keys and not writers_serialised(self.conn):
            self.conn.execute(_lock_keys_in_order, {"producer": producer, "keys": list(keys)})

    # -- changing -------------------------------------------------------------------------

    def apply_transition(self, transition: Transition, job_id: int,
                         values: Mapping[str, Any], *, lease_token: str | None = None,
                         worker: str | None = None, now_us: int | None = None,
                         alone: bool = False) -> Job | None:
        """Write `values` (from `transition.values`) if the job is in one of the transition's
        from-statuses, held by `worker` under a lease live at `now_us` when the transition is
        a worker's, and under `lease_token` when one is given. None when it is not, or when
        there is no such job. `alone` (one-statement work alone): only if the job has no
        dependents and no key to settle (NO_KEY_TO_SETTLE), whose rows its end would change
        too; if it changed nothing,
        the work runs again in a transaction (need_transaction)."""
        if transition.by_lease_holder and (worker is None or now_us is None):
            raise ValueError(f"{transition.name} needs the worker and the time")
        key = self.take_key_to_confirm()
        stmt = _transition_update(transition, frozenset(values),
                                  fenced=lease_token is not None, key_to_confirm=key is not None,
                                  alone=alone)
        params = {"job_id": job_id, "worker": worker, "now": now_us,
                  "held_lease_token": lease_token, **_new_values(values)}
        if key is not None:
            params[LIVE_KEY] = key.digest
        row = stmt.first(self.conn, params)
        if row is None and alone:
            # Nothing changed: the step goes on in a transaction, which asks why (the key,
            # the lease, a cancel, dependents or a key to settle) where it can act on it.
            need_transaction(self.conn)
        if key is not None:
            key.answered(row is not None)
        return None if row is None else job_of(row)

    def extend_lease(self, job_id: int, values: Mapping[str, Any], *, worker: str,
                     now_us: int, lease_token: str | None) -> tuple[Job, JobControls] | None:
        """A heartbeat (Transition.HEARTBEAT's `values`, with its progress's columns when it
        reports any), its lease capped at the attempt's deadline: the job and its controls
        (its cancel requested?); None when the worker does not hold it, or when it does and
        the heartbeat is not due yet (app/jobs/domain/report_pace.py)."""
        key = self.take_key_to_confirm()
        stmt = _transition_update(Transition.HEARTBEAT, frozenset(values),
                                  fenced=lease_token is not None, key_to_confirm=key is not None)
        params = {"job_id": job_id, "worker": worker, "now": now_us,
                  "held_lease_token": lease_token,
                  "spaced_before": now_us - HEARTBEAT_SPACING_US, "twice_now": 2 * now_us,
                  **_new_values(values)}
        if key is not None:
            params[LIVE_KEY] = key.digest
        row = stmt.first(self.conn, params)
        if key is not None:
            key.answered(row is not None)
        if row is None:
            return None
        return job_of(row), controls_from(job_id, row[JOB_COLUMN_COUNT:])

    def release_ready(self, job_ids: Collection[int], now_us: int) -> list[Job]:
        """Of these jobs, the waiting ones with no unfinished dependency left, and not behind
        another job's turn in an ordered key, become pending (Transition.RELEASE); returned
        by id."""
        if not job_ids:
            return []
        if len(job_ids) == 1:
            [job_id] = job_ids
            rows: list[Sequence[Any]] = list(_release_one.rows(
                self.conn, {"released_id": job_id, "now": now_us}))
        else:
            rows = []
            for chunk in chunked(sorted(job_ids)):
                rows += self.conn.execute(_release_many, {"released_ids": chunk,
                                                          "now": now_us}).all()
        return sorted(map(job_of, rows), key=lambda job: job.id)

    def wait_again(self, retried: list[Job]) -> list[Job]:
        """These jobs, which an admin's retry just made pending, with those that still have
        an unfinished dependency made waiting again (a retry runs the job, not its
        dependencies': it waits for them as before); in their order."""
        if not retried:
            return []
        waiting: dict[int, Job] = {}
        for chunk in chunked([job.id for job in retried]):
            waiting.update((row.id, job_of(row)) for row in self.conn.execute(
                _wait_again, {"retried_ids": chunk}))
        return [waiting.get(job.id, job) for job in retried]

    def apply_transition_to_many(self, transition: Transition, job_ids: Collection[int],
                                 values: Mapping[str, Any]) -> list[Job]:
        """Write `values` to each of the jobs still in one of the transition's from-statuses
        (an admin's transition; never a worker's), returned by id.

        A job the change would bring into its unique key is left as it is when another job
        holds that key, or when a job of `job_ids` below it enters the same key: what taking
        the jobs one by one in id order would leave, decided in the one statement (whose
        conditions read the rows as they were before it), which thus never meets the
        unique index."""
        if transition.by_lease_holder:
            raise ValueError(f"{transition.name} is a worker's report, one job at a time")
        if not job_ids:
            return []
        stmt = _transition_many(transition, JobStatus(values["status"]), frozenset(values))
        new_values = _new_values(values)
        changed: list[Job] = []
        # Chunks in id order: a later chunk's statement sees the keys an earlier one's jobs
        # entered, so the jobs are still taken as one by one in id order would take them.
        for chunk in chunked(sorted(job_ids)):
            rows = self.conn.execute(stmt, {"ids": chunk, **new_values})
            changed += sorted((job_of(row) for row in rows), key=lambda job: job.id)
        return changed

    # -- retention ------------------------------------------------------------------------

    def delete_jobs(self, job_ids: Collection[int]) -> None:
        """Delete these jobs' rows (their history is the caller's to delete, in the same
        transaction)."""
        if job_ids:
            self.conn.execute(delete(jobs).where(jobs.c.id.in_(sorted(job_ids))))

    def delete_finished_jobs(self, *, statuses: Collection[str], updated_before_us: int,
                             after_id: int, limit: int,
                             kept: Callable[[list[int]], Collection[int]] = lambda _ids: (),
                             ) -> tuple[list[int], int | None]:
        """Delete up to `limit` jobs in `statuses` last updated before the cutoff, scanning
        ids above `after_id`, but those `kept` says to keep (of the ids found). Returns (the
        ids deleted, last id scanned or None when done)."""
        batch = select(jobs.c.id).where(
            jobs.c.id > after_id,
            jobs.c.status.in_(list(statuses)),
            jobs.c.updated_at < updated_before_us,
        ).order_by(jobs.c.id).limit(limit).with_for_update()
        ids = list(self.conn.execute(batch).scalars())
        if not ids:
            return [], None
        keep = set(kept(ids))
        doomed = [job_id for job_id in ids if job_id not in keep]
        self.delete_jobs(doomed)
        return doomed, ids[-1]
