"""The SQL of fair share and ordered keys (docs/FLOW-CONTROL.md): each ordered key's turn
(key_turns) and the rounds of a fair type's pending jobs. Every method runs on the transaction it is
given; the rules that call them are app/jobs/key_rules.py."""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    and_,
    bindparam,
    case,
    column,
    delete,
    func,
    literal_column,
    select,
    union_all,
    update,
    values,
)

from app.storage.dialects import conflict_insert_for, is_sqlite, writers_serialised
from app.storage.schema import job_dependencies, jobs, key_turns
from app.storage.statements import DriverStatement

_PENDING: Any = literal_column("'pending'")
_WAITING: Any = literal_column("'waiting'")
_RUNNING: Any = literal_column("'running'")
# Numbered pending jobs, as the partial indexes of round order say it (a literal 0: the
# planners use a partial index only for the predicate's own text).
_HAS_ROUND = and_(jobs.c.status == _PENDING, jobs.c.fair_round >= literal_column("0"))
# Pending jobs of a fair type that were not due when they entered pending: numbered once due.
DEFERRED_ROUND = -1
_DEFERRED = and_(jobs.c.status == _PENDING, jobs.c.fair_round < literal_column("0"))
# Named apart from the columns: an UPDATE reserves the columns' own names for its SET.
_the_key = and_(key_turns.c.type == bindparam("turn_type"),
                key_turns.c.concurrency_key == bindparam("turn_key"))


@dataclass(frozen=True, slots=True)
class KeyTurn:
    """An ordered key's turn: the job whose turn it is, and whether its failure blocks the
    key (on_failure block), since when (µs)."""

    type: str
    concurrency_key: str
    job_id: int
    blocked: bool
    since: int


def _turn(row: Any) -> KeyTurn:
    return KeyTurn(row[0], row[1], row[2], bool(row[3]), row[4])


_TURN_COLUMNS = (key_turns.c.type, key_turns.c.concurrency_key, key_turns.c.job_id,
                 key_turns.c.blocked, key_turns.c.since)


@functools.cache
def _take_turn(dialect: str) -> DriverStatement:
    # An upsert that changes nothing but takes the row's lock: an enqueue into a key whose
    # turn another transaction is passing on waits for it, then sees what it left.
    stmt = conflict_insert_for(dialect, key_turns).values(
        type=bindparam("turn_type"), concurrency_key=bindparam("turn_key"),
        job_id=bindparam("turn_job_id"),
        blocked=literal_column("0"), since=bindparam("now"))
    stmt = stmt.on_conflict_do_update(index_elements=["type", "concurrency_key"],
                                      set_={"job_id": key_turns.c.job_id})
    return DriverStatement(stmt.returning(key_turns.c.job_id))


_lock_turn = DriverStatement(select(*_TURN_COLUMNS).where(_the_key).with_for_update())
_next_waiting = DriverStatement(
    select(jobs.c.id)
    .where(jobs.c.status == _WAITING, jobs.c.concurrency_key.is_not(None),
           jobs.c.type == bindparam("type"), jobs.c.concurrency_key == bindparam("key"))
    .order_by(jobs.c.id)
    .limit(1))
_lock_job = DriverStatement(select(jobs.c.id).where(jobs.c.id == bindparam("job_id"))
                            .with_for_update())
_pass_turn = DriverStatement(update(key_turns).where(_the_key).values(
    job_id=bindparam("next_id"), blocked=literal_column("0"), since=bindparam("now")))
_end_turn = DriverStatement(delete(key_turns).where(_the_key))
_set_blocked = DriverStatement(
    update(key_turns).where(_the_key, key_turns.c.job_id == bindparam("turn_job_id"))
    .values(blocked=bindparam("blocked_now"), since=bindparam("now")))
_turns_of_jobs = select(*_TURN_COLUMNS).where(
    key_turns.c.job_id.in_(bindparam("ids", expanding=True)))
_turn_of_key = select(*_TURN_COLUMNS).where(_the_key)

# The round of the job a fair type's claim takes next (its first due one in round order)...
_head_round = DriverStatement(
    select(jobs.c.fair_round)
    .where(_HAS_ROUND, jobs.c.type == bindparam("type"), jobs.c.run_at <= bindparam("now"))
    .order_by(jobs.c.priority.desc(), jobs.c.fair_round, jobs.c.created_at, jobs.c.id)
    .limit(1))
