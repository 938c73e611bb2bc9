"""The SQL of fair share and ordered keys (docs/FLOW-CONTROL.md): each ordered key's turn
(key_turns) and the rounds of a fair type's pending jobs. Every method runs on the transaction it is
given; the rules that call them are app/jobs/tx/key_rules.py.

A key is (type, producer, concurrency_key): `producer` is the producer key that enqueued
the job, or None where the type's keys are shared (stored '' in key_turns)."""

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
    cast,
    column,
    delete,
    func,
    literal_column,
    select,
    tuple_,
    union_all,
    update,
    values,
)

from app.jobs.sql.statuses import PENDING, RUNNING, WAITING
from app.storage.dialects import conflict_insert_for, is_sqlite, writers_serialised
from app.storage.schema import fair_order_columns, job_dependencies, jobs, key_turns
from app.storage.statements import DriverStatement

# Numbered pending jobs, as the partial indexes of round order say it (a literal 0: the
# planners use a partial index only for the predicate's own text).
_HAS_ROUND = and_(jobs.c.status == PENDING, jobs.c.fair_round >= literal_column("0"))
# Pending jobs of a fair type that were not due when they entered pending: numbered once due.
DEFERRED_ROUND = -1
_DEFERRED = and_(jobs.c.status == PENDING, jobs.c.fair_round < literal_column("0"))
# Named apart from the columns: an UPDATE reserves the columns' own names for its SET.
_the_key = and_(key_turns.c.type == bindparam("turn_type"),
                key_turns.c.producer == bindparam("turn_producer"),
                key_turns.c.concurrency_key == bindparam("turn_key"))
# key_turns.producer of a shared type's keys.
SHARED = ""


@dataclass(frozen=True, slots=True)
class KeyTurn:
    """An ordered key's turn: the job whose turn it is, and whether its failure blocks the
    key (on_failure block), since when (µs)."""

    type: str
    concurrency_key: str
    job_id: int
    blocked: bool
    since: int
    producer: str | None = None  # None: the type's keys are shared

    @property
    def key(self) -> tuple[str, str | None, str]:
        return self.type, self.producer, self.concurrency_key


def _turn(row: Any) -> KeyTurn:
    return KeyTurn(row[0], row[1], row[2], bool(row[3]), row[4], row[5] or None)


def _stored(producer: str | None) -> str:
    return SHARED if producer is None else producer


_TURN_COLUMNS = (key_turns.c.type, key_turns.c.concurrency_key, key_turns.c.job_id,
                 key_turns.c.blocked, key_turns.c.since, key_turns.c.producer)


@functools.cache
def _take_turn(dialect: str) -> DriverStatement:
    # An upsert that changes nothing but takes the row's lock: an enqueue into a key whose
    # turn another transaction is passing on waits for it, then sees what it left.
    stmt = conflict_insert_for(dialect, key_turns).values(
        type=bindparam("turn_type"), producer=bindparam("turn_producer"),
        concurrency_key=bindparam("turn_key"), job_id=bindparam("turn_job_id"),
        blocked=literal_column("0"), since=bindparam("now"))
    stmt = stmt.on_conflict_do_update(index_elements=["type", "producer", "concurrency_key"],
                                      set_={"job_id": key_turns.c.job_id})
    return DriverStatement(stmt.returning(key_turns.c.job_id))


_lock_turn = DriverStatement(select(*_TURN_COLUMNS).where(_the_key).with_for_update())
_next_waiting_shared = DriverStatement(
    select(jobs.c.id)
    .where(jobs.c.status == WAITING, jobs.c.concurrency_key.is_not(None),
           jobs.c.type == bindparam("type"), jobs.c.concurrency_key == bindparam("key"))
    .order_by(jobs.c.id)
    .limit(1))
_next_waiting_of_producer = DriverStatement(
    select(jobs.c.id)
    .where(jobs.c.status == WAITING, jobs.c.concurrency_key.is_not(None),
           jobs.c.type == bindparam("type"), jobs.c.producer == bindparam("producer"),
           jobs.c.concurrency_key == bindparam("key"))
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
    .order_by(*fair_order_columns(jobs))
    .limit(1))
# ... and a key's last round among its pending jobs (with a key, and without one).
_last_round_of_key = DriverStatement(
    select(func.max(jobs.c.fair_round))
    .where(_HAS_ROUND, jobs.c.type == bindparam("type"),
           jobs.c.concurrency_key == bindparam("key")))
