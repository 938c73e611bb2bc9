"""The SQL of reserved jobs (docs/JOBS.md): each reservation's row of job_reservations, kept once
it is resolved. Every method runs on the transaction it is given; the rules that call them are
app/jobs/usecases/reservations.py."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, func, insert, literal_column, select, update

from app.jobs.sql.statuses import RESERVED
from app.storage.schema import api_keys, job_reservations, jobs
from app.storage.statements import DriverStatement


@dataclass(frozen=True, slots=True)
class Reservation:
    """One row of job_reservations. Times are microseconds since the epoch; `outcome` is
    "confirmed" or "released" once resolved, None until then."""

    job_id: int
    confirm_by: int
    check_url: str | None
    checks: int
    next_check_at: int
    outcome: str | None
    resolved_at: int | None


@dataclass(frozen=True, slots=True)
class DueCheck:
    """An unresolved reservation whose check is due, with what its check needs."""

    reservation: Reservation
    producer: str
    idempotency_key: str | None
    check_secret: str | None


# The reserve's own check url, else its producer key's as it is now: one statement.
_key_check_url = (select(api_keys.c.check_url)
                  .where(api_keys.c.name == bindparam("producer"))
                  .scalar_subquery())
_insert = DriverStatement(insert(job_reservations).values(
    job_id=bindparam("job_id"), confirm_by=bindparam("confirm_by"),
    check_url=func.coalesce(bindparam("own_check_url"), _key_check_url),
    checks=literal_column("0"), next_check_at=bindparam("confirm_by")))
_UNRESOLVED = job_reservations.c.outcome.is_(None)
_put_off = (update(job_reservations)
            .where(job_reservations.c.job_id == bindparam("put_off_id"), _UNRESOLVED)
            .values(next_check_at=bindparam("put_off_at")))


def _due_checks(now_us: int, limit: int) -> Any:
    """Unresolved reservations with a check url whose check is due, soonest first, with their
    job's producer and idempotency key and the producer key's check secret."""
    return (select(job_reservations, jobs.c.producer, jobs.c.idempotency_key,
                   api_keys.c.check_secret)
            .join(jobs, jobs.c.id == job_reservations.c.job_id)
            .outerjoin(api_keys, api_keys.c.name == jobs.c.producer)
            .where(_UNRESOLVED, job_reservations.c.next_check_at <= now_us,
                   job_reservations.c.check_url.is_not(None), jobs.c.status == RESERVED)
            .order_by(job_reservations.c.next_check_at).limit(limit))


class ReservationRepository:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def add(self, job_id: int, *, producer: str, confirm_by: int,
            check_url: str | None) -> None:
        _insert.rows(self.conn, {"job_id": job_id, "confirm_by": confirm_by,
                                 "own_check_url": check_url, "producer": producer})

    def get(self, job_id: int) -> Reservation | None:
        row = self.conn.execute(select(job_reservations)
                                .where(job_reservations.c.job_id == job_id)).first()
        return None if row is None else Reservation(*row)

    def resolve(self, job_ids: Collection[int], outcome: str, now_us: int) -> None:
        """These reservations are resolved with `outcome` (their jobs left reserved)."""
        if job_ids:
            self.conn.execute(update(job_reservations)
                              .where(job_reservations.c.job_id.in_(sorted(job_ids)),
                                     _UNRESOLVED)
                              .values(outcome=outcome, resolved_at=now_us))

    def overdue_without_check(self, now_us: int, limit: int) -> list[int]:
        """Jobs still reserved, past their deadline, whose reservation has no check url:
        released by maintenance. Locked on PostgreSQL; those another process holds are
        left to it."""
        return self._to_release(job_reservations.c.next_check_at, now_us,
                                job_reservations.c.check_url.is_(None), limit)

    def given_up(self, cutoff_us: int, limit: int) -> list[int]:
        """Jobs still reserved whose check has gone unanswered since before `cutoff_us`
        (their deadline): released, whether or not a dispatcher runs."""
        return self._to_release(job_reservations.c.confirm_by, cutoff_us,
                                job_reservations.c.check_url.is_not(None), limit)

    def _to_release(self, due: Any, before_us: int, has_check: Any, limit: int) -> list[int]:
        """Jobs still reserved whose `due` time is at or before `before_us`, soonest first
        (locked on PostgreSQL, skipping those another process holds)."""
        stmt = (select(job_reservations.c.job_id)
                .join(jobs, jobs.c.id == job_reservations.c.job_id)
                .where(_UNRESOLVED, due <= before_us, has_check, jobs.c.status == RESERVED)
                .order_by(due).limit(limit)
                .with_for_update(of=job_reservations, skip_locked=True))
        return list(self.conn.execute(stmt).scalars())

    def due_checks(self, now_us: int, limit: int) -> list[DueCheck]:
        """Unresolved reservations with a check url whose check is due, soonest first, with
        their job's producer and idempotency key and the producer key's check secret."""
        return self._due_checks(_due_checks(now_us, limit))

    def lock_due_checks(self, now_us: int, limit: int) -> list[DueCheck]:
        """As due_checks, locked for this transaction on PostgreSQL, skipping the rows
        another dispatcher is taking (SQLite's writer holds them all)."""
        return self._due_checks(_due_checks(now_us, limit).with_for_update(
            of=job_reservations, skip_locked=True))

    def hold_checks(self, job_ids: Collection[int], until_us: int) -> None:
        """These reservations' checks are being asked: due again at `until_us` (their count
        unchanged), when a dispatcher that died asking leaves them. At most a round's."""
        if job_ids:
            self.conn.execute(update(job_reservations)
                              .where(job_reservations.c.job_id.in_(sorted(job_ids)))
                              .values(next_check_at=until_us))

    def put_off_checks(self, due_at: Mapping[int, int]) -> None:
        """These reservations' checks (job id: when) are due again then, their count
        unchanged. At most a round's, in one statement run for each."""
        if due_at:
            self.conn.execute(_put_off, [{"put_off_id": job_id, "put_off_at": at}
                                         for job_id, at in sorted(due_at.items())])

    def _due_checks(self, stmt: Any) -> list[DueCheck]:
        width = len(job_reservations.c)
        return [DueCheck(Reservation(*row[:width]), row[width], row[width + 1], row[width + 2])
                for row in self.conn.execute(stmt)]

    def check_again(self, job_id: int, *, checks: int, next_check_at: int) -> None:
        """A check went unanswered (or answered neither yes nor no): asked again then."""
        self.conn.execute(update(job_reservations)
                          .where(job_reservations.c.job_id == job_id, _UNRESOLVED)
                          .values(checks=checks, next_check_at=next_check_at))

    def delete_reservations_of(self, job_ids: Collection[int]) -> None:
        if job_ids:
            self.conn.execute(job_reservations.delete().where(
                job_reservations.c.job_id.in_(bindparam("ids", expanding=True))),
                {"ids": sorted(job_ids)})
