"""The SQL of a type's protection: its tallies, its circuit's moves and its retry schedule.
Every method runs on the connection it is given."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_, func, or_, select, update

from app.storage.dialects import conflict_insert
from app.storage.schema import failure_groups, job_attempts, job_types, jobs, type_tallies
from app.types.protection.budget import RetryBudgetSettings
from app.types.protection.circuit import Move

TALLIES = ("finished", "failed", "started_first")


@dataclass(frozen=True)
class Window:
    """What a type's attempts did over a window, every process's tallies summed."""

    finished: int = 0
    failed: int = 0
    started_first: int = 0


class ProtectionRepository:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def add_tallies(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Add each row's counts (type, second, slot, finished, failed, started_first) to its
        stored row, in type and second order (two processes adding lock rows in one order)."""
        if not rows:
            return
        ordered = sorted(rows, key=lambda row: (row["type"], row["second"], row["slot"]))
        stmt = conflict_insert(self.conn, type_tallies).values(ordered)
        self.conn.execute(stmt.on_conflict_do_update(
            index_elements=[type_tallies.c.type, type_tallies.c.second, type_tallies.c.slot],
            set_={name: type_tallies.c[name] + stmt.excluded[name] for name in TALLIES}))

    def windows(self, since: Mapping[str, int]) -> dict[str, Window]:
        """Each type's tallies from its second `since[type]` on, summed: one statement."""
        if not since:
            return {}
        stmt = (select(type_tallies.c.type, *(func.sum(type_tallies.c[name]) for name in TALLIES))
                .where(or_(*(and_(type_tallies.c.type == job_type,
                                  type_tallies.c.second >= second)
                             for job_type, second in sorted(since.items()))))
                .group_by(type_tallies.c.type))
        return {row[0]: Window(int(row[1] or 0), int(row[2] or 0), int(row[3] or 0))
                for row in self.conn.execute(stmt)}

    def forget_tallies(self, before_second: int) -> int:
        return self.conn.execute(
            type_tallies.delete().where(type_tallies.c.second < before_second)).rowcount

    def move_circuit(self, job_type: str, move: Move, now_us: int,
                     opened_by: str | None = None) -> bool:
        """Make the move if the circuit is still where it was read (`move.current`, since
        `move.since`): of several processes making it, one does."""
        state = job_types.c.circuit_state
        guard = [job_types.c.type == job_type, job_types.c.circuit.is_not(None),
                 state.is_(None) if move.current is None else state == move.current]
        if move.current is not None:
            guard.append(job_types.c.circuit_since == move.since)
        values: dict[str, Any] = {"circuit_state": move.state, "circuit_since": now_us}
        if opened_by is not None:
            values["circuit_opened_by"] = opened_by
        return self.conn.execute(update(job_types).where(*guard).values(values)).rowcount == 1

    def dominant_failure(self, job_type: str, since_us: int) -> tuple[str, str] | None:
        """The failure group (fingerprint, sample) with the most failed attempts of the type
        since `since_us`: its candidates are the type's groups seen since then (a few rows),
        each counted on the attempts' fingerprint index."""
        groups = dict(self.conn.execute(
            select(failure_groups.c.fingerprint, failure_groups.c.sample)
            .where(failure_groups.c.type == job_type, failure_groups.c.last_seen >= since_us)
            .order_by(failure_groups.c.last_seen.desc()).limit(20)).all())
        if not groups:
            return None
        counted = self.conn.execute(
            select(job_attempts.c.fingerprint, func.count())
            .join(jobs, jobs.c.id == job_attempts.c.job_id)
            .where(job_attempts.c.fingerprint.in_(sorted(groups)),
                   job_attempts.c.ended_at >= since_us, jobs.c.type == job_type)
            .group_by(job_attempts.c.fingerprint)
            .order_by(func.count().desc(), job_attempts.c.fingerprint).limit(1)).first()
        fingerprint = counted[0] if counted is not None else next(iter(groups))
        return fingerprint, groups[fingerprint]

    def lock_retry_budget(self, job_type: str) -> tuple[RetryBudgetSettings | None, int | None]:
        """The type's retry budget and its schedule, the row locked (PostgreSQL) until the
        transaction ends: the retries of one type take their slots one after another."""
        stmt = (select(job_types.c.retry_budget, job_types.c.retry_budget_at)
                .where(job_types.c.type == job_type))
        if self.conn.dialect.name == "postgresql":
            stmt = stmt.with_for_update()
        row = self.conn.execute(stmt).first()
        if row is None:
            return None, None
        return RetryBudgetSettings.parse(row[0]), None if row[1] is None else int(row[1])

    def save_retry_schedule(self, job_type: str, next_at: int) -> None:
        self.conn.execute(update(job_types).where(job_types.c.type == job_type)
                          .values(retry_budget_at=next_at))