_last_round_keyless = DriverStatement(
    select(func.max(jobs.c.fair_round))
    .where(_HAS_ROUND, jobs.c.type == bindparam("type"), jobs.c.concurrency_key.is_(None)))
# Keys per producer: a key's last round among its producer's keys (with a key, and without)...
_last_key_round_of_key = DriverStatement(
    select(func.max(jobs.c.fair_key_round))
    .where(_HAS_ROUND, jobs.c.type == bindparam("type"), jobs.c.producer == bindparam("producer"),
           jobs.c.concurrency_key == bindparam("key")))
_last_key_round_keyless = DriverStatement(
    select(func.max(jobs.c.fair_key_round))
    .where(_HAS_ROUND, jobs.c.type == bindparam("type"), jobs.c.producer == bindparam("producer"),
           jobs.c.concurrency_key.is_(None)))
# ... the round among its keys that the producer's first job has (where a new key starts) ...
_producer_head_key_round = DriverStatement(
    select(func.min(jobs.c.fair_key_round))
    .where(_HAS_ROUND, jobs.c.type == bindparam("type"), jobs.c.producer == bindparam("producer")))
# ... and the producer's job just before a place in its own order (round among its keys, id),
# whose round among the producers the job at that place follows.
_producer_job_before = DriverStatement(
    select(jobs.c.fair_key_round, jobs.c.id, jobs.c.fair_round)
    .where(_HAS_ROUND, jobs.c.type == bindparam("type"), jobs.c.producer == bindparam("producer"),
           tuple_(jobs.c.fair_key_round, jobs.c.id)
           < tuple_(bindparam("key_round", type_=BigInteger),
                    bindparam("job_id", type_=BigInteger)))
    .order_by(jobs.c.fair_key_round.desc(), jobs.c.id.desc())
    .limit(1))
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
    update(jobs).where(jobs.c.id == bindparam("job_id"), jobs.c.status == PENDING)
    .values(fair_round=bindparam("new_round"), fair_key_round=bindparam("new_key_round")))


def _unfinished_dependency() -> Any:
    return (select(job_dependencies.c.job_id)
            .where(job_dependencies.c.job_id == jobs.c.id,
                   job_dependencies.c.resolved == literal_column("0"))
            .exists())


def _key_params(job_type: str, producer: str | None, key: str) -> dict[str, Any]:
    return {"turn_type": job_type, "turn_producer": _stored(producer), "turn_key": key}


def _fair_ahead(per_producer: bool) -> Any:
    """The keys and producers of the due jobs before a job in its fair type's round order,
    range by range of the index (as the claim-order count of app/jobs/sql/repository.py reads),
    at most `cap_plus_one` rows: bounded by the cap, never by the backlog. `per_producer`:
    the type's keys are per producer, and the round among its producer's keys orders jobs
    of one round."""
    priority: Any = bindparam("priority")
    fair_round: Any = bindparam("fair_round")
    created_at: Any = bindparam("created_at")
    key_round: Any = bindparam("key_round")
    same_round: tuple[Any, ...] = (jobs.c.priority == priority, jobs.c.fair_round == fair_round)
    if per_producer:
        same_round += (jobs.c.fair_key_round == key_round,)
    ranges = (
        (jobs.c.priority > priority,),
        (jobs.c.priority == priority, jobs.c.fair_round < fair_round),
        *([(*same_round[:2], jobs.c.fair_key_round < key_round)] if per_producer else []),
        (*same_round, jobs.c.created_at < created_at),
        (*same_round, jobs.c.created_at == created_at, jobs.c.id < bindparam("job_id")),
    )
    branches = []
    for conditions in ranges:
        stmt = (select(jobs.c.concurrency_key, jobs.c.producer)
                .where(_HAS_ROUND, jobs.c.type == bindparam("type"),
                       jobs.c.run_at <= bindparam("now"), *conditions)
                .limit(bindparam("cap_plus_one")))
        ahead = stmt.subquery()
        branches.append(select(ahead.c.concurrency_key, ahead.c.producer))
    return union_all(*branches).limit(bindparam("cap_plus_one"))


_select_fair_ahead = _fair_ahead(per_producer=False)
_select_fair_ahead_per_producer = _fair_ahead(per_producer=True)
_key_round_of = select(jobs.c.fair_key_round).where(jobs.c.id == bindparam("job_id"))


