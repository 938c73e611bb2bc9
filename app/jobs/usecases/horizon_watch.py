"""Who holds PostgreSQL's xmin horizon: what GET /health/database and the dashboard show, and
the maintenance chore that says it in the log.

A transaction that holds a snapshot (a forgotten BEGIN in psql, a long report), a prepared
transaction left unresolved, a replication slot or a standby with hot_standby_feedback keeps
VACUUM from removing the dead rows that claims, reports and retention leave behind in the
jobs tables; the claims' scans step over more of them the longer it lasts. queuelog cannot
end someone else's session, and must not stop serving for it (/readyz stays ready): it names
the holder, so that the operator can.

The chore runs in the maintenance leader's process only (one per database), and looks at
most every LOOK_SECONDS: one cheap statement over the server's statistics views, never on
the listening lead's per-second question. Each holder is logged once, at WARNING, when it has
held the horizon past QUEUELOG_HORIZON_WARN_SECONDS, and not again while it holds. At each look
while one has held it past HELD_SECONDS, every listening process is told (tell_horizon_held),
and its claims read from positions rather than over what the holder keeps
(app/jobs/domain/claim_positions.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from app.core.clock import MICROS, Clock
from app.jobs.domain.claim_positions import HELD_SECONDS
from app.storage.activity import (
    PREPARED,
    SLOT,
    STANDBY,
    TRANSACTION,
    HorizonHolder,
    horizon_holders,
    oldest_transaction_seconds,
    sees_every_session,
    tell_horizon_held,
)
from app.storage.engine import Database

log = logging.getLogger(__name__)

# The chore's name, by which the listening lead (app/jobs/usecases/listening_lead.py) wakes
# it each second; the chore itself decides whether a look is due.
HORIZON_CHORE = "horizon"
# A holder matters after minutes (the threshold defaults to 300 s): looking twice a minute
# says it well in time, and costs the server next to nothing.
LOOK_SECONDS = 30.0

HolderKey = tuple[str, int | str | None, int | str | None]


@dataclass(frozen=True)
class HorizonReport:
    """What GET /health/database answers and the dashboard's overview shows."""

    engine: str
    oldest_transaction_seconds: float | None
    threshold_seconds: float
    holders: list[HorizonHolder]
    # Whether the role sees other roles' sessions (pg_read_all_stats); None on SQLite.
    sees_every_session: bool | None

    @property
    def has_horizon(self) -> bool:
        return self.engine != "sqlite"

    def past_threshold(self) -> list[HorizonHolder]:
        """The holders known to have held the horizon longer than the threshold."""
        return [holder for holder in self.holders
                if holder.seconds is not None and holder.seconds > self.threshold_seconds]


def what_to_do(holder: HorizonHolder) -> str:
    """The operator's way to release the horizon from `holder`."""
    if holder.kind == TRANSACTION:
        pid = holder.pid if holder.pid is not None else "<pid>"
        return (f"commit or roll back in its client, or end it: "
                f"SELECT pg_terminate_backend({pid})")
    if holder.kind == PREPARED:
        return f"COMMIT PREPARED or ROLLBACK PREPARED '{holder.name}'"
    if holder.kind == SLOT:
        return (f"let its consumer catch up, or drop it if nothing uses it: "
                f"SELECT pg_drop_replication_slot('{holder.name}')")
    if holder.kind == STANDBY:
        return ("end the standby's long query, or turn hot_standby_feedback off there "
                "(its queries may then be cancelled)")
    return "end it"


