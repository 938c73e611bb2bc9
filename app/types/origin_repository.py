"""The only place push_origins SQL lives: the figure each push origin's deliveries run at, as
the dispatcher last wrote it (docs/PUSH.md, "Adaptive concurrency"). The dispatcher writes
the rows and GET /types reads them, so the module sits in the lower of the two packages.
Every method runs on the connection it is given."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from sqlalchemy import Connection, bindparam, select

from app.storage.dialects import conflict_insert
from app.storage.schema import push_origins

# An origin longer than its column (a host name no resolver would take) is never stored: on
# PostgreSQL the write would fail again every second.
ORIGIN_CHARS: int = push_origins.c.origin.type.length  # type: ignore[attr-defined]

_select_figures = select(push_origins).where(
    push_origins.c.origin.in_(bindparam("origins", expanding=True)))


@dataclass(frozen=True)
class OriginFigure:
    """How many deliveries to one push origin may run at once now, and until when (µs) no new
    one starts there (its last Retry-After; None: not held)."""

    origin: str
    concurrency: int
    cap: int
    held_until: int | None = None


class OriginRepository:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def save(self, figures: Iterable[OriginFigure], now_us: int) -> None:
        """Store each origin's figure, replacing the one stored."""
        for figure in figures:
            if len(figure.origin) > ORIGIN_CHARS:
                continue
            values = {"concurrency": figure.concurrency, "cap": figure.cap,
                      "held_until": figure.held_until, "updated_at": now_us}
            stmt = conflict_insert(self.conn, push_origins).values(origin=figure.origin,
                                                                   **values)
            self.conn.execute(stmt.on_conflict_do_update(index_elements=["origin"],
                                                         set_=values))

    def figures_of(self, origins: Collection[str]) -> dict[str, OriginFigure]:
        """The stored figures of these origins, by origin (an origin never written: none)."""
        if not origins:
            return {}
        rows = self.conn.execute(_select_figures, {"origins": sorted(origins)})
        return {row.origin: OriginFigure(row.origin, row.concurrency, row.cap, row.held_until)
                for row in rows}
