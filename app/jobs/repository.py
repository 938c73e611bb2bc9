"""The only place job SQL lives. Every method runs on the connection (and transaction) it is given.

Values from requests are always bound parameters. Statuses, which come from JobStatus and
never from a request, are written as literals: the planners only use a partial index when
the query's WHERE repeats the index's own literal ('pending', 'running'). Every change of a
job's status goes through apply_transition or the claim, each made from its Transition.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, NamedTuple

from sqlalchemy import (
    BigInteger,
    Connection,
    String,
    and_,
    bindparam,
    case,
    cast,
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

from app.core.clock import MICROS
from app.core.statuses import STATUS_BITS, JobStatus, claim_order_key
from app.core.tracecontext import Trace
from app.jobs.context_repository import TRACE, trace_of
from app.jobs.control_repository import CHECKPOINT, CONTROL_COLUMNS, controls_from
from app.jobs.flow import ClaimLimits
from app.jobs.models import BoundedCount, Job, JobControls, PendingSummary
from app.jobs.report_pace import HEARTBEAT_SPACING_US
from app.jobs.timeline.failure_repository import last_failed_with
from app.jobs.transitions import Transition
from app.keys.repository import LIVE_KEY, KeyToConfirm, live_key_condition
from app.storage.chunks import chunked
from app.storage.dialects import conflict_insert_for, writers_serialised
from app.storage.engine import need_transaction
from app.storage.integrity import refused_in_savepoint, unique_indexes_translated
from app.storage.schema import (
    UNIQUE_HOLDER_PREDICATE,
    claim_order_columns,
    job_dependencies,
    job_tags,
    job_types,
    jobs,
    key_turns,
)
from app.storage.statements import DriverStatement

# The columns of the Job record, the first of the table's: what every statement here reads of
# a job. The later ones (a cancel request, progress) only the reads that show them ask for,
# so that the claim never reads them (app/jobs/control_repository.py).
JOB_COLUMNS = tuple(jobs.c)[:len(dataclasses.fields(Job))]
assert [column.name for column in JOB_COLUMNS] == [f.name for f in dataclasses.fields(Job)]


def _status_is(*statuses: JobStatus) -> Any:
    """The status condition, the statuses written as literals (see the module's docstring)."""
    return _status_is_of(jobs, statuses)


def _status_is_of(table: Any, statuses: Collection[JobStatus]) -> Any:
    literals: list[Any] = [literal_column(f"'{status.value}'") for status in statuses]
    return table.c.status == literals[0] if len(literals) == 1 else table.c.status.in_(literals)


_CLAIMABLE_ROW = _status_is(*Transition.CLAIM.from_statuses)
# A job_types row that puts its type under flow control (TypeSettings.is_limited): a claim of
# the type must look at it. The one spelling of it in SQL (app/types/repository.py reads these
# rows with it): a cap or a rate, whose claims count what runs; or paused, pushed (only the
# dispatcher's claims take it) or fair (its claims read round order).
COUNTS_RUNNING_TYPE = or_(job_types.c.max_running.is_not(None),
                          job_types.c.max_running_per_key.is_not(None),
                          job_types.c.rate_per_second.is_not(None))
PAUSED_PUSHED_OR_FAIR_TYPE = or_(job_types.c.paused.is_(True),
                                 job_types.c.push_url.is_not(None),
                                 job_types.c.fairness.is_not(None))
# The condition of a claim made without reading the types' rows (this process's copy of them
# showed none under flow control, app/types/settings_copy.py): the job's type is under none
# at the statement's own moment, so a pause, a cap, a rate or a push url set on another host
# stops such claims of the type at once. One probe of job_types' key per candidate.
_TYPE_FREE = ~(select(job_types.c.type)
               .where(job_types.c.type == jobs.c.type,
                      or_(PAUSED_PUSHED_OR_FAIR_TYPE, COUNTS_RUNNING_TYPE))
               .exists())
# A job past its expires_at is never handed out (docs/JOBS.md): every claim's candidates and
# its UPDATE say so, at the claim's own moment; the maintenance loop cancels such jobs.
_NOT_EXPIRED = or_(jobs.c.expires_at.is_(None), jobs.c.expires_at > bindparam("now"))
# Listed with their status as a literal, which matches their partial indexes of ids
# (ix_jobs_failed_id, ix_jobs_cancelled_id): few among many stored, found at once. The other
# statuses stay bound: completed and pending jobs are common, found soonest walking the ids,
# and a literal 'pending' would lead the planners to a partial index in claim order and a
# sort of every pending row. Running jobs are listed through _running_ids.
_LISTED_THROUGH_PARTIAL_INDEX = frozenset({JobStatus.FAILED.value, JobStatus.CANCELLED.value})
_RESCUABLE_ROW = _status_is(*Transition.RESCUE.from_statuses)
_CLAIM_ORDER = claim_order_columns(jobs)
_PENDING: Any = literal_column("'pending'")
_RUNNING: Any = literal_column("'running'")
# In the order of the partial index's own IN list, which is what the planners match.
_FINISHED: list[Any] = [literal_column(f"'{status.value}'") for status in
             (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)]
# The predicate of the finished jobs' partial index, as written there: a query that repeats it
# is matched to the index by both planners.
_FINISHED_ROW = jobs.c.status.in_(_FINISHED)

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


def _capped_lease(claimed_at: Any, wanted: Any) -> Any:
    """The lease `wanted`, but never past the attempt's deadline, claimed_at +
    timeout_seconds (docs/JOBS.md, Running jobs): the claim's and every heartbeat's."""
    deadline = claimed_at + cast(jobs.c.timeout_seconds, BigInteger) * MICROS
    return case((and_(jobs.c.timeout_seconds.is_not(None), deadline < wanted), deadline),
                else_=wanted)


# Unclaimed jobs past their expiry, through their partial index (its predicate's own text).
_select_expired_unclaimed = (
    select(jobs.c.id)
    .where(jobs.c.status.in_([literal_column("'pending'"), literal_column("'waiting'")]),
           jobs.c.expires_at.is_not(None), jobs.c.expires_at <= bindparam("now"))
    .order_by(jobs.c.expires_at)
    .limit(bindparam("limit"))
    .with_for_update(skip_locked=True)
)


def _pending_due(restricted_to_one_type: bool) -> Any:
    """Pending jobs that are due, in claim order (of one type: read through its own index)."""
    stmt = select(jobs.c.id, jobs.c.priority, jobs.c.created_at).where(
        _CLAIMABLE_ROW, jobs.c.run_at <= bindparam("now"), _NOT_EXPIRED)
    if restricted_to_one_type:
        stmt = stmt.where(jobs.c.type == bindparam("type"))
    return stmt.order_by(*_CLAIM_ORDER)


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
        stmt = select(jobs.c.run_at).where(_CLAIMABLE_ROW, *conditions)
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

_due_probe_any_type = _pending_due(restricted_to_one_type=False).limit(1)
_due_probe_one_type = _pending_due(restricted_to_one_type=True).limit(1)
_due_probe_any_free_type = _due_probe_any_type.where(_TYPE_FREE)
_due_probe_one_free_type = _due_probe_one_type.where(_TYPE_FREE)

# Candidates of one type for a claim; PostgreSQL locks them, skipping rows other claims hold.
_candidates_one_type = (
    _pending_due(restricted_to_one_type=True)
    .limit(bindparam("limit"))
    .with_for_update(skip_locked=True)
)

# Candidates of one type under a per-key cap: keys already at their cap are left out here, so
# a claim of one job always finds the first allowed one; a claim of several may still meet a
# key twice and pass over its second job (ClaimLimits.pick).
_not_a_full_key = or_(jobs.c.concurrency_key.is_(None),
                      jobs.c.concurrency_key.not_in(bindparam("full_keys", expanding=True)))
_candidates_one_type_by_key = (
    select(jobs.c.id, jobs.c.priority, jobs.c.created_at, jobs.c.concurrency_key)
    .where(jobs.c.status == _PENDING, jobs.c.run_at <= bindparam("now"),
           jobs.c.type == bindparam("type"), _not_a_full_key, _NOT_EXPIRED)
    .order_by(*_CLAIM_ORDER)
    .limit(bindparam("limit"))
    .with_for_update(skip_locked=True)
)
# A fair type's candidates (docs/FLOW-CONTROL.md), in round order: priority, then round, then (keys
# per producer) the round among its producer's keys, then claim order, read through its own
# partial index (app/jobs/key_rules.py gives the rounds).
_FAIR_ORDER = (jobs.c.priority.desc(), jobs.c.fair_round, jobs.c.fair_key_round,
               jobs.c.created_at, jobs.c.id)
_fair_candidates = (
    select(jobs.c.id, jobs.c.priority, jobs.c.created_at, jobs.c.concurrency_key)
    .where(jobs.c.status == _PENDING, jobs.c.fair_round >= literal_column("0"),
           jobs.c.run_at <= bindparam("now"), jobs.c.type == bindparam("type"), _NOT_EXPIRED)
    .order_by(*_FAIR_ORDER)
    .limit(bindparam("limit"))
    .with_for_update(skip_locked=True)
)
_fair_candidates_by_key = _fair_candidates.where(_not_a_full_key)


class Candidate(NamedTuple):
    """A pending job a claim may take, with what choosing among candidates reads."""

    id: int
    priority: int
    created_at: int
    concurrency_key: str | None = None


# The same candidates read on SQLite's driver cursor (app/storage/statements.py): a claim of
# a type under flow control reads one per type, where the claim of any type runs one
# statement in all.
_driver_candidates_one_type = DriverStatement(_candidates_one_type)
_driver_candidates_one_free_type = DriverStatement(_candidates_one_type.where(_TYPE_FREE))
_driver_fair_candidates = DriverStatement(_fair_candidates)


def _candidates(conn: Connection, stmt: DriverStatement,
                params: Mapping[str, Any]) -> list[Candidate]:
    return [Candidate(*row) for row in stmt.rows(conn, params)]
_due_probe_one_type_by_key = (
    select(jobs.c.id)
    .where(jobs.c.status == _PENDING, jobs.c.run_at <= bindparam("now"),
           jobs.c.type == bindparam("type"), _not_a_full_key, _NOT_EXPIRED)
    .order_by(*_CLAIM_ORDER)
    .limit(1)
)
# A claim-many under per-key caps reads further down a type's claim order while the keys it
# meets are full, up to this many candidates, so that one busy key cannot make it scan the
# whole backlog.
MAX_GATED_CANDIDATES = 1024

# Counted through the partial index of running rows by (type, concurrency_key). Every type
# at once: the running rows are as many as the workers hold, and a statement without an
# expanding IN is compiled once and served from the cache on every claim.
_count_running = (
    select(jobs.c.type, jobs.c.concurrency_key, func.count())
    .where(jobs.c.status == _RUNNING)
    .group_by(jobs.c.type, jobs.c.concurrency_key)
)
# The same rows by worker (GET /workers, the dashboard, explain). As a plain GROUP BY
# worker_id, SQLite's planner walks the whole (worker_id, id) index to avoid a sort: half a
# second at a million stored jobs. Materialized first, the running rows come from a partial
# index and only they are grouped.
_running_workers = (select(jobs.c.worker_id).where(jobs.c.status == _RUNNING)
                    .cte("running_workers").prefix_with("MATERIALIZED"))
_count_running_by_worker = (select(_running_workers.c.worker_id, func.count())
                            .group_by(_running_workers.c.worker_id))
# The running jobs' ids, for a listing of them: as many as the workers hold, read from their
# partial index and then looked up by id, rather than found by walking every id (they are
# the newest) or every job of a producer.
_running_ids = (select(jobs.c.id).where(jobs.c.status == _RUNNING)
                .cte("running_ids").prefix_with("MATERIALIZED"))


@functools.cache
def _count_running_along(cte: Any) -> Any:
    return _count_running.add_cte(cte)


# The earliest lease of one type's running jobs: its running rows, through the same index.
_next_lease_expiry = (
    select(func.min(jobs.c.lease_expires_at))
    .where(jobs.c.status == _RUNNING, jobs.c.type == bindparam("type"))
)
# Every type's pending jobs, its scheduled ones and its oldest due run_at, from the per-type
# claim-order index (run_at is its last column), grouped in the index's own type-first order:
# what the backlog counts (app/jobs/counts.py) read, unconfigured types included.
_pending_by_type = (
    select(jobs.c.type, func.count(),
           func.coalesce(func.sum(case((jobs.c.run_at > bindparam("now"), 1), else_=0)), 0),
           func.min(case((jobs.c.run_at <= bindparam("now"), jobs.c.run_at))))
    .where(jobs.c.status == _PENDING)
    .group_by(jobs.c.type)
)
# Every type's waiting jobs, from their partial index alone.
_count_waiting = (
    select(jobs.c.type, func.count())
    .where(jobs.c.status == literal_column("'waiting'"))
    .group_by(jobs.c.type)
)
# Every type's reserved jobs, from their partial index alone.
_count_reserved = (
    select(jobs.c.type, func.count())
    .where(jobs.c.status == literal_column("'reserved'"))
    .group_by(jobs.c.type)
)
_count_finished = (
    select(jobs.c.type, jobs.c.status, func.count())
    .where(jobs.c.status.in_(_FINISHED))
    .group_by(jobs.c.type, jobs.c.status)
)

_CLAIMED_VALUES = Transition.CLAIM.values(
    now_us=bindparam("now"),
    worker=bindparam("worker"),
    lease_expires_at=_capped_lease(bindparam("now"), bindparam("lease_expires_at")),
    # One token per job and attempt: the claim's random nonce, then the job's id.
    lease_token=bindparam("nonce", type_=String) + "." + cast(jobs.c.id, String),
)


def _claim_next_any_type(key_to_confirm: bool, *, free_types_only: bool = False) -> Any:
    # PostgreSQL renders FOR UPDATE SKIP LOCKED, so concurrent claims pass over each other's
    # rows instead of queueing on them; SQLite renders nothing and relies on BEGIN IMMEDIATE.
    # MATERIALIZED makes the candidates a fixed set: as a plain subquery PostgreSQL may
    # re-run it for each row it updates, and with SKIP LOCKED each re-run finds new rows,
    # so one claim would take more jobs than its LIMIT.
    candidates = (
        select(jobs.c.id)
        .where(_CLAIMABLE_ROW, jobs.c.run_at <= bindparam("now"), _NOT_EXPIRED,
               *([_TYPE_FREE] if free_types_only else []))
        .order_by(*_CLAIM_ORDER)
        .limit(bindparam("limit"))
        .with_for_update(skip_locked=True)
        .cte("candidates")
        .prefix_with("MATERIALIZED")
    )
    claim = update(jobs).where(jobs.c.id.in_(select(candidates.c.id)), _CLAIMABLE_ROW)
    if key_to_confirm:
        claim = claim.where(live_key_condition())
    return claim.values(_CLAIMED_VALUES).returning(*_CLAIMED_COLUMNS)


# A claimed job comes back with the checkpoint its previous attempt saved (docs/JOBS.md) and
# the trace context it was enqueued with (docs/TRACING.md), in this order after its columns.
_CLAIMED_COLUMNS = (*JOB_COLUMNS, CHECKPOINT, *TRACE)
_claim_any_type = DriverStatement(_claim_next_any_type(key_to_confirm=False))
_claim_any_free_type = DriverStatement(
    _claim_next_any_type(key_to_confirm=False, free_types_only=True))
# Jobs already chosen (and, on PostgreSQL, locked) by id.
# One job chosen (a claim of one): on SQLite's driver cursor, as the claim of any type is.
_claim_chosen_one = DriverStatement(
    update(jobs)
    .where(jobs.c.id == bindparam("chosen_id"), _CLAIMABLE_ROW, _NOT_EXPIRED)
    .values(_CLAIMED_VALUES)
    .returning(*_CLAIMED_COLUMNS)
)
_claim_chosen = (
    update(jobs)
    .where(jobs.c.id.in_(bindparam("ids", expanding=True)), _CLAIMABLE_ROW, _NOT_EXPIRED)
    .values(_CLAIMED_VALUES)
    .returning(*_CLAIMED_COLUMNS)
)
# The same claims, made only while the caller's key is live (KeyToConfirm).
_claim_any_type_if_live = DriverStatement(_claim_next_any_type(key_to_confirm=True))
_claim_any_free_type_if_live = DriverStatement(
    _claim_next_any_type(key_to_confirm=True, free_types_only=True))
_claim_chosen_one_if_live = DriverStatement(
    _claim_chosen_one.statement.where(live_key_condition()))
_claim_chosen_if_live = _claim_chosen.where(live_key_condition())

# A waiting job whose every dependency has finished becomes pending (Transition.RELEASE): the
# condition and the change in one statement, built once. No unique check is needed: a waiting
# job holds its unique key exactly when a pending one would (app/core/statuses.py).
_no_unfinished_dependency = ~(select(job_dependencies.c.job_id)
                              .where(job_dependencies.c.job_id == jobs.c.id,
                                     job_dependencies.c.resolved == literal_column("0"))
                              .exists())
# Nor is a job of an ordered key released while its key's turn is another job's
# (docs/FLOW-CONTROL.md, Ordered keys): it waits for its turn, which app/jobs/key_rules.py
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
           _status_is(*Transition.RELEASE.from_statuses), _no_unfinished_dependency,
           _not_behind_a_turn)
    .values(_RELEASED_VALUES)
    .returning(*JOB_COLUMNS)
)
_release_many = (
    update(jobs)
    .where(jobs.c.id.in_(bindparam("released_ids", expanding=True)),
           _status_is(*Transition.RELEASE.from_statuses), _no_unfinished_dependency,
           _not_behind_a_turn)
    .values(_RELEASED_VALUES)
    .returning(*JOB_COLUMNS)
)

