"""Writes a transaction leaves for its commit.

Some rows are added to by every change (the stats' minute, app/jobs/timeline/
stats_repository.py). Written as each caller's work ends, several callers' work sharing one
SQLite transaction (app/storage/group_commit.py) would write the same row once each, on
the serial path; on PostgreSQL the row's lock would be held from that write to the commit.
So a caller's work leaves what it adds in a state kept for its transaction (`state_for`),
and the one who commits writes it once, just before the COMMIT (`run_before_commit`).

The state lives on the pooled connection, tagged with the transaction it belongs to: a
transaction rolled back leaves a state no later transaction takes for its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection

Flush = Callable[[Connection, dict[Any, Any]], None]
_KEY = "queuelog_at_commit"


def state_for(conn: Connection, name: str, flush: Flush) -> dict[Any, Any]:
    """The state `name` keeps for `conn`'s transaction (empty at first); `flush(conn, state)`
    writes it before the transaction commits."""
    transaction = conn.get_transaction()
    held: dict[str, tuple[Any, Flush, dict[Any, Any]]] = conn.info.setdefault(_KEY, {})
    entry = held.get(name)
    if entry is None or entry[0] is not transaction:
        entry = held[name] = (transaction, flush, {})
    return entry[2]


def run_before_commit(conn: Connection) -> None:
    """Write what the transaction's work left for its commit; called by whoever commits, in
    the transaction, last."""
    held = conn.info.pop(_KEY, None)
    if not held:
        return
    transaction = conn.get_transaction()
    for owner, flush, state in held.values():
        if owner is transaction and state:
            flush(conn, state)