class KeyRepository:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    # -- ordered keys ---------------------------------------------------------------------

    def take_turn(self, job_type: str, producer: str | None, key: str, job_id: int,
                  now_us: int) -> int:
        """The key's turn for `job_id` unless another job has it; the id of the job whose
        turn it is, either way. Holds the key's row to the end of the transaction."""
        [(holder,)] = _take_turn(self.conn.dialect.name).rows(
            self.conn, {"turn_type": job_type, "turn_producer": _stored(producer),
                        "turn_key": key, "turn_job_id": job_id, "now": now_us})
        return int(holder)

    def lock_turn(self, job_type: str, producer: str | None, key: str) -> KeyTurn | None:
        """The key's turn, its row locked to the end of the transaction; None: no job of
        the key is unfinished."""
        rows = _lock_turn.rows(self.conn, _key_params(job_type, producer, key))
        return _turn(rows[0]) if rows else None

    def hold_job_row(self, job_id: int) -> None:
        """Wait for, and take, the job's row lock to the end of the transaction (PostgreSQL;
        SQLite's writers take turns already)."""
        if not writers_serialised(self.conn):
            _lock_job.rows(self.conn, {"job_id": job_id})

    def next_waiting(self, job_type: str, producer: str | None, key: str) -> int | None:
        """The key's oldest waiting job: the next whose turn it is."""
        if producer is None:
            rows = _next_waiting_shared.rows(self.conn, {"type": job_type, "key": key})
        else:
            rows = _next_waiting_of_producer.rows(
                self.conn, {"type": job_type, "producer": producer, "key": key})
        return int(rows[0][0]) if rows else None

    def pass_turn(self, job_type: str, producer: str | None, key: str, job_id: int,
                  now_us: int) -> None:
        _pass_turn.rows(self.conn, {**_key_params(job_type, producer, key),
                                    "next_id": job_id, "now": now_us})

    def end_turns(self, job_type: str, producer: str | None, key: str) -> None:
        """No job of the key is left unfinished: the key has no turn until its next job."""
        _end_turn.rows(self.conn, _key_params(job_type, producer, key))

    def set_blocked(self, job_type: str, producer: str | None, key: str, job_id: int,
                    blocked: bool, now_us: int) -> None:
        _set_blocked.rows(self.conn, {**_key_params(job_type, producer, key),
                                      "turn_job_id": job_id,
                                      "blocked_now": int(blocked), "now": now_us})

    def turns_of_jobs(self, job_ids: Collection[int]) -> dict[int, KeyTurn]:
        """The turns these jobs hold, by job id (a job holds at most one)."""
        if not job_ids:
            return {}
        return {turn.job_id: turn for turn in map(_turn, self.conn.execute(
            _turns_of_jobs, {"ids": sorted(job_ids)}))}

    def turn_of_key(self, job_type: str, producer: str | None, key: str) -> KeyTurn | None:
        row = self.conn.execute(_turn_of_key, _key_params(job_type, producer, key)).first()
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

    def start_ordering(self, job_type: str, shared: bool, now_us: int) -> None:
        """Ordering was turned on: each key of the type with unfinished jobs (per producer,
        unless `shared`) gets its turn (its oldest running job, else its oldest unfinished
        one), and its other pending jobs wait behind it (Transition.HOLD's change, in one
        statement: a backlog of a million is too many for a list of ids; a waiting job holds
        its unique key as a pending one does, so no unique index is met). A key that has a
        turn already keeps it. Runs once, in the change's transaction: its cost is that of
        the type's unfinished keyed jobs."""
        unfinished = and_(jobs.c.type == job_type, jobs.c.concurrency_key.is_not(None),
                          jobs.c.status.in_([PENDING, RUNNING, WAITING]))
        # PostgreSQL groups by no constant: a shared key's producer is added after.
        lane = [jobs.c.concurrency_key] if shared else [jobs.c.producer, jobs.c.concurrency_key]
        scope: Any = literal_column(f"'{SHARED}'") if shared else jobs.c.producer
        turns = (select(jobs.c.type, scope, jobs.c.concurrency_key,
                        func.coalesce(func.min(case((jobs.c.status == RUNNING, jobs.c.id))),
                                      func.min(jobs.c.id)).label("job_id"))
                 .where(unfinished)
                 .group_by(jobs.c.type, *lane))
        rows = self.conn.execute(turns).all()
        if rows:
            self.conn.execute(
                conflict_insert_for(self.conn.dialect.name, key_turns)
                .on_conflict_do_nothing(),
                [{"type": t, "producer": p, "concurrency_key": k, "job_id": j, "blocked": 0,
                  "since": now_us} for t, p, k, j in rows])
        held = (update(jobs)
                .where(unfinished, jobs.c.status == PENDING,
                       jobs.c.id.not_in(select(key_turns.c.job_id)
                                        .where(key_turns.c.type == job_type)))
                .values(status=WAITING, updated_at=now_us))
        self.conn.execute(held)

    def rescope_turns(self, job_type: str, shared: bool, now_us: int) -> None:
        """The type's keys became shared, or per producer again, while it is ordered: the
        turns are made again for the new keys, as ordering turned on makes them, except that
        a failure that blocks its key still blocks the key it now belongs to (the oldest of
        several, when shared keys merge them). Jobs whose turn it now is and that no
        dependency holds become pending; the others wait behind their key's turn."""
        blocked = sorted(self.blocked_turns_of(job_type), key=lambda turn: turn.job_id)
        producers = dict(self.conn.execute(
            select(jobs.c.id, jobs.c.producer)
            .where(jobs.c.id.in_([turn.job_id for turn in blocked])))) if blocked else {}
        self.conn.execute(delete(key_turns).where(key_turns.c.type == job_type))
        for turn in blocked:
            self.conn.execute(
                conflict_insert_for(self.conn.dialect.name, key_turns).on_conflict_do_nothing(),
                {"type": job_type, "producer": SHARED if shared else producers[turn.job_id],
                 "concurrency_key": turn.concurrency_key, "job_id": turn.job_id, "blocked": 1,
                 "since": turn.since})
        self.start_ordering(job_type, shared, now_us)
        released = (update(jobs)
                    .where(jobs.c.type == job_type, jobs.c.status == WAITING,
                           jobs.c.concurrency_key.is_not(None), ~_unfinished_dependency(),
                           jobs.c.id.in_(select(key_turns.c.job_id)
                                         .where(key_turns.c.type == job_type)))
                    .values(status=PENDING, updated_at=now_us,
                            run_at=case((jobs.c.run_at < now_us, now_us),
                                        else_=jobs.c.run_at)))
        self.conn.execute(released)

    def stop_ordering(self, job_type: str, now_us: int) -> None:
        """Ordering was turned off: the type's turns are forgotten, and the waiting jobs of
        its keys that no dependency holds back become pending (Transition.RELEASE's change,
        claimable from now at the earliest), in one statement."""
        self.conn.execute(delete(key_turns).where(key_turns.c.type == job_type))
        stmt = (update(jobs)
                .where(jobs.c.type == job_type, jobs.c.status == WAITING,
                       jobs.c.concurrency_key.is_not(None), ~_unfinished_dependency())
                .values(status=PENDING, updated_at=now_us,
                        run_at=case((jobs.c.run_at < now_us, now_us), else_=jobs.c.run_at)))
        self.conn.execute(stmt)

    # -- fair share -----------------------------------------------------------------------

    def unrounded_pending(self, job_type: str) -> list[int]:
        """The fair type's pending jobs without a round, in id order (a straggler's few: read
        through the type's claim-order index)."""
        return [int(job_id) for job_id in self.conn.execute(
            select(jobs.c.id).where(jobs.c.type == job_type, jobs.c.status == PENDING,
                                    jobs.c.fair_round.is_(None)).order_by(jobs.c.id)
        ).scalars()]

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

    def last_key_round(self, job_type: str, producer: str, key: str | None) -> int | None:
        """Keys per producer: the key's highest round among its producer's keys, over its
        pending jobs (None: it has none)."""
        params = {"type": job_type, "producer": producer}
        if key is None:
            rows = _last_key_round_keyless.rows(self.conn, params)
        else:
            rows = _last_key_round_of_key.rows(self.conn, {**params, "key": key})
        value = rows[0][0] if rows else None
        return None if value is None else int(value)

    def producer_head_key_round(self, job_type: str, producer: str) -> int | None:
        """Keys per producer: the lowest round among its keys of the producer's pending
        jobs, where a key of the producer that has none starts (None: it has none)."""
        rows = _producer_head_key_round.rows(self.conn, {"type": job_type,
                                                         "producer": producer})
        value = rows[0][0] if rows else None
        return None if value is None else int(value)

    def producer_job_before(self, job_type: str, producer: str, key_round: int,
                            job_id: int) -> tuple[int, int, int] | None:
        """Keys per producer: (round among its keys, id, round) of the producer's pending
        job just before this place in its own order; None: none is."""
        rows = _producer_job_before.rows(self.conn, {"type": job_type, "producer": producer,
                                                     "key_round": key_round, "job_id": job_id})
        return None if not rows else (int(rows[0][0]), int(rows[0][1]), int(rows[0][2]))

    def keys_ahead(self, job_type: str, priority: int, fair_round: int, created_at: int,
                   job_id: int, now_us: int,
                   cap: int) -> tuple[list[tuple[str | None, str]], bool]:
        """The (key, producer) of the due jobs before this one in its fair type's round
        order, one entry per job, at most `cap` (True: there are more)."""
        key_round = self.conn.execute(_key_round_of, {"job_id": job_id}).scalar()
        params = {"type": job_type, "priority": priority, "fair_round": fair_round,
                  "created_at": created_at, "job_id": job_id, "now": now_us,
                  "cap_plus_one": cap + 1}
        if key_round is None:
            rows = self.conn.execute(_select_fair_ahead, params).all()
        else:
            rows = self.conn.execute(_select_fair_ahead_per_producer,
                                     {**params, "key_round": key_round}).all()
        return [(key, producer) for key, producer in rows[:cap]], len(rows) > cap

    def set_rounds(self, rounds: Sequence[tuple[int, int, int | None]]) -> None:
        """(job id, round, round among its producer's keys or None) of pending jobs. On
        PostgreSQL one statement per chunk of a batch's jobs: a round trip per job would cost
        more than the batch's own insert. SQLite, in process, runs the one prepared statement
        per job (it has no VALUES with named columns to join)."""
        if len(rounds) == 1 or is_sqlite(self.conn):
            _set_round.execute_many(self.conn, [
                {"job_id": job_id, "new_round": fair_round, "new_key_round": key_round}
                for job_id, fair_round, key_round in rounds])
            return
        for start in range(0, len(rounds), _ROUNDS_PER_STATEMENT):
            chunk = values(column("job_id", BigInteger), column("new_round", BigInteger),
                           column("new_key_round", BigInteger),
                           name="numbered").data(list(rounds[start:start + _ROUNDS_PER_STATEMENT]))
            self.conn.execute(update(jobs).where(jobs.c.id == chunk.c.job_id,
                                                 jobs.c.status == PENDING)
                              .values(fair_round=chunk.c.new_round,
                                      # typed: a chunk of deferred jobs has only NULLs here
                                      fair_key_round=cast(chunk.c.new_key_round, BigInteger)))

    def number_rounds(self, job_type: str, shared: bool, now_us: int) -> None:
        """Fairness was turned on (or the keys' scope changed): the type's due pending jobs
        without a round are numbered in claim order, as if enqueued fairly: where keys are
        shared, per key (each key's first in round 0); per producer otherwise, each job's
        round among its producer's keys so, then the producer's jobs one round each in that
        order. Those not due yet wait unnumbered until they are. Runs once, in the change's
        transaction."""
        unnumbered = and_(jobs.c.type == job_type, jobs.c.status == PENDING,
                          jobs.c.fair_round.is_(None))
        lane = [jobs.c.concurrency_key] if shared else [jobs.c.producer, jobs.c.concurrency_key]
        by_key = (select(jobs.c.id, jobs.c.producer, (func.row_number().over(
            partition_by=lane,
            order_by=(jobs.c.priority.desc(), jobs.c.created_at, jobs.c.id)) - 1).label("n"))
            .where(unnumbered, jobs.c.run_at <= now_us)
            .subquery("by_key"))
        if shared:
            self.conn.execute(update(jobs).where(jobs.c.id == by_key.c.id)
                              .values(fair_round=by_key.c.n, fair_key_round=None))
        else:
            by_producer = (select(by_key.c.id, by_key.c.n, (func.row_number().over(
                partition_by=by_key.c.producer, order_by=(by_key.c.n, by_key.c.id)) - 1)
                .label("turn")).subquery("by_producer"))
            self.conn.execute(update(jobs).where(jobs.c.id == by_producer.c.id)
                              .values(fair_round=by_producer.c.turn,
                                      fair_key_round=by_producer.c.n))
        self.conn.execute(update(jobs).where(unnumbered, jobs.c.run_at > now_us)
                          .values(fair_round=DEFERRED_ROUND))

    def forget_rounds(self, job_type: str) -> None:
        """Fairness was turned off: the type's pending jobs leave round order."""
        self.conn.execute(update(jobs).where(jobs.c.type == job_type,
                                             jobs.c.status == PENDING,
                                             jobs.c.fair_round.is_not(None))
                          .values(fair_round=None, fair_key_round=None))