# A job an admin's retry made pending, with a dependency still unfinished (it was cancelled
# by another one's failure): waiting again, in the retry's own transaction.
_wait_again = (
    update(jobs)
    .where(jobs.c.id.in_(bindparam("retried_ids", expanding=True)),
           jobs.c.status == _PENDING, ~_no_unfinished_dependency)
    .values(status=literal_column("'waiting'"))
    .returning(*JOB_COLUMNS)
)

# The claim's own stamps moved to the moment it held its locks (JobService.claim).
_restamp_claimed = (
    update(jobs)
    .where(jobs.c.id.in_(bindparam("ids", expanding=True)), jobs.c.status == _RUNNING)
    .values(claimed_at=bindparam("now"),
            lease_expires_at=_capped_lease(bindparam("now"), bindparam("lease_expires_at")),
            claimed_until=_capped_lease(bindparam("now"), bindparam("lease_expires_at")),
            updated_at=bindparam("now"))
    .returning(*JOB_COLUMNS)
)


# A heartbeat is taken when it is due (app/jobs/report_pace.py): the first of its attempt
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
                          alone: bool = False) -> list[Any]:
    """The conditions, besides its id, under which a row of `jobs` may take `transition`
    (the flags as _transition_update's): one of the statuses it starts from and, for a
    worker's report, the job held by the worker (parameter `worker`) under a lease live at
    `now` (and `held_lease_token`, when `fenced`), its cancel not requested for a complete
    or a fail. For the statements that move a job one way or another (app/jobs/
    fail_repository.py) as for the UPDATE here."""
    conditions = [_status_is(*transition.from_statuses)]
    if key_to_confirm:
        conditions.append(live_key_condition())
    if transition.by_lease_holder:
        conditions += [jobs.c.worker_id == bindparam("worker"),
                       jobs.c.lease_expires_at > bindparam("now")]
    if fenced:
        conditions.append(jobs.c.lease_token == bindparam("held_lease_token"))
    if transition in (Transition.COMPLETE, Transition.FAIL):
        # A job whose cancel was requested ends cancelled, whatever its holder reports
        # (Transition.STOP).
        conditions.append(jobs.c.cancel_requested_at.is_(None))
    if alone:
        conditions += [jobs.c.has_dependents.is_(None), jobs.c.concurrency_key.is_(None)]
    return conditions


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
    conditions = transition_conditions(transition, fenced, key_to_confirm, alone)
    values: dict[str, Any] = {name: bindparam(f"new_{name}") for name in sorted(columns)}
    returned: tuple[Any, ...] = JOB_COLUMNS
    if transition is Transition.HEARTBEAT:
        # Its lease capped at the attempt's deadline; its progress, if any, among `columns`;
        # and its controls returned (its cancel requested?).
        values["lease_expires_at"] = _capped_lease(jobs.c.claimed_at,
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


_JOB_COLUMNS = len(JOB_COLUMNS)


def _job(row: Any) -> Job:
    return Job(*row[:_JOB_COLUMNS])


class ClaimedRows(NamedTuple):
    """What a claim took: its jobs in claim order, the checkpoints their previous attempts
    saved (compact JSON, by job id; a job without one is not in it), and the trace contexts
    they were enqueued with (by job id; likewise)."""

    jobs: list[Job]
    checkpoints: dict[int, str]
    traces: dict[int, Trace]


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
    made = sorted(map(_job, returned), key=lambda job: job.id)
    if len(made) == len(rows) and all(
            getattr(job, name) == row.get(name)
            for job, row in zip(made, rows, strict=True) for name in _TELLING_COLUMNS):
        return made
    by_values: dict[tuple[Any, ...], list[Job]] = {}
    names = sorted(rows[0])
    for job in reversed(made):
        by_values.setdefault(tuple(getattr(job, name) for name in names), []).append(job)
    return [by_values[tuple(row[name] for name in names)].pop() for row in rows]


# PostgreSQL's deadlock_detected and serialization_failure: the transaction is undone whole
# and may simply run again.
_RETRYABLE_SQLSTATES = frozenset({"40P01", "40001"})


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
    ).where(others.c.id.in_(batch), _status_is_of(others, transition.from_statuses),
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
            .where(jobs.c.id.in_(ids), _status_is(*transition.from_statuses),
                   ~_takes_a_held_key(transition, status, ids))
            .values({name: bindparam(f"new_{name}") for name in sorted(columns)})
            .returning(*JOB_COLUMNS))


