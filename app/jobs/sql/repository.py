"""The jobs' SQL besides the claim (claim_repository.py, which JobRepository extends): inserts,
reads, a job's transitions, counts, bulk actions and retention. Every method runs on the
connection (and transaction) it is given; job_rows.py holds what the statements share.

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
    tuple_,
    union_all,
    update,
)
from sqlalchemy.exc import DBAPIError

from app.core.statuses import STATUS_BITS, JobStatus
from app.jobs.domain.models import BoundedCount, Job, JobControls, PendingSummary
from app.jobs.domain.report_pace import HEARTBEAT_SPACING_US
from app.jobs.domain.transitions import Transition
from app.jobs.sql.claim_repository import ClaimRepository
from app.jobs.sql.control_repository import CONTROL_COLUMNS, controls_from
from app.jobs.sql.job_rows import (
    CLAIMABLE_ROW,
    JOB_COLUMN_COUNT,
    JOB_COLUMNS,
    capped_lease,
    job_of,
    status_is_job,
)
from app.jobs.sql.statuses import FINISHED, PENDING, RESERVED, RUNNING, WAITING, status_is
from app.jobs.timeline.failure_repository import last_failed_with
from app.keys.repository import LIVE_KEY, live_key_condition
from app.storage.chunks import chunked
from app.storage.dialects import conflict_insert_for, writers_serialised
from app.storage.engine import need_transaction, undone_to_run_again
from app.storage.integrity import refused_in_savepoint, unique_indexes_translated
from app.storage.schema import (
    UNIQUE_HOLDER_PREDICATE,
    job_dependencies,
    job_tags,
    jobs,
    key_turns,
)
from app.storage.statements import DriverStatement

# Listed with their status as a literal, which matches their partial indexes of ids
# (ix_jobs_failed_id, ix_jobs_cancelled_id): few among many stored, found at once. The other
# statuses stay bound: completed and pending jobs are common, found soonest walking the ids,
# and a literal 'pending' would lead the planners to a partial index in claim order and a
# sort of every pending row. Running jobs are listed through _running_ids.
_LISTED_THROUGH_PARTIAL_INDEX = frozenset({JobStatus.FAILED.value, JobStatus.CANCELLED.value})
_RESCUABLE_ROW = status_is_job(*Transition.RESCUE.from_statuses)
# The predicate of the finished jobs' partial index, as written there: a query that repeats it
# is matched to the index by both planners.
_FINISHED_ROW = jobs.c.status.in_(FINISHED)

_select_by_id = select(*JOB_COLUMNS).where(jobs.c.id == bindparam("job_id"))
_select_by_id_for_update = _select_by_id.with_for_update()
# The same for a caller whose key it confirms live (KeyToConfirm).
_select_by_id_for_update_if_live = _select_by_id_for_update.where(live_key_condition())
_select_by_idempotency_key = select(*JOB_COLUMNS).where(
    jobs.c.producer == bindparam("producer"),
    jobs.c.idempotency_key == bindparam("idempotency_key"),
)
# The predicate is the unique index's own text, so the look-up reads that index.
_unique_holder = text(UNIQUE_HOLDER_PREDICATE)
_not_unique_holder = text(f"NOT ({UNIQUE_HOLDER_PREDICATE})")
_select_unique_holder = select(*JOB_COLUMNS).where(
    jobs.c.producer == bindparam("producer"),
    jobs.c.unique_scope == bindparam("unique_scope"),
    _unique_holder,
)
# SKIP LOCKED: a lease another claim is rescuing right now is simply left to that claim.
_select_expired_leases = DriverStatement(
    select(*JOB_COLUMNS)
    .where(_RESCUABLE_ROW, jobs.c.lease_expires_at <= bindparam("now"))
    .order_by(jobs.c.lease_expires_at)
    .limit(bindparam("limit"))
    .with_for_update(skip_locked=True)
)


# Unclaimed jobs past their expiry, through their partial index (its predicate's own text).
_select_expired_unclaimed = (
    select(jobs.c.id)
    .where(jobs.c.status.in_([PENDING, WAITING]),
           jobs.c.expires_at.is_not(None), jobs.c.expires_at <= bindparam("now"))
    .order_by(jobs.c.expires_at)
    .limit(bindparam("limit"))
    .with_for_update(skip_locked=True)
)


def _count_ahead(restricted_to_one_type: bool) -> Any:
    # Before the job in claim order (priority DESC, created_at, id) is three ranges of the
    # claim-order index (of the type, when restricted): a higher priority; the same priority
    # and older; the same priority and age and a lower id. Read range by range, each from the
    # index's start to the job's place (one OR of them scans the index whole), and no further
    # than `cap_plus_one` pending rows in all: UNION ALL under a LIMIT stops reading its
    # branches once it has that many, on both engines. So the cost is bounded by the cap, not
    # by the backlog: `examined` above the cap says the count stopped there.
    priority: Any = bindparam("priority")
    created_at: Any = bindparam("created_at")
    ranges = (
        (jobs.c.priority > priority,),
        (jobs.c.priority == priority, jobs.c.created_at < created_at),
        (jobs.c.priority == priority, jobs.c.created_at == created_at,
         jobs.c.id < bindparam("job_id")),
    )
    branches = []
    for conditions in ranges:
        stmt = select(jobs.c.run_at).where(CLAIMABLE_ROW, *conditions)
        if restricted_to_one_type:
            stmt = stmt.where(jobs.c.type == bindparam("type"))
        # A LIMIT of its own per branch (SQLite accepts one only on a subquery): no branch
        # reads past the cap even where a planner does not stop the compound early.
        branches.append(select(stmt.limit(bindparam("cap_plus_one")).subquery().c.run_at))
    examined = union_all(*branches).limit(bindparam("cap_plus_one")).subquery()
    return select(func.count(),
                  func.coalesce(func.sum(case((examined.c.run_at <= bindparam("now"), 1),
                                              else_=0)), 0))


_ahead_any_type = _count_ahead(restricted_to_one_type=False)
_ahead_of_type = _count_ahead(restricted_to_one_type=True)

# Counted through the partial index of running rows by (type, concurrency_key). Every type
# at once: the running rows are as many as the workers hold, and a statement without an
# expanding IN is compiled once and served from the cache on every claim.
_count_running = (
    select(jobs.c.type, jobs.c.concurrency_key, func.count())
    .where(jobs.c.status == RUNNING)
    .group_by(jobs.c.type, jobs.c.concurrency_key)
)
# The same rows by worker (GET /workers, the dashboard, explain). As a plain GROUP BY
# worker_id, SQLite's planner walks the whole (worker_id, id) index to avoid a sort: half a
# second at a million stored jobs. Materialized first, the running rows come from a partial
# index and only they are grouped.
_running_workers = (select(jobs.c.worker_id).where(jobs.c.status == RUNNING)
                    .cte("running_workers").prefix_with("MATERIALIZED"))
_count_running_by_worker = (select(_running_workers.c.worker_id, func.count())
                            .group_by(_running_workers.c.worker_id))
# The running jobs' ids, for a listing of them: as many as the workers hold, read from their
# partial index and then looked up by id, rather than found by walking every id (they are
# the newest) or every job of a producer.
_running_ids = (select(jobs.c.id).where(jobs.c.status == RUNNING)
                .cte("running_ids").prefix_with("MATERIALIZED"))


@functools.cache
def _count_running_along(cte: Any) -> Any:
    return _count_running.add_cte(cte)


# The earliest lease of one type's running jobs: its running rows, through the same index.
_next_lease_expiry = (
    select(func.min(jobs.c.lease_expires_at))
    .where(jobs.c.status == RUNNING, jobs.c.type == bindparam("type"))
)
# Every type's pending jobs, its scheduled ones and its oldest due run_at, from the per-type
# claim-order index (run_at is its last column), grouped in the index's own type-first order:
# what the backlog counts (app/jobs/sql/counts.py) read, unconfigured types included.
_pending_by_type = (
    select(jobs.c.type, func.count(),
           func.coalesce(func.sum(case((jobs.c.run_at > bindparam("now"), 1), else_=0)), 0),
           func.min(case((jobs.c.run_at <= bindparam("now"), jobs.c.run_at))))
    .where(jobs.c.status == PENDING)
    .group_by(jobs.c.type)
)
# Every type's waiting jobs, from their partial index alone.
_count_waiting = (
    select(jobs.c.type, func.count())
    .where(jobs.c.status == WAITING)
    .group_by(jobs.c.type)
)
# Every type's reserved jobs, from their partial index alone.
_count_reserved = (
    select(jobs.c.type, func.count())
    .where(jobs.c.status == RESERVED)
    .group_by(jobs.c.type)
)
_count_finished = (
    select(jobs.c.type, jobs.c.status, func.count())
    .where(jobs.c.status.in_(FINISHED))
    .group_by(jobs.c.type, jobs.c.status)
)

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
_RELEASED_VALUES = Transition.RELEASE.values(
    now_us=bindparam("now"),
    run_at=case((jobs.c.run_at < bindparam("now"), bindparam("now")), else_=jobs.c.run_at))
_release_one = DriverStatement(
    update(jobs)
    .where(jobs.c.id == bindparam("released_id"),
           status_is_job(*Transition.RELEASE.from_statuses), _no_unfinished_dependency,
           _not_behind_a_turn)
    .values(_RELEASED_VALUES)
    .returning(*JOB_COLUMNS)
)
_release_many = (
    update(jobs)
    .where(jobs.c.id.in_(bindparam("released_ids", expanding=True)),
           status_is_job(*Transition.RELEASE.from_statuses), _no_unfinished_dependency,
           _not_behind_a_turn)
    .values(_RELEASED_VALUES)
    .returning(*JOB_COLUMNS)
)

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


@functools.cache
def _transition_update(transition: Transition, columns: frozenset[str],
                       fenced: bool, key_to_confirm: bool = False,
                       alone: bool = False) -> DriverStatement:
    """UPDATE of `columns` on one job in one of the transition's from-statuses, RETURNING it.
    A worker's report also needs the job held: by the worker, under a live lease. `fenced`
    adds: its lease token matches; `key_to_confirm`: the caller's key is live (KeyToConfirm);
    `alone`: the job's end touches no other row (no dependents to settle, no key's turn to
    pass on), so the UPDATE is all the step writes. Built once per shape: building and
    hashing a statement costs more than running it on the hot paths."""
    conditions = [status_is_job(*transition.from_statuses)]
    if key_to_confirm:
        conditions.append(live_key_condition())
    if transition.by_lease_holder:
        conditions += [jobs.c.worker_id == bindparam("worker"),
                       jobs.c.lease_expires_at > bindparam("now")]
    if fenced:
        conditions.append(jobs.c.lease_token == bindparam("held_lease_token"))
    if transition is Transition.COMPLETE:
        # A job whose cancel was requested ends cancelled, not completed (Transition.STOP).
        conditions.append(jobs.c.cancel_requested_at.is_(None))
    if alone:
        conditions += [jobs.c.has_dependents.is_(None), jobs.c.concurrency_key.is_(None)]
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
        twin.c.id != jobs.c.id, _unique_holder)
    # The batch's jobs that would enter a key, numbered per key in id order (read by id,
    # once for the statement): all but the first of each key are left as they are.
    entering = select(
        others.c.id,
        func.row_number().over(partition_by=[others.c.producer, others.c.unique_scope],
                               order_by=others.c.id).label("n"),
    ).where(others.c.id.in_(batch), status_is(others, transition.from_statuses),
            _enters_key(others, status), _not_unique_holder).subquery("entering")
    return or_(and_(_enters_key(jobs, status), _not_unique_holder, held_by_a_twin),
               jobs.c.id.in_(select(entering.c.id).where(entering.c.n > 1)))


@functools.cache
def _transition_many(transition: Transition, status: JobStatus,
                     columns: frozenset[str]) -> Any:
    """apply_transition_to_many's UPDATE, built once per transition, status and columns
    written (its ids an expanding bind, `ids`; its values `new_<column>`): built afresh, its
    aliased subqueries cost an ordered key's enqueue more than the rest of it."""
    ids: Any = bindparam("ids", expanding=True)
    return (update(jobs)
            .where(jobs.c.id.in_(ids), status_is_job(*transition.from_statuses),
                   ~_takes_a_held_key(transition, status, ids))
            .values({name: bindparam(f"new_{name}") for name in sorted(columns)})
            .returning(*JOB_COLUMNS))