# ... and a key's last round among its pending jobs (with a key, and without one).
_last_round_of_key = DriverStatement(
    select(func.max(jobs.c.fair_round))
    .where(_HAS_ROUND, jobs.c.type == bindparam("type"),
           jobs.c.concurrency_key == bindparam("key")))
_last_round_keyless = DriverStatement(
    select(func.max(jobs.c.fair_round))
    .where(_HAS_ROUND, jobs.c.type == bindparam("type"), jobs.c.concurrency_key.is_(None)))
# A batch's rounds in statements of this many rows (two parameters each: well under both
# engines' limits on a statement's parameters).
_ROUNDS_PER_STATEMENT = 500
_due_deferred = DriverStatement(
    select(jobs.c.id)
    .where(_DEFERRED, jobs.c.type == bindparam("type"), jobs.c.run_at <= bindparam("now"))
    .order_by(jobs.c.run_at)
    .limit(bindparam("limit"))
    .with_for_update(skip_locked=True))
_set_round = DriverStatement(
    update(jobs).where(jobs.c.id == bindparam("job_id"), jobs.c.status == _PENDING)
    .values(fair_round=bindparam("new_round")))


def _fair_ahead() -> Any:
    """The keys of the due jobs before a job in its fair type's round order, range by range
    of the index (as the claim-order count of app/jobs/repository.py reads), at most
    `cap_plus_one` rows: bounded by the cap, never by the backlog."""
    priority: Any = bindparam("priority")
    fair_round: Any = bindparam("fair_round")
    created_at: Any = bindparam("created_at")
    ranges = (
        (jobs.c.priority > priority,),
        (jobs.c.priority == priority, jobs.c.fair_round < fair_round),
        (jobs.c.priority == priority, jobs.c.fair_round == fair_round,
         jobs.c.created_at < created_at),
        (jobs.c.priority == priority, jobs.c.fair_round == fair_round,
         jobs.c.created_at == created_at, jobs.c.id < bindparam("job_id")),
    )
    branches = []
    for conditions in ranges:
        stmt = (select(jobs.c.concurrency_key)
                .where(_HAS_ROUND, jobs.c.type == bindparam("type"),
                       jobs.c.run_at <= bindparam("now"), *conditions)
                .limit(bindparam("cap_plus_one")))
        branches.append(select(stmt.subquery().c.concurrency_key))
    return union_all(*branches).limit(bindparam("cap_plus_one"))


_select_fair_ahead = _fair_ahead()


