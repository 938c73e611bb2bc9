"""All SQL of worker_instances: each key's instances, written at most once a minute per key,
label and process (app/jobs/timeline/instances.py), read by GET /workers and the dashboard,
forgotten a day after they were last seen."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_, case, delete, or_, select, tuple_

from app.jobs.timeline.instances import InstanceNote
from app.storage.dialects import conflict_insert_for
from app.storage.schema import worker_instances

_ROW = worker_instances.c


@functools.cache
def _upsert(dialect: str) -> Any:
    """A note added to its instance's row: the later of the two times seen and claimed, and
    the claims of one minute summed over the processes that counted them, the latest minute
    kept (an older minute's count, written late, changes nothing)."""
    stmt = conflict_insert_for(dialect, worker_instances)
    new = stmt.excluded
    later = or_(_ROW.minute.is_(None), new.minute > _ROW.minute)
    return stmt.on_conflict_do_update(index_elements=[_ROW.name, _ROW.instance], set_={
        "last_seen_at": case((new.last_seen_at > _ROW.last_seen_at, new.last_seen_at),
                             else_=_ROW.last_seen_at),
        "last_claim_at": case(
            (and_(new.last_claim_at.is_not(None),
                  or_(_ROW.last_claim_at.is_(None), new.last_claim_at > _ROW.last_claim_at)),
             new.last_claim_at),
            else_=_ROW.last_claim_at),
        "claimed": case((new.minute.is_(None), _ROW.claimed),
                        (new.minute == _ROW.minute, _ROW.claimed + new.claimed),
                        (later, new.claimed),
                        else_=_ROW.claimed),
        "minute": case((and_(new.minute.is_not(None), later), new.minute),
                       else_=_ROW.minute),
    })


@dataclass(frozen=True, slots=True)
class InstanceRow:
    """One row of worker_instances (times in microseconds since the epoch)."""

    name: str
    instance: str
    last_seen_at: int
    last_claim_at: int | None
    minute: int | None
    claimed: int


class InstanceRepository:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def record(self, note: InstanceNote) -> None:
        self.conn.execute(_upsert(self.conn.dialect.name), {
            "name": note.name, "instance": note.instance, "last_seen_at": note.seen_at,
            "last_claim_at": note.last_claim_at, "minute": note.minute,
            "claimed": note.claimed})

    def seen_since(self, since_us: int) -> list[InstanceRow]:
        """The instances seen at or after `since_us`, by key and label."""
        rows = self.conn.execute(
            select(worker_instances).where(_ROW.last_seen_at >= since_us)
            .order_by(_ROW.name, _ROW.instance))
        return [InstanceRow(*row) for row in rows]

    def forget_seen_before(self, before_us: int, limit: int) -> int:
        """Delete up to `limit` instances last seen before `before_us`; how many."""
        doomed = (select(_ROW.name, _ROW.instance).where(_ROW.last_seen_at < before_us)
                  .order_by(_ROW.last_seen_at).limit(limit))
        result = self.conn.execute(
            delete(worker_instances).where(tuple_(_ROW.name, _ROW.instance).in_(doomed)))
        return int(result.rowcount or 0)
