"""The only place job_types SQL lives. Every method runs on the connection it is given."""

from __future__ import annotations

import functools
from collections.abc import Collection
from typing import Any

from sqlalchemy import (
    Connection,
    Integer,
    bindparam,
    or_,
    select,
    type_coerce,
    union_all,
    update,
)

from app.jobs.sql.job_rows import COUNTS_RUNNING_TYPE, KEY_MODE_TYPE, PAUSED_PUSHED_OR_FAIR_TYPE
from app.jobs.tx.key_rules import KeyMode
from app.storage.dialects import conflict_insert
from app.storage.schema import job_types
from app.storage.statements import DriverStatement
from app.types.models import TypeSettings

_counts_running = COUNTS_RUNNING_TYPE
# A fair type is "limited" too: its claims read round order (docs/FLOW-CONTROL.md).
_paused_or_pushed = PAUSED_PUSHED_OR_FAIR_TYPE
# Every claim asks; on most servers no type is limited, and the answer is no row. Read in one
# statement, on SQLite's driver cursor too: `paused` as the integer it is stored as (a
# Boolean column's conversion would send the statement through Core), made a bool by
# from_values.
_select_limited = DriverStatement(
    select(*(type_coerce(column, Integer) if column.name == "paused" else column
             for column in job_types.c))
    .where(or_(_paused_or_pushed, _counts_running)))
# Every enqueue and finishing transition asks which types are fair or ordered: a few rows
# at most, read whole on the driver's cursor.
_select_key_modes = DriverStatement(
    select(job_types.c.type, job_types.c.fairness, job_types.c.ordering,
           job_types.c.on_failure, job_types.c.key_scope)
    .where(KEY_MODE_TYPE))
_select_pushed = select(job_types).where(job_types.c.push_url.is_not(None)).order_by(
    job_types.c.type)


@functools.cache
def _lock_limited(of_some_types: bool) -> Any:
    """One round trip for a PostgreSQL claim: the rows with a cap or a rate locked FOR UPDATE
    in type order (so that claims never deadlock), and the rows only paused or pushed, read."""
    locked = select(job_types).where(_counts_running)
    paused_only = select(job_types).where(_paused_or_pushed, ~_counts_running)
    if of_some_types:
        of_types = job_types.c.type.in_(bindparam("types", expanding=True))
        locked, paused_only = locked.where(of_types), paused_only.where(of_types)
    locked_rows = locked.order_by(job_types.c.type).with_for_update().cte("locked")
    return union_all(select(locked_rows), paused_only)


# Sorted, so that claims locking several types' rows always take them in one order.
_lock_settings = (
    select(job_types)
    .where(job_types.c.type.in_(bindparam("types", expanding=True)))
    .order_by(job_types.c.type)
    .with_for_update()
)
_select_settings = select(job_types).where(job_types.c.type.in_(
    bindparam("types", expanding=True)))
_spend_tokens = (
    update(job_types)
    .where(job_types.c.type == bindparam("t"))
    .values(tokens=bindparam("tokens"), tokens_at=bindparam("at"))
)

# Built once: a statement built per claim costs more than a round trip saves.
_spend_tokens_cte = (
    update(job_types)
    .where(job_types.c.type == bindparam("spent_type"))
    .values(tokens=bindparam("spent_tokens"), tokens_at=bindparam("spent_at"))
    .cte("spent")
)


def key_modes_of(conn: Connection, types: Collection[str]) -> dict[str, KeyMode]:
    """The job transactions' ModeSource (app/jobs/tx/key_rules.py)."""
    return TypeRepository(conn).key_modes(types)


class TypeRepository:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def limited_settings(self) -> list[TypeSettings]:
        """The rows of every type that is paused, pushed or has a cap or a rate: the few a
        claim must look at (a table of one row per configured type at most)."""
        return [TypeSettings.from_values(row) for row in _select_limited.rows(self.conn, {})]

    def key_modes(self, types: Collection[str]) -> dict[str, KeyMode]:
        """The fair or ordered types among `types`, with their key modes
        (docs/FLOW-CONTROL.md, Fair share and ordered keys)."""
        wanted = set(types)
        return {job_type: TypeSettings(type=job_type, fairness=fairness, ordering=ordering,
                                       on_failure=on_failure, key_scope=key_scope).key_mode
                for job_type, fairness, ordering, on_failure, key_scope
                in _select_key_modes.rows(self.conn, {}) if job_type in wanted}

    def pushed_settings(self) -> list[TypeSettings]:
        """The rows of the push types, by type."""
        return [TypeSettings.from_row(row._mapping) for row in self.conn.execute(_select_pushed)]

    def lock_limited_settings(self, types: Collection[str] | None) -> list[TypeSettings]:
        """The limited rows (of these types; None: of every type), those with a cap or a rate
        locked FOR UPDATE on PostgreSQL: the claims of a limited type take turns on its row,
        so each counts what the one before it started."""
        params = {} if types is None else {"types": sorted(types)}
        rows = self.conn.execute(_lock_limited(types is not None), params)
        return [TypeSettings.from_row(row._mapping) for row in rows]

    def lock_settings(self, types: Collection[str]) -> list[TypeSettings]:
        """Read these types' rows FOR UPDATE (PostgreSQL), in type order: the claims of a
        limited type take turns on its row, so each counts what the one before it started."""
        rows = self.conn.execute(_lock_settings, {"types": sorted(types)})
        return [TypeSettings.from_row(row._mapping) for row in rows]

    def settings_of(self, types: Collection[str]) -> dict[str, TypeSettings]:
        rows = self.conn.execute(_select_settings, {"types": sorted(types)})
        return {row.type: TypeSettings.from_row(row._mapping) for row in rows}

    def ensure_row(self, settings: TypeSettings) -> None:
        """Store the type's row unless there is one (a type never changed has none)."""
        stmt = conflict_insert(self.conn, job_types).values(settings.values())
        self.conn.execute(stmt.on_conflict_do_nothing(index_elements=["type"]))

    def save(self, settings: TypeSettings) -> None:
        values = settings.values()
        self.conn.execute(update(job_types).where(job_types.c.type == values.pop("type"))
                          .values(values))

    def save_buckets(self, buckets: dict[str, tuple[float, int]]) -> None:
        """Store each rate-limited type's bucket (tokens, as of when) after a claim."""
        for job_type, (tokens, at) in sorted(buckets.items()):
            self.conn.execute(_spend_tokens, {"t": job_type, "tokens": tokens, "at": at})

    @staticmethod
    def spend_bucket(job_type: str, tokens: float, at: int) -> tuple[Any, dict[str, Any]]:
        """The write of `save_buckets` for one type, as a CTE to run inside another
        statement, and its parameters."""
        return _spend_tokens_cte, {"spent_type": job_type, "spent_tokens": tokens,
                                   "spent_at": at}

    def note_last_claim(self, types: Collection[str], now_us: int) -> None:
        """Move each type's last_claim_at forward to `now_us` (never back)."""
        for job_type in sorted(types):
            self.ensure_row(TypeSettings(type=job_type, updated_at=now_us))
        self.conn.execute(
            update(job_types)
            .where(job_types.c.type.in_(sorted(types)),
                   or_(job_types.c.last_claim_at.is_(None),
                       job_types.c.last_claim_at < now_us))
            .values(last_claim_at=now_us))