class KeyRepository:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    # -- ordered keys ---------------------------------------------------------------------

    def take_turn(self, job_type: str, key: str, job_id: int, now_us: int) -> int:
        """The key's turn for `job_id` unless another job has it; the id of the job whose
        turn it is, either way. Holds the key's row to the end of the transaction."""
        [(holder,)] = _take_turn(self.conn.dialect.name).rows(
            self.conn, {"turn_type": job_type, "turn_key": key, "turn_job_id": job_id,
                        "now": now_us})
        return int(holder)

    def lock_turn(self, job_type: str, key: str) -> KeyTurn | None:
        """The key's turn, its row locked to the end of the transaction; None: no job of
        the key is unfinished."""
        rows = _lock_turn.rows(self.conn, {"turn_type": job_type, "turn_key": key})
        return _turn(rows[0]) if rows else None

    def hold_job_row(self, job_id: int) -> None:
        """Wait for, and take, the job's row lock to the end of the transaction (PostgreSQL;
        SQLite's writers take turns already)."""
        if not writers_serialised(self.conn):
            _lock_job.rows(self.conn, {"job_id": job_id})

    def next_waiting(self, job_type: str, key: str) -> int | None:
        """The key's oldest waiting job: the next whose turn it is."""
        rows = _next_waiting.rows(self.conn, {"type": job_type, "key": key})
        return int(rows[0][0]) if rows else None

    def pass_turn(self, job_type: str, key: str, job_id: int, now_us: int) -> None:
        _pass_turn.rows(self.conn, {"turn_type": job_type, "turn_key": key, "next_id": job_id,
                                    "now": now_us})

    def end_turns(self, job_type: str, key: str) -> None:
        """No job of the key is left unfinished: the key has no turn until its next job."""
        _end_turn.rows(self.conn, {"turn_type": job_type, "turn_key": key})

    def set_blocked(self, job_type: str, key: str, job_id: int, blocked: bool,
                    now_us: int) -> None:
        _set_blocked.rows(self.conn, {"turn_type": job_type, "turn_key": key,
                                      "turn_job_id": job_id,
                                      "blocked_now": int(blocked), "now": now_us})

    def turns_of_jobs(self, job_ids: Collection[int]) -> dict[int, KeyTurn]:
        """The turns these jobs hold, by job id (a job holds at most one)."""
        if not job_ids:
            return {}
        return {turn.job_id: turn for turn in map(_turn, self.conn.execute(
            _turns_of_jobs, {"ids": sorted(job_ids)}))}

    def turn_of_key(self, job_type: str, key: str) -> KeyTurn | None:
        row = self.conn.execute(_turn_of_key, {"turn_type": job_type, "turn_key": key}).first()
        return None if row is None else _turn(row)

    def blocked_turns(self, limit: int) -> list[KeyTurn]:
        """Blocked keys, longest blocked first, from their partial index."""
        stmt = (select(*_TURN_COLUMNS).where(key_turns.c.blocked == literal_column("1"))
                .order_by(key_turns.c.since, key_turns.c.type, key_turns.c.concurrency_key)
                .limit(limit))
        return [_turn(row) for row in self.conn.execute(stmt)]

    def count_blocked(self) -> dict[str, int]:
        stmt = (select(key_turns.c.type, func.count())
                .where(key_turns.c.blocked == literal_column("1"))
                .group_by(key_turns.c.type))
        return {job_type: count for job_type, count in self.conn.execute(stmt)}

    def blocked_turns_of(self, job_type: str) -> list[KeyTurn]:
        stmt = select(*_TURN_COLUMNS).where(key_turns.c.type == job_type,
                                            key_turns.c.blocked == literal_column("1"))
        return [_turn(row) for row in self.conn.execute(stmt)]

    def start_ordering(self, job_type: str, now_us: int) -> None:
        """Ordering was turned on: each key of the type with unfinished jobs gets its turn
        (its oldest running job, else its oldest unfinished one), and its other pending jobs
        wait behind it (Transition.HOLD's change, in one statement: a backlog of a million
        is too many for a list of ids; a waiting job holds its unique key as a pending one
        does, so no unique index is met). Runs once, in the change's transaction: its cost
        is that of the type's unfinished keyed jobs."""
        unfinished = and_(jobs.c.type == job_type, jobs.c.concurrency_key.is_not(None),
                          jobs.c.status.in_([_PENDING, _RUNNING, _WAITING]))
        turns = (select(jobs.c.type, jobs.c.concurrency_key,
                        func.coalesce(func.min(case((jobs.c.status == _RUNNING, jobs.c.id))),
                                      func.min(jobs.c.id)).label("job_id"))
                 .where(unfinished)
                 .group_by(jobs.c.type, jobs.c.concurrency_key))
        rows = self.conn.execute(turns).all()
        if rows:
            self.conn.execute(
                conflict_insert_for(self.conn.dialect.name, key_turns)
                .on_conflict_do_nothing(),
                [{"type": t, "concurrency_key": k, "job_id": j, "blocked": 0,
                  "since": now_us} for t, k, j in rows])
        held = (update(jobs)
                .where(unfinished, jobs.c.status == _PENDING,
                       jobs.c.id.not_in(select(key_turns.c.job_id)
                                        .where(key_turns.c.type == job_type)))
                .values(status=_WAITING, updated_at=now_us))
        self.conn.execute(held)

    def stop_ordering(self, job_type: str, now_us: int) -> None:
        """Ordering was turned off: the type's turns are forgotten, and the waiting jobs of
        its keys that no dependency holds back become pending (Transition.RELEASE's change,
        claimable from now at the earliest), in one statement."""
        self.conn.execute(delete(key_turns).where(key_turns.c.type == job_type))
        unfinished_dependency = (select(job_dependencies.c.job_id)
                                 .where(job_dependencies.c.job_id == jobs.c.id,
                                        job_dependencies.c.resolved == literal_column("0"))
                                 .exists())
        stmt = (update(jobs)
                .where(jobs.c.type == job_type, jobs.c.status == _WAITING,
                       jobs.c.concurrency_key.is_not(None), ~unfinished_dependency)
                .values(status=_PENDING, updated_at=now_us,
                        run_at=case((jobs.c.run_at < now_us, now_us), else_=jobs.c.run_at)))
        self.conn.execute(stmt)

    # -- fair share -----------------------------------------------------------------------

    def due_deferred(self, job_type: str, now_us: int, limit: int) -> list[int]:
        """Up to `limit` of the type's unnumbered pending jobs now due, soonest due first
        (those another claim holds are skipped on PostgreSQL)."""
        return [int(row[0]) for row in _due_deferred.rows(
            self.conn, {"type": job_type, "now": now_us, "limit": limit})]

    def head_round(self, job_type: str, now_us: int) -> int | None:
        """The round of the job a claim of the fair type takes next; None: none is due."""
        rows = _head_round.rows(self.conn, {"type": job_type, "now": now_us})
        return None if not rows else int(rows[0][0])

    def last_round(self, job_type: str, key: str | None) -> int | None:
        """The key's highest round among its pending jobs (None: it has none)."""
        if key is None:
            rows = _last_round_keyless.rows(self.conn, {"type": job_type})
        else:
            rows = _last_round_of_key.rows(self.conn, {"type": job_type, "key": key})
        value = rows[0][0] if rows else None
        return None if value is None else int(value)

    def keys_ahead(self, job_type: str, priority: int, fair_round: int, created_at: int,
                   job_id: int, now_us: int, cap: int) -> tuple[list[str | None], bool]:
        """The keys of the due jobs before this one in its fair type's round order, one entry
        per job, at most `cap` (True: there are more)."""
        rows = self.conn.execute(_select_fair_ahead, {
            "type": job_type, "priority": priority, "fair_round": fair_round,
            "created_at": created_at, "job_id": job_id, "now": now_us,
            "cap_plus_one": cap + 1}).scalars().all()
        return list(rows[:cap]), len(rows) > cap

    def set_rounds(self, rounds: Sequence[tuple[int, int]]) -> None:
        """(job id, round) of pending jobs. On PostgreSQL one statement per chunk of a
        batch's jobs: a round trip per job would cost more than the batch's own insert.
        SQLite, in process, runs the one prepared statement per job (it has no VALUES with
        named columns to join)."""
        if len(rounds) == 1 or is_sqlite(self.conn):
            _set_round.execute_many(self.conn, [{"job_id": job_id, "new_round": fair_round}
                                                for job_id, fair_round in rounds])
            return
        for start in range(0, len(rounds), _ROUNDS_PER_STATEMENT):
            chunk = values(column("job_id", BigInteger), column("new_round", BigInteger),
                           name="numbered").data(list(rounds[start:start + _ROUNDS_PER_STATEMENT]))
            self.conn.execute(update(jobs).where(jobs.c.id == chunk.c.job_id,
                                                 jobs.c.status == _PENDING)
                              .values(fair_round=chunk.c.new_round))

    def number_rounds(self, job_type: str, now_us: int) -> None:
        """Fairness was turned on: the type's due pending jobs without a round are numbered
        per key in claim order (each key's first in round 0), as if enqueued fairly; those
        not due yet wait unnumbered until they are. Runs once, in the change's transaction."""
        unnumbered = and_(jobs.c.type == job_type, jobs.c.status == _PENDING,
                          jobs.c.fair_round.is_(None))
        numbered = (select(jobs.c.id, (func.row_number().over(
            partition_by=jobs.c.concurrency_key,
            order_by=(jobs.c.priority.desc(), jobs.c.created_at, jobs.c.id)) - 1).label("n"))
            .where(unnumbered, jobs.c.run_at <= now_us)
            .subquery("numbered"))
        self.conn.execute(update(jobs).where(jobs.c.id == numbered.c.id)
                          .values(fair_round=numbered.c.n))
        self.conn.execute(update(jobs).where(unnumbered, jobs.c.run_at > now_us)
                          .values(fair_round=DEFERRED_ROUND))

    def forget_rounds(self, job_type: str) -> None:
        """Fairness was turned off: the type's pending jobs leave round order."""
        self.conn.execute(update(jobs).where(jobs.c.type == job_type,
                                             jobs.c.status == _PENDING,
                                             jobs.c.fair_round.is_not(None))
                          .values(fair_round=None))

