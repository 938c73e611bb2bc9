"""raw sqlite3 doing the database work of the batch routes, the baseline of http_batch.py's
batch rows: the same job rows inserted in one transaction per batch (executemany), and
claims of many jobs then their completes, each in its own transaction, with the
repository's own statements.

Every run starts from a fresh database file migrated to the real schema (the jobs table
with every index the migrations make), opened with the pragmas app/storage/engine.py's
connect hook sets (WAL, busy_timeout, synchronous=FULL, foreign_keys). What it leaves out is
everything queuelog adds around the statements: HTTP, JSON, validation, SQLAlchemy, the group
commit, and the history rows (events, attempts) each job also gets.
"""

from __future__ import annotations

import secrets
import sqlite3
import time
from pathlib import Path
from typing import Any

from sqlalchemy import insert
from sqlalchemy.dialects import sqlite

from app.core.callers import Caller, Role
from app.core.priorities import Priority
from app.jobs.domain.intake import IntakeRules, new_job
from app.storage.schema import jobs
from bench.data import JOB_TYPES, job_body, migrated_database
from bench.storage import (
    BUSY_TIMEOUT_MS,
    COLUMNS,
    LEASE_US,
    WORKER,
    Statements,
    completed_values,
    now_us,
)

SYNCHRONOUS = "FULL"
PRODUCER = Caller(name="producer-0", role=Role.PRODUCER, max_priority=Priority.MEDIUM,
                  allowed_types=None)
RULES = IntakeRules(frozenset(JOB_TYPES.split(",")), 65_536)


def job_rows(count: int, now: int) -> list[dict[str, Any]]:
    """The rows POST /jobs/batch stores for `count` of the HTTP benchmark's job bodies (built
    by the service's own intake, so every column holds what the route would write)."""
    return [new_job(RULES, PRODUCER, _loaded(job_body(n)), None, now).values
            for n in range(count)]


def _loaded(body: dict[str, Any]) -> dict[str, Any]:
    # What EnqueueSchema loads from such a body: its defaults filled in.
    return {"payload": {}, "max_retries": 3, "run_at": None, "delay_seconds": None,
            "idempotency_key": None, "concurrency_key": None, "unique": None, **body,
            "priority": Priority.from_label(body["priority"])}


class RawBatchStore:
    """One fresh database and a sqlite3 connection to it set up as the engine's are."""

    def __init__(self, directory: str, name: str, statements: Statements) -> None:
        migrated_database(directory, name)
        self.conn = sqlite3.connect(str(Path(directory) / name), isolation_level=None,
                                    check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        self.conn.execute(f"PRAGMA synchronous={SYNCHRONOUS}")
        self.conn.execute("PRAGMA foreign_keys=ON")
        self.statements = statements
        self.id_at, self.token_at = COLUMNS.index("id"), COLUMNS.index("lease_token")

    def close(self) -> None:
        self.conn.close()

    def _transaction(self, work: Any) -> Any:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            result = work()
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")
        return result

    def insert(self, rows: list[dict[str, Any]], per_transaction: int) -> float:
        """Insert `rows`, `per_transaction` at a time; returns the seconds the transactions
        took (binding the values included)."""
        # The jobs table's INSERT as Core compiles it for these columns (without the
        # RETURNING the repository adds: executemany reads no rows).
        compiled = insert(jobs).compile(dialect=sqlite.dialect(), column_keys=list(rows[0]))
        sql, names = compiled.string, list(compiled.positiontup or [])
        spent = 0.0
        for first in range(0, len(rows), per_transaction):
            chunk = rows[first:first + per_transaction]
            began = time.perf_counter()
            self._transaction(lambda chunk=chunk: self.conn.executemany(
                sql, [tuple(row[name] for name in names) for row in chunk]))
            spent += time.perf_counter() - began
        return spent

    def claim_complete(self, per_request: int) -> tuple[int, float]:
        """Claim up to `per_request` jobs in claim order (the repository's claim UPDATE …
        RETURNING, one transaction), then complete each (the repository's fenced UPDATE …
        RETURNING per job, as complete-many runs it, one transaction). Returns (jobs
        completed, seconds)."""
        began = time.perf_counter()
        now = now_us()
        claimed = self._transaction(lambda: self.conn.execute(*self.statements.bind("claim", {
            "now": now, "limit": per_request, "worker": WORKER.name,
            "lease_expires_at": now + LEASE_US, "nonce": secrets.token_hex(16)})).fetchall())
        if not claimed:
            return 0, time.perf_counter() - began
        held = [(row[self.id_at], row[self.token_at]) for row in claimed]

        def complete_each() -> None:
            now = now_us()
            for job_id, token in held:
                values = {f"new_{name}": value
                          for name, value in completed_values(now).items()}
                if not self.conn.execute(*self.statements.bind("complete", {
                        **values, "job_id": job_id, "worker": WORKER.name, "now": now,
                        "held_lease_token": token})).fetchall():
                    raise RuntimeError(f"job {job_id} was not completed")

        self._transaction(complete_each)
        return len(held), time.perf_counter() - began


def raw_insert_rate(directory: str, name: str, statements: Statements, count: int,
                    per_transaction: int) -> float:
    """Rows/s inserting `count` job rows, `per_transaction` at a time, in a fresh database."""
    store = RawBatchStore(directory, name, statements)
    try:
        rows = job_rows(count, now_us())
        return count / store.insert(rows, per_transaction)
    finally:
        store.close()


def raw_cycle_rate(directory: str, name: str, statements: Statements, count: int,
                   per_request: int) -> float:
    """Jobs/s claiming and completing `count` jobs, `per_request` at a time, in a fresh
    database filled with them first (not timed)."""
    store = RawBatchStore(directory, name, statements)
    try:
        store.insert(job_rows(count, now_us() - 1), 1000)
        done, spent = 0, 0.0
        while done < count:
            jobs_done, seconds = store.claim_complete(per_request)
            if not jobs_done:
                raise RuntimeError(f"only {done} of {count} jobs were claimable")
            done += jobs_done
            spent += seconds
        return done / spent
    finally:
        store.close()
