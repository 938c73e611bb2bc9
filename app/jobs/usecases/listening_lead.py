"""The maintenance lead on the host's listening session (PostgreSQL with notifications:
docs/SCALING.md, "The database tells every host").

The listening session (app/storage/listener.py) is the one connection a host keeps out of
its pools; the lead's advisory lock lives on it, so that the lead costs no connection of its
own and ends with the session. Between notifications the session's thread calls tick():
- not leading, it asks for the lead every FOLLOW_SECONDS (one statement);
- leading, it asks what is due (app/jobs/sql/due_repository.py, one statement) at least every
  LEAD_SECONDS, and sooner when a lease, an expiry, a delayed job or a suspended job's moment
  comes due before then;
  it wakes the maintenance loop for the chores that have work, and retention and the horizon's
  look (app/jobs/usecases/horizon_watch.py), which keep their own pace (a pass every
  RETENTION_IDLE_SECONDS, or at once while one is under way; a look every 30 s).
A lease that runs out is so rescued within a second, as before, and an idle database is asked
one statement a second.

The ask looks for the next lease from a floor rather than from the lowest lease ever stored:
a claim sets a lease after its own moment, and a heartbeat never below the earlier of its moment
and the lease it replaces (a deadline caps both), so no lease written after an ask lies below
that ask's moment or the earliest lease it found. The floor is
the earlier of the two, less LEASE_FLOOR_MARGIN_SECONDS for the hosts' clocks and the claims
still committing; every FULL_ASK_SECONDS the ask looks at every lease, so that a host whose
clock runs further behind still has its expired leases rescued. Without the floor, a held
snapshot (docs/SCALING.md, "A held snapshot") would have each ask step over the leases of every
job that ran since the snapshot began. Even from the floor it steps over those of the jobs that
ran and finished within a lease's length (their leases lie ahead), so an ask that took longer
than LEAD_SECONDS / ASK_COST_TIMES puts off the next question about leases by ASK_COST_TIMES
its own time; the asks between leave leases out (and the sweep is not woken by a lease they
did not ask about). A held snapshot so delays a rescue by a few seconds at most, rather than
costing the database an ever longer walk each second.
"""

from __future__ import annotations

from sqlalchemy import Connection

from app.core.clock import MICROS, Clock
from app.jobs.sql.due_repository import ask_due_work
from app.jobs.usecases.horizon_watch import HORIZON_CHORE
from app.jobs.usecases.maintenance_loop import MaintenanceLoop
from app.storage.leadership import try_advisory_lead

LEAD_SECONDS = 1.0
FOLLOW_SECONDS = 5.0
# Retention's pause between passes here: deleting finished jobs a minute late costs nothing,
# and an idle database is asked nothing meanwhile.
RETENTION_IDLE_SECONDS = 60.0
# The first ask of a new leader looks back this far for delayed jobs that came due (the last
# leader's last ask was at most LEAD_SECONDS before it stopped).
_HANDOVER_US = 2 * int(LEAD_SECONDS * MICROS)
# Shorter waits than this are not worth a statement of their own.
_MIN_WAIT_SECONDS = 0.01
LEASE_FLOOR_MARGIN_SECONDS = 10.0
FULL_ASK_SECONDS = 60.0
ASK_COST_TIMES = 20


class ListeningLead:
    """The listener's duty (app/storage/listener.py's ListenerDuty) and the maintenance loop's
    leadership (app/storage/leadership.py's Leadership) at once."""

    def __init__(self, clock: Clock, maintenance: MaintenanceLoop) -> None:
        self.clock = clock
        self.maintenance = maintenance
        self.leading = False
        self._since_us = 0
        self._lease_floor_us = 0  # 0: every lease (a new lead knows nothing yet)
        self._full_ask_at_us = 0
        self._lease_ask_at_us = 0  # the next ask that asks about leases too

    # -- the listener's duty -----------------------------------------------------------------

    def tick(self, conn: Connection) -> float:
        if not self.leading:
            self.leading = try_advisory_lead(conn)
            if not self.leading:
                return FOLLOW_SECONDS
            self._since_us = self.clock.now_us() - _HANDOVER_US
            self._lease_floor_us = 0
            self.maintenance.wake(())  # the loop's round notes the lead
        now = self.clock.now_us()
        leases = now >= self._lease_ask_at_us
        if leases and now >= self._full_ask_at_us:
            self._lease_floor_us = 0
            self._full_ask_at_us = now + round(FULL_ASK_SECONDS * MICROS)
        due = ask_due_work(conn, now, self._since_us, self._lease_floor_us, lease=leases)
        self._since_us = now
        if leases:
            took = self.clock.now_us() - now
            self._lease_ask_at_us = now + ASK_COST_TIMES * took
            lowest = now if due.next_lease is None else min(due.next_lease, now)
            self._lease_floor_us = max(0, lowest - round(LEASE_FLOOR_MARGIN_SECONDS * MICROS))
        # No statement until their own pace says so: retention's next pass, the horizon's
        # next look (at most every 30 s, never a part of the question above).
        chores = {"retention", HORIZON_CHORE}
        if due.sweeps_due:
            chores.add("sweep")
        if due.cascades:
            chores.add("cascades")
        if due.reservations:
            chores.add("release_overdue_reservations")
        if due.waits_due:
            chores.add("waits")
        self.maintenance.wake(chores)
        wait = LEAD_SECONDS
        next_at = due.next_at()
        if next_at is not None:
            wait = min(wait, (next_at - now) / MICROS)
        return max(wait, _MIN_WAIT_SECONDS)

    def lost(self) -> None:
        self.leading = False
        self.maintenance.wake(())  # the loop's round notes the lead's end

    # -- the maintenance loop's leadership ---------------------------------------------------

    def hold(self) -> bool:
        return self.leading

    def release(self) -> None:
        """Nothing to do here: the lead ends with the listening session, which the listener
        closes when it stops."""
