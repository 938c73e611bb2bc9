"""The SQL of waits (docs/WAITS.md): each suspended job's wait (job_waits), the events producers
post (posted_events), and the suspended jobs whose moment has come. Every method runs on the
transaction it is given; the job's own transitions are the job repository's."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_, bindparam, delete, func, select, update

from app.core.statuses import JobStatus
from app.jobs.domain.waits import waiting_for
from app.jobs.sql.statuses import status_literal
from app.storage.chunks import chunked
from app.storage.dialects import conflict_insert, writers_serialised
from app.storage.schema import job_waits, jobs, posted_events

_SUSPENDED = status_literal(JobStatus.SUSPENDED)


@dataclass(frozen=True, slots=True)
class StoredWait:
    """One job's wait as stored: its kind (time, event or token), what it names, until when
    (a sleep's moment, a wait's timeout), and how and when it ended (None: it has not)."""

    job_id: int
    kind: str
    producer: str | None
    event_name: str | None
    event_key: str | None
    until_at: int
    suspended_at: int
    resolved_by: str | None
    resolved_at: int | None


@dataclass(frozen=True, slots=True)
class PostedEvent:
    """An event as stored: its id, data (compact JSON or None), when it was posted, and how
    many waits it ended."""

    id: int
    data: str | None
    posted_at: int
    woken: int


_WAIT_COLUMNS = (job_waits.c.job_id, job_waits.c.kind, job_waits.c.producer,
                 job_waits.c.event_name, job_waits.c.event_key, job_waits.c.until_at,
                 job_waits.c.suspended_at, job_waits.c.resolved_by, job_waits.c.resolved_at)
# A wait that has not ended (a job cancelled while it waited ends its wait too).
WAITING = job_waits.c.resolved_at.is_(None)
_EVENT_WAITING = and_(job_waits.c.kind == "event", WAITING)
_KEPT = and_(posted_events.c.woken == 0, posted_events.c.taken_by.is_(None))


class WaitRepository:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    # -- a job's wait -------------------------------------------------------------------------

    def save_wait(self, values: Mapping[str, Any]) -> None:
        """Store the job's new wait (`values`: job_waits' columns), replacing its last one."""
        stmt = conflict_insert(self.conn, job_waits).values(dict(values))
        changes = {name: stmt.excluded[name] for name in values if name != "job_id"}
        self.conn.execute(stmt.on_conflict_do_update(index_elements=[job_waits.c.job_id],
                                                     set_=changes))

    def waits_of(self, job_ids: Collection[int]) -> dict[int, StoredWait]:
        """The stored waits of these jobs, by job id (a job that never waited: absent)."""
        found: dict[int, StoredWait] = {}
        for chunk in chunked(sorted(job_ids)):
            rows = self.conn.execute(select(*_WAIT_COLUMNS).where(
                job_waits.c.job_id.in_(bindparam("ids", expanding=True))), {"ids": chunk})
            found |= {row.job_id: StoredWait(*row) for row in rows}
        return found

    def waiting_for(self, job_ids: Collection[int]) -> dict[int, dict[str, Any]]:
        """What each of these jobs waits for now, as the API shows it (app/jobs/domain/
        waits.py), by job id: only the jobs whose wait has not ended."""
        return {job_id: waiting_for(wait.kind, wait.until_at, wait.event_name, wait.event_key)
                for job_id, wait in self.waits_of(job_ids).items() if wait.resolved_at is None}

    def resolve(self, job_ids: Collection[int], by: str, now_us: int) -> None:
        """Record how these jobs' waits ended (the jobs' resume or cancel, in this
        transaction); a wait already ended keeps its first end."""
        for chunk in chunked(sorted(job_ids)):
            self.conn.execute(
                update(job_waits)
                .where(job_waits.c.job_id.in_(bindparam("ids", expanding=True)),
                       job_waits.c.resolved_at.is_(None))
                .values(resolved_by=by, resolved_at=now_us),
                {"ids": chunk})

    def event_waiters(self, producer: str, name: str, key: str) -> list[int]:
        """The jobs of `producer` whose wait for the event `name` with `key` has not ended,
        in id order."""
        return list(self.conn.execute(
            select(job_waits.c.job_id)
            .where(job_waits.c.producer == producer, job_waits.c.event_name == name,
                   job_waits.c.event_key == key, _EVENT_WAITING)
            .order_by(job_waits.c.job_id)).scalars())

    def wait_of_token(self, token_hash: str) -> StoredWait | None:
        """The wait the token (by its hash) names; None: no such token."""
        found = self.conn.execute(select(*_WAIT_COLUMNS).where(
            job_waits.c.token_hash == token_hash)).first()
        return None if found is None else StoredWait(*found)

    def lock_event(self, producer: str, name: str, key: str) -> None:
        """Take the lock of one producer's event name and key for the rest of the
        transaction: a wait stored and an event posted at once then see each other, one
        after the other, and neither misses the other. SQLite's writers run one at a time
        already."""
        if writers_serialised(self.conn):
            return
        channel = f"queuelog.event\x1f{producer}\x1f{name}\x1f{key}"
        self.conn.execute(select(func.pg_advisory_xact_lock(
            func.hashtextextended(bindparam("channel", channel), 0))))

    # -- suspended jobs due -----------------------------------------------------------------

    def due_suspended(self, now_us: int, limit: int) -> list[tuple[int, str]]:
        """Up to `limit` suspended jobs whose moment (a sleep's end, a wait's timeout) has
        come, soonest first: (job id, its wait's kind)."""
        rows = self.conn.execute(
            select(job_waits.c.job_id, job_waits.c.kind)
            .select_from(job_waits.join(jobs, jobs.c.id == job_waits.c.job_id))
            .where(WAITING, job_waits.c.until_at <= now_us, jobs.c.status == _SUSPENDED)
            .order_by(job_waits.c.until_at, job_waits.c.job_id).limit(limit))
        return [(row.job_id, row.kind) for row in rows]

    def any_due(self, now_us: int) -> bool:
        """Whether a wait's moment has come (its job's resume, or an orphan's end, is due)."""
        return self.conn.execute(select(job_waits.c.job_id).where(
            WAITING, job_waits.c.until_at <= now_us).limit(1)).first() is not None

    def end_orphaned(self, now_us: int) -> None:
        """End the waits past their moment whose job is no longer suspended."""
        self.conn.execute(
            update(job_waits)
            .where(WAITING, job_waits.c.until_at <= now_us, ~select(jobs.c.id).where(
                jobs.c.id == job_waits.c.job_id, jobs.c.status == _SUSPENDED).exists())
            .values(resolved_by="orphaned", resolved_at=now_us))

    # -- posted events ------------------------------------------------------------------------

    def event_by_idempotency_key(self, producer: str, idempotency_key: str
                                 ) -> PostedEvent | None:
        row = self.conn.execute(
            select(posted_events.c.id, posted_events.c.data, posted_events.c.posted_at,
                   posted_events.c.woken)
            .where(posted_events.c.producer == producer,
                   posted_events.c.idempotency_key == idempotency_key)).first()
        return None if row is None else PostedEvent(*row)

    def add_event(self, values: Mapping[str, Any]) -> int:
        """Store a posted event (`values`: its columns); its id."""
        event_id: int = self.conn.execute(
            posted_events.insert().values(dict(values)).returning(posted_events.c.id)
        ).scalar_one()
        return event_id

    def add_event_once(self, values: Mapping[str, Any]) -> int | None:
        """Store a posted event with an idempotency key; its id, or None when the producer's
        key names a stored event already (this one is then not stored)."""
        stmt = (conflict_insert(self.conn, posted_events).values(dict(values))
                .on_conflict_do_nothing(
                    index_elements=[posted_events.c.producer, posted_events.c.idempotency_key],
                    index_where=posted_events.c.idempotency_key.is_not(None))
                .returning(posted_events.c.id))
        found: int | None = self.conn.execute(stmt).scalar()
        return found

    def set_woken(self, event_id: int, woken: int) -> None:
        self.conn.execute(update(posted_events).where(posted_events.c.id == event_id)
                          .values(woken=woken))

    def take_kept_event(self, producer: str, name: str, key: str, job_id: int,
                        now_us: int) -> PostedEvent | None:
        """The oldest event of `producer`'s name and key that woke nobody and is still kept,
        taken by the job (no later wait takes it); None: there is none."""
        row = self.conn.execute(
            select(posted_events.c.id, posted_events.c.data, posted_events.c.posted_at,
                   posted_events.c.woken)
            .where(posted_events.c.producer == producer, posted_events.c.name == name,
                   posted_events.c.event_key == key, _KEPT,
                   posted_events.c.keep_until > now_us)
            .order_by(posted_events.c.id).limit(1)).first()
        if row is None:
            return None
        self.conn.execute(update(posted_events).where(posted_events.c.id == row.id)
                          .values(taken_by=job_id))
        return PostedEvent(*row)

    def delete_events_kept_until(self, now_us: int, limit: int) -> int:
        """Delete up to `limit` events whose keeping has ended; how many."""
        doomed = select(posted_events.c.id).where(
            posted_events.c.keep_until <= now_us).order_by(
            posted_events.c.keep_until).limit(limit).scalar_subquery()
        return self.conn.execute(
            delete(posted_events).where(posted_events.c.id.in_(doomed))).rowcount

    def delete_waits_of(self, job_ids: Collection[int]) -> None:
        """Retention removed these jobs: their waits go with them."""
        for chunk in chunked(sorted(job_ids)):
            self.conn.execute(delete(job_waits).where(
                job_waits.c.job_id.in_(bindparam("ids", expanding=True))), {"ids": chunk})