class HorizonWatch:
    """`threshold_seconds`: QUEUELOG_HORIZON_WARN_SECONDS."""

    def __init__(self, db: Database, clock: Clock, threshold_seconds: float,
                 tell_after_seconds: float = HELD_SECONDS) -> None:
        self.db = db
        self.clock = clock
        self.threshold_seconds = threshold_seconds
        self.tell_after_seconds = tell_after_seconds
        self._database = db.engine.url.database
        self._next_look_us = 0
        # Each holder seen at the last look, with when it was first seen (the time of those
        # the server gives none, a slot or a standby), and the ones already logged.
        self._first_seen_us: dict[HolderKey, int] = {}
        self._logged: set[HolderKey] = set()

    def report(self) -> HorizonReport:
        """Every holder now, with the oldest transaction's age (one read transaction; none
        on SQLite)."""
        engine = self.db.engine.dialect.name
        if engine == "sqlite":
            return HorizonReport(engine, None, self.threshold_seconds, [], None)
        with self.db.read() as conn:
            holders = horizon_holders(conn)
            oldest = oldest_transaction_seconds(conn)
            sees = sees_every_session(conn)
        return HorizonReport(engine, oldest, self.threshold_seconds, holders, sees)

    def held_long(self) -> bool:
        """Whether a session or prepared transaction of this database has held the horizon
        past tell_after_seconds, by the server's clock: the look of a process that starts
        (app/database_wakes.py), which the leader's notices reach only at its next look."""
        if self.db.engine.dialect.name == "sqlite":
            return False
        with self.db.read() as conn:
            holders = horizon_holders(conn)
        return any(self._holds_this_database(holder) and holder.seconds is not None
                   and holder.seconds > self.tell_after_seconds for holder in holders)

    def chore(self) -> Callable[[], object]:
        """look_if_due as a maintenance chore."""

        def horizon() -> list[HorizonHolder]:
            return self.look_if_due()

        return horizon

    def look_if_due(self) -> list[HorizonHolder]:
        """Look (see look()) unless the last look was less than LOOK_SECONDS ago; nothing at
        all on SQLite."""
        if self.db.engine.dialect.name == "sqlite":
            return []
        now = self.clock.now_us()
        if now < self._next_look_us:
            return []
        # Set before the look: a look that fails is tried again next time, not every round.
        self._next_look_us = now + round(LOOK_SECONDS * MICROS)
        return self.look()

    def look(self) -> list[HorizonHolder]:
        """Log, once each, the holders past the threshold not logged before; forget those
        that hold no more (a new one is logged again); tell the listening processes while one
        has held past tell_after_seconds. Returns the ones logged now."""
        with self.db.read() as conn:
            holders = horizon_holders(conn)
        now = self.clock.now_us()
        seen: dict[HolderKey, int] = {}
        logged = []
        longest = 0.0
        for holder in holders:
            key = _key(holder)
            seen[key] = first_seen = self._first_seen_us.get(key, now)
            held = holder.seconds if holder.seconds is not None else \
                (now - first_seen) / MICROS
            if self._holds_this_database(holder):
                longest = max(longest, held)
            if key in self._logged or held <= self.threshold_seconds:
                continue
            self._logged.add(key)
            logged.append(holder)
            _warn(holder, held, self.threshold_seconds)
        self._first_seen_us = seen
        self._logged &= set(seen)
        if longest > self.tell_after_seconds:
            with self.db.read() as conn:
                tell_horizon_held(conn)
        return logged


    def _holds_this_database(self, holder: HorizonHolder) -> bool:
        # Only this database's sessions (and what holds every database's: a slot, a standby)
        # keep its dead rows: another database's snapshot holds back none of them.
        return holder.database in (None, self._database)


def _key(holder: HorizonHolder) -> HolderKey:
    """A transaction is its pid and start (a pid is reused by later sessions); a prepared
    transaction its gid and time; a slot or a standby its name or pid and the xmin it holds
    (one that moves on is not stuck: held again, it is a new holder)."""
    if holder.kind == TRANSACTION:
        return holder.kind, holder.pid, holder.since_us
    if holder.kind == PREPARED:
        return holder.kind, holder.name, holder.since_us
    return holder.kind, holder.name if holder.kind == SLOT else holder.pid, holder.xmin


def _warn(holder: HorizonHolder, held: float, threshold: float) -> None:
    # What identifies the holder and how to end it, never its query text: a statement may
    # carry tokens, payloads or passwords.
    who = ", ".join(part for part in (
        f"pid {holder.pid}" if holder.pid is not None else None,
        f"name {holder.name!r}" if holder.name is not None else None,
        f"application {holder.application_name!r}" if holder.application_name else None,
        f"client {holder.client_addr}" if holder.client_addr else None,
        f"user {holder.user!r}" if holder.user else None,
        f"database {holder.database!r}" if holder.database else None,
        f"state {holder.state!r}" if holder.state else None) if part)
    log.warning("database: a %s (%s) has held back the removal of dead rows for %.0f s "
                "(over QUEUELOG_HORIZON_WARN_SECONDS, %g): claims slow down the longer it "
                "lasts; %s", holder.kind, who or "not visible to this role", held, threshold,
                what_to_do(holder))