class JobRepository:
    """Job SQL on one connection. Methods returning `Job | None` return None for "no such row"
    (or, for conditional updates, "the row was not in the expected state")."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        # The caller's key, to be confirmed live by the next statement of a step that folds
        # it in (insert_job, claim_next_jobs, apply_transition, extend_lease, get_job for
        # update); None once confirmed, or when nobody asked.
        self.key_to_confirm: KeyToConfirm | None = None

    def take_key_to_confirm(self) -> KeyToConfirm | None:
        """The caller's key for the statement about to fold it in (see key_to_confirm),
        which then tells it what it found (KeyToConfirm.answered)."""
        key, self.key_to_confirm = self.key_to_confirm, None
        return key

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
            return _job(row)
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
        return _job(row)

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
                return [_job(row) for row in self.conn.execute(stmt, list(rows))]
        except DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) in _RETRYABLE_SQLSTATES:
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
        key = self.take_key_to_confirm() if for_update else None
        if key is None:
            stmt = _select_by_id_for_update if for_update else _select_by_id
            row = self.conn.execute(stmt, {"job_id": job_id}).first()
        else:
            row = self.conn.execute(_select_by_id_for_update_if_live,
                                    {"job_id": job_id, LIVE_KEY: key.digest}).first()
            key.answered(row is not None)
        return None if row is None else _job(row)

    def jobs_by_ids(self, job_ids: Collection[int]) -> list[Job]:
        """These jobs (those that exist), by id."""
        found: list[Job] = []
        for chunk in chunked(sorted(job_ids)):
            stmt = select(*JOB_COLUMNS).where(jobs.c.id.in_(chunk)).order_by(jobs.c.id)
            found += [_job(row) for row in self.conn.execute(stmt)]
        return found

    def find_by_idempotency_key(self, producer: str, idempotency_key: str) -> Job | None:
        row = self.conn.execute(
            _select_by_idempotency_key,
            {"producer": producer, "idempotency_key": idempotency_key},
        ).first()
        return None if row is None else _job(row)

    def find_unique_holder(self, producer: str, unique_scope: str) -> Job | None:
        """The producer's job that holds this unique scope now (in one of its while
        statuses); None when no job does."""
        row = self.conn.execute(_select_unique_holder,
                                {"producer": producer, "unique_scope": unique_scope}).first()
        return None if row is None else _job(row)

    def find_unique_holders(self, producer: str, scopes: Collection[str]) -> dict[str, Job]:
        """The producer's jobs holding these unique scopes now, by scope."""
        if not scopes:
            return {}
        stmt = select(*JOB_COLUMNS).where(jobs.c.producer == producer,
                                  jobs.c.unique_scope.in_(list(scopes)), _unique_holder)
        return {job.unique_scope or "": job for job in map(_job, self.conn.execute(stmt))}

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
            stmt = stmt.where(_status_is(JobStatus(status)))
        elif status == JobStatus.RUNNING.value:
            stmt = stmt.where(jobs.c.id.in_(select(_running_ids.c.id)))
        elif status is not None:
            stmt = stmt.where(jobs.c.status == status)
        if job_type is not None:
            stmt = stmt.where(jobs.c.type == job_type)
        stmt = stmt.order_by(ids.desc() if descending else ids).limit(limit)
        return [_job(row) for row in self.conn.execute(stmt)]

    def find_by_idempotency_keys(self, producer: str, keys: Collection[str]) -> dict[str, Job]:
        """The producer's jobs with these idempotency keys, by key."""
        if not keys:
            return {}
        stmt = select(*JOB_COLUMNS).where(jobs.c.producer == producer,
                                  jobs.c.idempotency_key.in_(list(keys)))
        # Every row found has a key: it was found by its key.
        return {job.idempotency_key or "": job for job in map(_job, self.conn.execute(stmt))}

    def has_claimable_work(self, now_us: int, types: Collection[str] | None,
                           limits: ClaimLimits | None = None, *,
                           free_types_only: bool = False) -> bool:
        """True when a claim now could find a job: a due pending one (a job whose lease ran
        out is pending again once the maintenance loop rescues it). Index probes only;
        cheap enough to poll while claims wait. `types=None` means any type. Under `limits`
        (with `types` then the wanted ones, every configured type when any is), only work
        they allow counts: a waiting claim must not wake for jobs it may not take.
        `free_types_only`: only jobs of types under no flow control now count (the claim's
        condition when it read no type's row)."""
        any_type, one_type = ((_due_probe_any_free_type, _due_probe_one_free_type)
                              if free_types_only else (_due_probe_any_type, _due_probe_one_type))
        if types is None:
            return self.conn.execute(any_type, {"now": now_us}).first() is not None
        if limits is not None:
            types = limits.allowed(types)
        for job_type in sorted(types):
            full_keys = limits.full_keys(job_type) if limits is not None else []
            stmt, params = one_type, {"now": now_us, "type": job_type}
            if full_keys:
                stmt, params = _due_probe_one_type_by_key, {**params, "full_keys": full_keys}
            if self.conn.execute(stmt, params).first() is not None:
                return True
        return False

    def has_due_work_of(self, job_type: str, now_us: int,
                        concurrency_keys: Collection[str] | None = None) -> bool:
        """True when a job of this type (and, when given, of one of these keys) is due."""
        if concurrency_keys is None:
            return self.conn.execute(
                _due_probe_one_type, {"now": now_us, "type": job_type}).first() is not None
        stmt = (select(jobs.c.id)
                .where(jobs.c.status == _PENDING, jobs.c.run_at <= now_us,
                       or_(jobs.c.expires_at.is_(None), jobs.c.expires_at > now_us),
                       jobs.c.type == job_type,
                       jobs.c.concurrency_key.in_(sorted(concurrency_keys)))
                .limit(1))
        return self.conn.execute(stmt).first() is not None

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
        return [_job(row) for row in rows]

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

    def claim_next_jobs(self, *, now_us: int, worker: str, lease_expires_at: int, nonce: str,
                        limit: int, types: Collection[str] | None,
                        limits: ClaimLimits | None = None,
                        free_types_only: bool = False) -> ClaimedRows:
        """Mark up to `limit` claimable jobs running for `worker`, returned in claim order
        with their checkpoints.

        `types=None` means any type. Under flow control's `limits` (with `types` then the
        wanted ones, every configured type when any is), each of the types they allow is
        read within its budget, its full keys left out and no key taken beyond its cap.
        Must run in a write transaction (BEGIN IMMEDIATE on SQLite), which makes the read of
        the candidates and their update one step. `free_types_only` (a claim that read no
        type's row): only jobs of types under no flow control now are taken.
        """
        params: dict[str, Any] = {
            "now": now_us, "worker": worker, "lease_expires_at": lease_expires_at,
            "nonce": nonce, "limit": limit,
        }
        rows: Sequence[Any]
        if types is None:
            key = self.take_key_to_confirm()
            if key is not None:
                params[LIVE_KEY] = key.digest
            if free_types_only:
                claim = _claim_any_free_type if key is None else _claim_any_free_type_if_live
            else:
                claim = _claim_any_type if key is None else _claim_any_type_if_live
            rows = claim.rows(self.conn, params)
            if key is not None:
                key.answered(bool(rows))
        else:
            if limits is not None:
                types = limits.allowed(types)
            # Each type's candidates through its own index, then the most urgent of all of
            # them: one query over several types would have to read every pending job of
            # those types to sort them. Merged, not sorted: a fair type's candidates keep
            # their round order among themselves.
            candidates = heapq.merge(*(
                self._candidates_of(job_type, params, limits, free_types_only)
                for job_type in sorted(types)),
                key=claim_order_key)
            chosen = [row.id for row in itertools.islice(candidates, limit)]
            if not chosen:
                return ClaimedRows([], {}, {})
            key = self.take_key_to_confirm()
            if key is not None:
                params[LIVE_KEY] = key.digest
            if len(chosen) == 1:
                claim_one = _claim_chosen_one if key is None else _claim_chosen_one_if_live
                rows = claim_one.rows(self.conn, {**params, "chosen_id": chosen[0]})
            else:
                rows = self.conn.execute(_claim_chosen if key is None else _claim_chosen_if_live,
                                         {**params, "ids": chosen}).all()
            if key is not None:
                key.answered(bool(rows))
        claimed = [_job(row) for row in rows]
        # RETURNING gives no order; hand the jobs out in claim order.
        claimed.sort(key=claim_order_key)
        checkpoint, traceparent, tracestate = _JOB_COLUMNS, _JOB_COLUMNS + 1, _JOB_COLUMNS + 2
        return ClaimedRows(
            claimed,
            {row[0]: row[checkpoint] for row in rows if row[checkpoint] is not None},
            {row[0]: trace for row in rows
             if (trace := trace_of(row[traceparent], row[tracestate])) is not None})

    def restamp_claimed(self, claimed: list[Job], *, now_us: int,
                        lease_expires_at: int) -> list[Job]:
        """The jobs this transaction just claimed, claimed at `now_us` instead, with their
        lease from then (a claim that waited for a lock before its commit), in their order."""
        if not claimed:
            return []
        rows = self.conn.execute(_restamp_claimed, {
            "ids": [job.id for job in claimed], "now": now_us,
            "lease_expires_at": lease_expires_at}).all()
        by_id = {row.id: _job(row) for row in rows}
        return [by_id[job.id] for job in claimed]

    def _candidates_of(self, job_type: str, params: dict[str, Any],
                       limits: ClaimLimits | None, free_types_only: bool = False) -> list[Any]:
        """One type's candidates in claim order: within its budget, as LIMIT; without its
        full keys, as a condition; a key met more often than its cap allows passed over."""
        if limits is None:
            return _candidates(self.conn, _driver_candidates_one_free_type if free_types_only
                               else _driver_candidates_one_type, {**params, "type": job_type})
        budget = limits.budget(job_type, params["limit"])
        if budget <= 0:
            return []
        full_keys = limits.full_keys(job_type)
        fair = job_type in limits.fair
        if job_type not in limits.key_caps:
            return _candidates(
                self.conn, _driver_fair_candidates if fair else _driver_candidates_one_type,
                {**params, "type": job_type, "limit": budget})
        by_key = _fair_candidates_by_key if fair else _candidates_one_type_by_key
        fetch = budget
        while True:
            rows = list(self.conn.execute(by_key, {
                **params, "type": job_type, "limit": fetch, "full_keys": full_keys}))
            chosen = limits.pick(job_type, rows, budget)
            if len(chosen) >= budget or len(rows) < fetch or fetch >= MAX_GATED_CANDIDATES:
                return chosen
            fetch = min(fetch * 4, MAX_GATED_CANDIDATES)

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
        return None if row is None else _job(row)

    def extend_lease(self, job_id: int, values: Mapping[str, Any], *, worker: str,
                     now_us: int, lease_token: str | None) -> tuple[Job, JobControls] | None:
        """A heartbeat (Transition.HEARTBEAT's `values`, with its progress's columns when it
        reports any), its lease capped at the attempt's deadline: the job and its controls
        (its cancel requested?); None when the worker does not hold it, or when it does and
        the heartbeat is not due yet (app/jobs/report_pace.py)."""
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
        return _job(row), controls_from(job_id, row[_JOB_COLUMNS:])

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
        return sorted(map(_job, rows), key=lambda job: job.id)

    def wait_again(self, retried: list[Job]) -> list[Job]:
        """These jobs, which an admin's retry just made pending, with those that still have
        an unfinished dependency made waiting again (a retry runs the job, not its
        dependencies': it waits for them as before); in their order."""
        if not retried:
            return []
        waiting: dict[int, Job] = {}
        for chunk in chunked([job.id for job in retried]):
            waiting.update((row.id, _job(row)) for row in self.conn.execute(
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
        stmt = select(jobs.c.id).where(_status_is(*statuses), jobs.c.id > after_id)
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
            changed += sorted((_job(row) for row in rows), key=lambda job: job.id)
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
            _FINISHED_ROW, _status_is(status), jobs.c.type == job_type,
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