class JobRepository(ClaimRepository):
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
        key = self._take_key()
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

    # -- reading --------------------------------------------------------------------------

    def get_job(self, job_id: int, *, for_update: bool = False) -> Job | None:
        key = self._take_key() if for_update else None
        if key is None:
            stmt = _select_by_id_for_update if for_update else _select_by_id
            row = self.conn.execute(stmt, {"job_id": job_id}).first()
        else:
            row = self.conn.execute(_select_by_id_for_update_if_live,
                                    {"job_id": job_id, LIVE_KEY: key.digest}).first()
            key.answered(row is not None)
        return None if row is None else job_of(row)

    def jobs_by_ids(self, job_ids: Collection[int]) -> list[Job]:
        """These jobs (those that exist), by id."""
        found: list[Job] = []
        for chunk in chunked(sorted(job_ids)):
            stmt = select(*JOB_COLUMNS).where(jobs.c.id.in_(chunk)).order_by(jobs.c.id)
            found += [job_of(row) for row in self.conn.execute(stmt)]
        return found

    def find_by_idempotency_key(self, producer: str, idempotency_key: str) -> Job | None:
        row = self.conn.execute(
            _select_by_idempotency_key,
            {"producer": producer, "idempotency_key": idempotency_key},
        ).first()
        return None if row is None else job_of(row)

    def find_unique_holder(self, producer: str, unique_scope: str) -> Job | None:
        """The producer's job that holds this unique scope now (in one of its while
        statuses); None when no job does."""
        row = self.conn.execute(_select_unique_holder,
                                {"producer": producer, "unique_scope": unique_scope}).first()
        return None if row is None else job_of(row)

    def find_unique_holders(self, producer: str, scopes: Collection[str]) -> dict[str, Job]:
        """The producer's jobs holding these unique scopes now, by scope."""
        if not scopes:
            return {}
        stmt = select(*JOB_COLUMNS).where(jobs.c.producer == producer,
                                  jobs.c.unique_scope.in_(list(scopes)), _unique_holder)
        return {job.unique_scope or "": job for job in map(job_of, self.conn.execute(stmt))}

    def list_jobs(self, *, after_id: int, limit: int, producer: str | None = None,
                  worker: str | None = None, status: str | None = None,
                  job_type: str | None = None, run_after: int | None = None,
                  descending: bool = False, tag: str | None = None) -> list[Job]:
        """Jobs with id > after_id in id order (`descending`: id < after_id, newest first;
        after_id 0 then means from the newest), narrowed by the filters that are not None;
        `run_after` keeps the jobs whose run_at is later, `tag` those tagged so."""
        stmt = select(*JOB_COLUMNS)
        # With a tag, the jobs come from the tag's entries of ix_job_tags_tag_job_id, walked
        # in id order from the cursor (the keyset bound and the order are the index's
        # columns), each job then looked up by id: never a scan of the jobs.
        ids: Any = jobs.c.id
        if tag is not None:
            ids = job_tags.c.job_id
            stmt = stmt.select_from(job_tags.join(jobs, jobs.c.id == job_tags.c.job_id)).where(
                job_tags.c.tag == tag)
        if descending:
            if after_id:
                stmt = stmt.where(ids < after_id)
        else:
            stmt = stmt.where(ids > after_id)
        if run_after is not None:
            stmt = stmt.where(jobs.c.run_at > run_after)
        if producer is not None:
            stmt = stmt.where(jobs.c.producer == producer)
        if worker is not None:
            stmt = stmt.where(jobs.c.worker_id == worker)
        if status in _LISTED_THROUGH_PARTIAL_INDEX:
            stmt = stmt.where(status_is_job(JobStatus(status)))
        elif status == JobStatus.RUNNING.value:
            stmt = stmt.where(jobs.c.id.in_(select(_running_ids.c.id)))
        elif status is not None:
            stmt = stmt.where(jobs.c.status == status)
        if job_type is not None:
            stmt = stmt.where(jobs.c.type == job_type)
        stmt = stmt.order_by(ids.desc() if descending else ids).limit(limit)
        return [job_of(row) for row in self.conn.execute(stmt)]

    def find_by_idempotency_keys(self, producer: str, keys: Collection[str]) -> dict[str, Job]:
        """The producer's jobs with these idempotency keys, by key."""
        if not keys:
            return {}
        stmt = select(*JOB_COLUMNS).where(jobs.c.producer == producer,
                                  jobs.c.idempotency_key.in_(list(keys)))
        # Every row found has a key: it was found by its key.
        return {job.idempotency_key or "": job for job in map(job_of, self.conn.execute(stmt))}

    def count_running(self, along_with: tuple[Any, dict[str, Any]] | None = None,
                      ) -> dict[tuple[str, str | None], int]:
        """Running jobs by (type, concurrency_key). `along_with`: a data-modifying CTE
        (PostgreSQL) and its parameters, run in the same statement to save a round trip."""
        stmt, params = _count_running, {}
        if along_with is not None:
            stmt, params = _count_running_along(along_with[0]), along_with[1]
        return {(job_type, key): count
                for job_type, key, count in self.conn.execute(stmt, params)}

    def next_lease_expiry(self, job_type: str) -> int | None:
        """The earliest lease_expires_at of the type's running jobs; None when none runs."""
        value: int | None = self.conn.execute(
            _next_lease_expiry, {"type": job_type}).scalar()
        return value

    def pending_by_type(self, now_us: int) -> dict[str, PendingSummary]:
        """Every type's pending jobs, as pending_summary counts them, from the per-type
        claim-order index alone: one read of every pending row's entry."""
        return {job_type: PendingSummary(int(pending), int(scheduled), oldest)
                for job_type, pending, scheduled, oldest
                in self.conn.execute(_pending_by_type, {"now": now_us})}

    def count_waiting(self) -> dict[str, int]:
        """Waiting jobs by type, from their partial index."""
        return {job_type: count for job_type, count in self.conn.execute(_count_waiting)}

    def count_reserved(self) -> dict[str, int]:
        """Reserved jobs by type, from their partial index."""
        return {job_type: count for job_type, count in self.conn.execute(_count_reserved)}

    def count_finished(self) -> dict[tuple[str, str], int]:
        """Completed, failed and cancelled jobs by (type, status), from their partial index."""
        return {(job_type, status): count
                for job_type, status, count in self.conn.execute(_count_finished)}

    def find_expired_leases(self, now_us: int, limit: int) -> list[Job]:
        """Running jobs whose lease ran out, oldest expiry first (locked on PostgreSQL)."""
        rows = _select_expired_leases.rows(self.conn, {"now": now_us, "limit": limit})
        return [job_of(row) for row in rows]

    def count_claimable_ahead(self, job: Job, now_us: int, *, same_type: bool,
                              cap: int) -> BoundedCount:
        """How many jobs a claim would take before `job`: due pending jobs earlier in claim
        order (of its type alone when `same_type`), read through the claim-order index (of
        the type, when `same_type`), at most `cap` + 1 of its pending rows: exact when not
        `capped`; when capped, the due jobs among the first `cap` pending ones ahead (a lower
        bound, at most `cap`)."""
        stmt = _ahead_of_type if same_type else _ahead_any_type
        examined, due = self.conn.execute(stmt, {
            "now": now_us, "priority": job.priority, "created_at": job.created_at,
            "job_id": job.id, "type": job.type, "cap_plus_one": cap + 1}).one()
        capped = int(examined) > cap
        return BoundedCount(min(int(due), cap) if capped else int(due), capped)

    def count_running_by_worker(self) -> dict[str, int]:
        """How many jobs each worker holds now (running, its lease live or not yet rescued).
        Read through a partial index of the running rows (see _count_running_by_worker)."""
        return {worker: count for worker, count in self.conn.execute(_count_running_by_worker)}

    # -- changing -------------------------------------------------------------------------

    def apply_transition(self, transition: Transition, job_id: int,
                         values: Mapping[str, Any], *, lease_token: str | None = None,
                         worker: str | None = None, now_us: int | None = None,
                         alone: bool = False) -> Job | None:
        """Write `values` (from `transition.values`) if the job is in one of the transition's
        from-statuses, held by `worker` under a lease live at `now_us` when the transition is
        a worker's, and under `lease_token` when one is given. None when it is not, or when
        there is no such job. `alone` (one-statement work alone): only if the job has no
        dependents and no key, whose rows its end would change too; if it changed nothing,
        the work runs again in a transaction (need_transaction)."""
        if transition.by_lease_holder and (worker is None or now_us is None):
            raise ValueError(f"{transition.name} needs the worker and the time")
        key = self._take_key()
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
        key = self._take_key()
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

    def find_expired_unclaimed(self, now_us: int, limit: int) -> list[int]:
        """Ids of pending or waiting jobs past their expires_at, soonest expired first
        (locked on PostgreSQL; those another transaction holds are left to it)."""
        return list(self.conn.execute(_select_expired_unclaimed,
                                      {"now": now_us, "limit": limit}).scalars())

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

    def highest_job_id(self) -> int:
        """The highest id given so far (0 with no job): where a bulk action's jobs end."""
        return int(self.conn.execute(select(func.max(jobs.c.id))).scalar() or 0)

    def find_ids_for_bulk(self, *, statuses: Collection[JobStatus], limit: int,
                          job_type: str | None = None, created_before: int | None = None,
                          created_after: int | None = None,
                          ids: Collection[int] | None = None, after_id: int = 0,
                          up_to_id: int | None = None,
                          fingerprint: str | None = None,
                          tag: str | None = None) -> list[int]:
        """Ids of up to `limit` jobs in `statuses` that every filter given matches, lowest
        first, above `after_id` and up to `up_to_id` (locked on PostgreSQL until the
        transaction ends)."""
        stmt = select(jobs.c.id).where(status_is_job(*statuses), jobs.c.id > after_id)
        if up_to_id is not None:
            stmt = stmt.where(jobs.c.id <= up_to_id)
        if job_type is not None:
            stmt = stmt.where(jobs.c.type == job_type)
        if created_before is not None:
            stmt = stmt.where(jobs.c.created_at < created_before)
        if created_after is not None:
            stmt = stmt.where(jobs.c.created_at > created_after)
        if ids is not None:
            stmt = stmt.where(jobs.c.id.in_(list(ids)))
        if fingerprint is not None:
            stmt = stmt.where(last_failed_with(fingerprint))
        if tag is not None:
            stmt = stmt.where(jobs.c.id.in_(select(job_tags.c.job_id)
                                            .where(job_tags.c.tag == tag)))
        stmt = stmt.order_by(jobs.c.id).limit(limit).with_for_update()
        return list(self.conn.execute(stmt).scalars())

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

    def expired_finished(self, *, job_type: str, status: JobStatus, updated_before_us: int,
                         keyed_created_before_us: int, after: tuple[int, int] | None,
                         limit: int) -> list[tuple[int, int]]:
        """Up to `limit` (updated_at, id) of the type's jobs in `status` last changed before
        the cutoff, oldest first, after the position `after`: read through the finished
        jobs' index (ix_jobs_finished_type_status_updated: its predicate is written out, so
        that both planners match it). A job with an idempotency key created since
        `keyed_created_before_us` is left (the idempotency floor). Locked on PostgreSQL,
        skipping rows another process's retention holds: two processes take disjoint
        batches."""
        stmt = select(jobs.c.updated_at, jobs.c.id).where(
            _FINISHED_ROW, status_is_job(status), jobs.c.type == job_type,
            jobs.c.updated_at < updated_before_us,
            or_(jobs.c.idempotency_key.is_(None),
                jobs.c.created_at < keyed_created_before_us))
        if after is not None:
            # The plain bound starts the index range at the position (the row comparison
            # alone is only a filter to PostgreSQL's planner: each batch would walk again
            # the entries of the rows deleted before it).
            stmt = stmt.where(jobs.c.updated_at >= after[0],
                              tuple_(jobs.c.updated_at, jobs.c.id) > tuple_(*after))
        stmt = (stmt.order_by(jobs.c.updated_at, jobs.c.id).limit(limit)
                .with_for_update(skip_locked=True))
        return [(updated_at, job_id) for updated_at, job_id in self.conn.execute(stmt)]

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
