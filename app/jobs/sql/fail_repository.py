"""The SQL of a worker's fail beyond the UPDATE every transition shares
(app/jobs/sql/repository.py): the read that locks the job whose attempt the fail ends, and on
PostgreSQL the one statement of a plain job's whole fail (docs/SCALING.md, What a job costs).

That statement is a data-modifying CTE: it locks the job's row as it is (`held`), moves it
(`moved`: back to pending after its backoff, or failed for good), and from what `moved`
returns, so that nothing is written when the job was not moved, writes what
HistoryRecorder.transition would: the attempt ended (its claim, which the row is about to
lose, with it), the claimed event when only the row told it, the retry_scheduled or failed
event, and the count of its failure group. What Python knows before the statement comes as
parameters (the error, its fingerprint, each retry count's backoff, the events' details
around the times only the row knows: HistoryRecorder.fail_history)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy import (
    BigInteger,
    String,
    bindparam,
    case,
    cast,
    func,
    literal,
    literal_column,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.elements import Grouping

from app.core.statuses import JobStatus
from app.jobs.domain.models import Job
from app.jobs.domain.transitions import Transition
from app.jobs.sql.job_rows import JOB_COLUMNS
from app.jobs.sql.repository import JobRepository, transition_conditions
from app.jobs.timeline.failure_repository import counted_into_groups
from app.jobs.timeline.recorder import FailHistory
from app.jobs.timeline.repository import current_attempt_of
from app.keys.repository import LIVE_KEY, live_key_condition
from app.storage.engine import need_transaction
from app.storage.schema import failure_groups, job_attempts, job_events, job_types, jobs
from app.storage.statements import DriverStatement

_FAIL = Transition.FAIL
_N = len(JOB_COLUMNS)


class JobToEnd(NamedTuple):
    """A running job as a report about to end its attempt read it (its row locked): who asked
    for its cancel (None: nobody), and the outcome of its stored current attempt (None: only
    its row tells it, app/jobs/timeline/row_story.py)."""

    job: Job
    cancel_requested_by: str | None
    stored_attempt: str | None


_select_to_end = (
    select(*JOB_COLUMNS,
           case((jobs.c.cancel_requested_at.is_not(None), jobs.c.cancel_requested_by)),
           current_attempt_of(jobs.c.id))
    .where(jobs.c.id == bindparam("job_id"))
    .with_for_update(of=jobs)
)
_select_to_end_if_live = DriverStatement(_select_to_end.where(live_key_condition()))
_select_to_end_plain = DriverStatement(_select_to_end)


def _rfc3339(micros: Any) -> Any:
    """to_rfc3339 (app/core/clock.py) in PostgreSQL: the text of a time in microseconds since
    the epoch, UTC, always six fraction digits. Whole seconds and microseconds apart: exact
    (a double would round them)."""
    whole = cast(micros, BigInteger)
    million: Any = literal_column("1000000")
    at: Any = (literal_column("TIMESTAMP '1970-01-01'")
               + whole.op("/")(million).op("*")(literal_column("INTERVAL '1 second'"))
               + func.mod(whole, million).op("*")(literal_column("INTERVAL '1 microsecond'")))
    return func.to_char(at, literal_column("""'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'"""))


def _text(name: str) -> Any:
    return bindparam(name, type_=String())


# The backoff after each retry count (0, 1, …): a fail's draw, every count's delay (the row's
# count is only known to the statement).
# (Parenthesised: PostgreSQL reads `$1::BIGINT[][i]` as a type, not as an element.)
_DELAYS: Any = Grouping(bindparam("delays",
                                  type_=postgresql.ARRAY(BigInteger, zero_indexes=True)))
# after_failure's columns (app/jobs/domain/transitions.py) that depend on the row's own values
# (_from_the_row): the count of retries, and the time of the next.
_FROM_THE_ROW = frozenset({"retry_count", "run_at"})
# A job sent back to pending in a fair type gets its round from its first entry, kept since;
# one without (a type made fair since) takes its round in a transaction (app/jobs/tx/key_rules.py).
_ROUND_KEPT = or_(jobs.c.fair_round.is_not(None),
                  ~select(job_types.c.type).where(job_types.c.type == jobs.c.type,
                                                  job_types.c.fairness.is_not(None)).exists())


def _columns_written() -> tuple[list[str], list[str]]:
    """The columns after_failure writes when retries are left, and when none are."""
    return (sorted(_FAIL.values(_running(1), 0, "", 0)),
            sorted(_FAIL.values(_running(0), 0, "", 0)))


def _from_the_row(held: Any) -> dict[str, Any]:
    """after_failure's values that depend on the row (`held`) when retries are left: one
    retry more, due once the backoff its count reached has passed."""
    return {"retry_count": held.c.retry_count + 1,
            "run_at": bindparam("now") + _DELAYS[held.c.retry_count]}


_NO_RETRY_BUDGET = ~(select(job_types.c.type)
                     .where(job_types.c.type == jobs.c.type,
                            job_types.c.retry_budget.is_not(None)).exists())


@functools.cache
def _fail_alone(fenced: bool, key_to_confirm: bool, events: bool) -> Any:
    """The statement of a plain job's fail (see the module's docstring), built once per
    shape. Parameters: job_id, worker, now, held_lease_token (fenced), LIVE_KEY (the key to
    confirm), delays, the columns' values as `retry_<column>` and `final_<column>`, and
    what FailHistory says."""
    held = (
        select(jobs.c.id, jobs.c.claimed_at, jobs.c.worker_id, jobs.c.worker_instance,
               jobs.c.claimed_until, jobs.c.retry_count,
               # Job.has_retries_left, of the row as it is.
               (jobs.c.retry_count < jobs.c.max_retries).label("retrying"),
               current_attempt_of(jobs.c.id, job_attempts.c.number).label("stored_number"))
        .where(jobs.c.id == bindparam("job_id"),
               *transition_conditions(_FAIL, fenced, key_to_confirm, alone=True),
               # Its unique key is neither let go nor entered (app/jobs/tx/attempts.py).
               jobs.c.unique_scope.is_(None), _ROUND_KEPT,
               or_(jobs.c.retry_count >= jobs.c.max_retries,
                   jobs.c.retry_count < func.cardinality(_DELAYS)),
               # A retry of a type with a retry budget takes its slot in a transaction.
               or_(jobs.c.retry_count >= jobs.c.max_retries, _NO_RETRY_BUDGET))
        .with_for_update(of=jobs)
        .cte("held"))
    retrying = held.c.retrying.is_(True)
    retry_columns, final_columns = _columns_written()
    from_the_row = _from_the_row(held)
    assert set(from_the_row) == _FROM_THE_ROW <= set(retry_columns)
    values: dict[str, Any] = {}
    for name in sorted(set(retry_columns) | set(final_columns)):
        column = jobs.c[name]
        if_retried = from_the_row.get(name, bindparam(f"retry_{name}", type_=column.type)
                                      if name in retry_columns else column)
        if_final = (bindparam(f"final_{name}", type_=column.type)
                    if name in final_columns else column)
        values[name] = case((retrying, if_retried), else_=if_final)
    moved = (
        update(jobs).where(jobs.c.id == held.c.id).values(values)
        .returning(*JOB_COLUMNS, held.c.claimed_at.label("held_claimed_at"),
                   held.c.worker_id.label("held_worker"),
                   held.c.worker_instance.label("held_instance"),
                   held.c.claimed_until.label("held_until"), held.c.stored_number)
        .cte("moved"))
    attempt = _attempt_ended(moved)
    ctes = [attempt, _failure_counted(moved)]
    if events:
        ctes.append(_events_written(moved, attempt))
    return select(*(moved.c[column.name] for column in JOB_COLUMNS)).add_cte(*ctes)


def _attempt_ended(moved: Any) -> Any:
    """The attempt ended: stored ended with its claim, or its stored running row ended.
    Returns its job's id and whether it inserted the row (`stored_now`: PostgreSQL's xmax is
    0 on a row an upsert inserted). The conflict is what finds a running row stored since
    the statement's snapshot (a refused report recorded while the fail waited for the row):
    that row is ended, and its claimed event, written with it, is not written again."""
    table = job_attempts
    next_number = (select(func.coalesce(func.max(table.c.number), 0) + 1)
                   .where(table.c.job_id == moved.c.id).scalar_subquery())
    stmt = postgresql.insert(table).from_select(
        ["job_id", "number", "worker_id", "claimed_at", "ended_at", "outcome", "error",
         "fingerprint", "worker_instance"],
        select(moved.c.id, func.coalesce(moved.c.stored_number, next_number),
               moved.c.held_worker, moved.c.held_claimed_at, bindparam("now"),
               _text("outcome"), _text("error"), _text("fingerprint"),
               moved.c.held_instance))
    return stmt.on_conflict_do_update(
        index_elements=[table.c.job_id, table.c.number],
        set_={name: stmt.excluded[name]
              for name in ("ended_at", "outcome", "error", "fingerprint")},
    ).returning(table.c.job_id, literal_column("xmax = 0").label("stored_now")).cte("attempt")


def _failure_counted(moved: Any) -> Any:
    """The attempt counted into its failure group (FailureRepository.record's counts)."""
    ended_failed = case((moved.c.status == literal_column(f"'{JobStatus.FAILED.value}'"),
                         literal(1)), else_=literal(0))
    stmt = postgresql.insert(failure_groups).from_select(
        ["type", "fingerprint", "sample", "count", "jobs_failed", "first_seen", "last_seen"],
        select(moved.c.type, _text("fingerprint"), _text("sample"), literal(1), ended_failed,
               bindparam("now"), bindparam("now")))
    return counted_into_groups(stmt).cte("failure")


def _events_written(moved: Any, attempt: Any) -> Any:
    """The claimed event the row told (unless the attempt's claim was stored with it), then
    the fail's own, in that order."""
    pending = moved.c.status == literal_column(f"'{JobStatus.PENDING.value}'")
    claimed = select(
        literal(0).label("place"), moved.c.id.label("job_id"),
        moved.c.held_claimed_at.label("at"), _text("claimed_event").label("event"),
        moved.c.held_worker.label("actor"),
        func.concat(_text("claimed_before"), _rfc3339(moved.c.held_until),
                    _text("claimed_after")).label("detail"),
    ).select_from(moved.join(attempt, attempt.c.job_id == moved.c.id)).where(
        attempt.c.stored_now.is_(True))
    ended = select(
        literal(1), moved.c.id, bindparam("now"),
        case((pending, _text("retried_event")), else_=_text("failed_event")),
        _text("actor"),
        case((pending, func.concat(_text("retried_before"), _rfc3339(moved.c.run_at),
                                   _text("retried_after"))),
             else_=_text("failed_detail")))
    rows = union_all(claimed, ended).subquery("told")
    return postgresql.insert(job_events).from_select(
        ["job_id", "at", "event", "actor", "detail"],
        select(rows.c.job_id, rows.c.at, rows.c.event, rows.c.actor, rows.c.detail)
        .order_by(rows.c.place)).cte("told_events")


class FailRepository:
    """The fail's SQL on the connection of a job repository, whose caller's key its first
    statement confirms (KeyToConfirm)."""

    def __init__(self, jobs_repo: JobRepository) -> None:
        self.jobs = jobs_repo
        self.conn = jobs_repo.conn

    def job_to_end(self, job_id: int) -> JobToEnd | None:
        """The job, its row locked, with who asked for its cancel and its stored current
        attempt (JobToEnd); None when there is no such job."""
        key = self.jobs.take_key_to_confirm()
        if key is None:
            rows = _select_to_end_plain.rows(self.conn, {"job_id": job_id})
        else:
            rows = _select_to_end_if_live.rows(self.conn,
                                               {"job_id": job_id, LIVE_KEY: key.digest})
            key.answered(bool(rows))
        if not rows:
            return None
        row = rows[0]
        return JobToEnd(Job(*row[:_N]), row[_N], row[_N + 1])

    def fail_alone(self, job_id: int, *, worker: str, now_us: int, lease_token: str | None,
                   history: FailHistory, delays: Sequence[int], actor: str) -> Job | None:
        """A plain job's whole fail in one statement (PostgreSQL; see the module's
        docstring): the job as it left it. When it changed nothing (not held, not plain, a
        retry count past `delays`, a revoked key), the work runs again in a transaction
        (need_transaction), which asks why."""
        key = self.jobs.take_key_to_confirm()
        stmt = _fail_alone(lease_token is not None, key is not None, history.events)
        retry_stand_in = _FAIL.values(_running(1), now_us, history.error, 0)
        final_stand_in = _FAIL.values(_running(0), now_us, history.error, 0)
        params: dict[str, Any] = {
            "job_id": job_id, "worker": worker, "now": now_us,
            "held_lease_token": lease_token, "delays": list(delays),
            "outcome": history.outcome, "error": history.error,
            "fingerprint": history.fingerprint, "sample": history.sample, "actor": actor,
            "claimed_event": history.claimed[0], "claimed_before": history.claimed[1],
            "claimed_after": history.claimed[2], "retried_event": history.retried[0],
            "retried_before": history.retried[1], "retried_after": history.retried[2],
            "failed_event": history.failed[0], "failed_detail": history.failed[1],
            **{f"retry_{name}": value for name, value in retry_stand_in.items()
               if name not in _FROM_THE_ROW},
            **{f"final_{name}": value for name, value in final_stand_in.items()}}
        if key is not None:
            params[LIVE_KEY] = key.digest
        row = self.conn.execute(stmt, params).first()
        if row is None:
            # Nothing changed: the fail goes on in a transaction, which asks why (the key,
            # the lease, a cancel, dependents or a key to settle) where it can act on it.
            need_transaction(self.conn)
        if key is not None:
            key.answered(row is not None)
        return None if row is None else Job(*row[:_N])


def _running(max_retries: int) -> Job:
    """A running job with `max_retries` retries and none used: after_failure's columns for
    it are those of a job with retries left (1) or none (0), its row's own values aside."""
    return Job(0, "", "", 0, JobStatus.RUNNING.value, 0, max_retries, "", None, None, 0, 0,
               "", 0, None, None, None, 0, 0)

