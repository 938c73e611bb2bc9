"""What maintenance has to do, asked in one statement (PostgreSQL, where the leader asks it
on its listening session: docs/SCALING.md, "The database tells every host").

An idle database answers it from indexes alone: the earliest lease of a running job, the
earliest expiry of an unclaimed one, the next delayed job, the next suspended job's moment,
whether a cascade or an overdue reservation waits. When delayed jobs came due since the last
ask, the same statement tells the listening hosts (NOTIFY 'claimable'), so that their
waiting claims look then.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, bindparam, exists, func, literal, null, select

from app.jobs.domain.transitions import Transition
from app.jobs.sql.job_rows import status_is_job
from app.jobs.sql.statuses import PENDING, RESERVED, WAITING
from app.jobs.sql.wait_repository import WAITING as WAIT_NOT_ENDED
from app.storage.listener import CHANNEL
from app.storage.schema import dependency_cascades, job_reservations, job_waits, jobs

_RESCUABLE_ROW = status_is_job(*Transition.RESCUE.from_statuses)
_DELAYED_ROW = (jobs.c.status == PENDING) & (jobs.c.run_at > jobs.c.created_at)

# From the floor the caller knows no lease lies below (app/jobs/usecases/listening_lead.py):
# while a snapshot holds PostgreSQL's horizon, the index keeps an entry for every job that
# ran and finished since it began, each with its lease, and a min() from the index's start
# would step over all of them each second.
_next_lease = (select(func.min(jobs.c.lease_expires_at))
               .where(_RESCUABLE_ROW, jobs.c.lease_expires_at >= bindparam("lease_floor"))
               .scalar_subquery())
# The predicate of ix_jobs_expires_at, as written there.
_next_expiry = (select(func.min(jobs.c.expires_at))
                .where(jobs.c.status.in_([PENDING, WAITING]), jobs.c.expires_at.is_not(None))
                .scalar_subquery())
_next_delayed = (select(func.min(jobs.c.run_at))
                 .where(_DELAYED_ROW, jobs.c.run_at > bindparam("now"))
                 .scalar_subquery())
# The next wait's moment (a sleep's end or a timeout), from ix_job_waits_until_at.
_next_suspended = (select(func.min(job_waits.c.until_at)).where(WAIT_NOT_ENDED)
                   .scalar_subquery())
_came_due = exists().where(_DELAYED_ROW, jobs.c.run_at > bindparam("since"),
                           jobs.c.run_at <= bindparam("now"))
# A reservation past either of its deadlines (the chore tells which, and when one is given up).
_reservation_due = exists().where(
    job_reservations.c.job_id == jobs.c.id, jobs.c.status == RESERVED,
    (job_reservations.c.next_check_at <= bindparam("now"))
    | (job_reservations.c.confirm_by <= bindparam("now")))
# pg_notify returns nothing: counted in a sub-select, it is sent only when the row exists.
_told = (select(func.count()).select_from(
    select(func.pg_notify(CHANNEL, "claimable").label("sent")).where(_came_due).subquery())
    .scalar_subquery())

_ASKED = (
    _next_expiry.label("next_expiry"),
    _next_delayed.label("next_delayed"),
    _next_suspended.label("next_suspended"),
    exists(select(literal(1)).select_from(dependency_cascades)).label("cascades"),
    _reservation_due.label("reservations"),
    _told.label("told"),
)
_ask = select(_next_lease.label("next_lease"), *_ASKED)
# The same without the next lease (the lead asks for it at its own pace: listening_lead.py).
_ask_but_the_lease = select(null().label("next_lease"), *_ASKED)


@dataclass(frozen=True)
class DueWork:
    """What the ask found, at `now_us`."""

    now_us: int
    next_lease: int | None
    next_expiry: int | None
    next_delayed: int | None
    cascades: bool
    reservations: bool
    next_suspended: int | None = None

    @property
    def waits_due(self) -> bool:
        """A suspended job's moment has come: the waits' chore has work."""
        return self.next_suspended is not None and self.next_suspended <= self.now_us

    @property
    def sweeps_due(self) -> bool:
        """A lease or an expiry has run out: the sweeps have work."""
        return any(at is not None and at <= self.now_us
                   for at in (self.next_lease, self.next_expiry))

    def next_at(self) -> int | None:
        """When the next lease, expiry or delayed job comes due, if any is known (µs)."""
        later = [at for at in (self.next_lease, self.next_expiry, self.next_delayed,
                               self.next_suspended)
                 if at is not None and at > self.now_us]
        return min(later, default=None)


def ask_due_work(conn: Connection, now_us: int, since_us: int, lease_floor_us: int = 0, *,
                 lease: bool = True) -> DueWork:
    """One statement: what is due at `now_us`; wakes the waiting claims everywhere if a
    delayed job came due after `since_us`. Leases below `lease_floor_us` are not looked at;
    without `lease`, none is (next_lease None: not asked)."""
    row = conn.execute(_ask if lease else _ask_but_the_lease,
                       {"now": now_us, "since": since_us, "lease_floor": lease_floor_us}).one()
    return DueWork(now_us, row.next_lease, row.next_expiry, row.next_delayed,
                   bool(row.cascades), bool(row.reservations), row.next_suspended)
