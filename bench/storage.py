"""Storage without HTTP: the repository's enqueue, claim and complete (JobRepository through
Database.run_write, one job per transaction, as the service runs them) beside raw sqlite3
running the very statements the repository emits, with the same pragmas, in the same run.
The service layer (JobService: validation, the lease rescue before each claim, events) is
measured beside them too.

    PYTHONPATH=. python bench/storage.py [--smoke] [--repeats N]
"""

from __future__ import annotations

import secrets
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/storage.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.core.callers import Caller, Role
from app.core.clock import Clock
from app.core.priorities import Priority
from app.core.statuses import JobStatus
from app.jobs.domain.models import Backoff
from app.jobs.domain.settings import QueueSettings
from app.jobs.domain.transitions import Transition
from app.jobs.sql.repository import JobRepository
from app.jobs.timeline.recorder import HistoryRecorder
from app.jobs.tx.uow import bind_jobs
from app.jobs.usecases.service import JobService
from app.storage.engine import Database, make_engine
from app.storage.schema import jobs
from app.storage.uow import UnitOfWork
from app.types.repository import key_modes_of
from bench.data import migrated_database, scratch_directory
from bench.report import Report, Table, Target, run_script
from bench.stats import Spread, percentile

FULL_JOBS = 2000
SMOKE_JOBS = 100
LEASE_US = 300 * 1_000_000
BUSY_TIMEOUT_MS = 30_000
# No key stands behind the bench's callers (the database it fills has none): they are the
# service's own, whose liveness no statement checks.
PRODUCER = Caller(name="producer", role=Role.PRODUCER, max_priority=Priority.MEDIUM,
                  allowed_types=None, internal=True)
WORKER = Caller(name="worker", role=Role.WORKER, max_priority=Priority.MEDIUM,
                allowed_types=None, internal=True)
COLUMNS = [column.name for column in jobs.c]
OPERATIONS = ("enqueue", "claim", "complete")
# The repository should cost little more than the SQL it sends.
TARGET_RATIO = 0.9


def payload(n: int) -> str:
    return f'{{"to":"user-{n}@example.com","template":"welcome-v2","locale":"en-GB"}}'


def new_job_values(n: int, now: int) -> dict[str, Any]:
    """The row the service builds for a plain enqueue."""
    return {"type": "email", "payload": payload(n), "priority": int(Priority.MEDIUM),
            "status": JobStatus.PENDING.value, "retry_count": 0, "max_retries": 3,
            "producer": PRODUCER.name, "idempotency_key": None, "request_fingerprint": None,
            "run_at": now, "claimed_at": None, "worker_id": None, "lease_expires_at": None,
            "lease_token": None, "result": None, "error": None, "created_at": now,
            "updated_at": now}


def completed_values(now: int) -> dict[str, Any]:
    return Transition.COMPLETE.values(now_us=now, result='{"message_id":"0123456789abcdef"}')


def now_us() -> int:
    return time.time_ns() // 1000


# -- the three ways of doing the same work ------------------------------------------------------
#
# Each way keeps its own database and the jobs it holds; `step(operation, n)` does the n-th
# job's enqueue, claim or complete in one write transaction.

class RepositoryWay:
    """JobRepository methods inside Database.run_write, as the service calls them."""

    def __init__(self, url: str, synchronous: str,
                 on_engine: Callable[[Any], None] | None = None) -> None:
        self.db = Database(make_engine(url, sqlite_synchronous=synchronous,
                                       sqlite_busy_timeout_ms=BUSY_TIMEOUT_MS))
        if on_engine is not None:
            on_engine(self.db.engine)
        self.held: list[tuple[int, str]] = []

    def step(self, operation: str, n: int) -> None:
        getattr(self, operation)(n)

    def enqueue(self, n: int) -> None:
        self.db.run_write(
            lambda conn: JobRepository(conn).insert_job(new_job_values(n, now_us())))

    def claim(self, _n: int) -> None:
        def claim_in(conn: Any) -> Any:
            now = now_us()
            return JobRepository(conn).claim_next_jobs(
                now_us=now, worker=WORKER.name, lease_expires_at=now + LEASE_US,
                nonce=secrets.token_hex(16), limit=1, types=None).jobs
        job = self.db.run_write(claim_in)[0]
        self.held.append((job.id, job.lease_token))

    def complete(self, n: int) -> None:
        job_id, token = self.held[n]

        def complete_in(conn: Any) -> Any:
            now = now_us()
            return JobRepository(conn).apply_transition(
                Transition.COMPLETE, job_id, completed_values(now), worker=WORKER.name,
                now_us=now, lease_token=token)
        if self.db.run_write(complete_in) is None:
            raise RuntimeError(f"job {job_id} was not completed")

    def close(self) -> None:
        self.db.engine.dispose()


class ServiceWay(RepositoryWay):
    """JobService.enqueue / claim / complete: the HTTP handlers' calls, without HTTP."""

    def __init__(self, url: str, synchronous: str) -> None:
        super().__init__(url, synchronous)
        self.service = JobService(UnitOfWork(self.db, bind_jobs(
            HistoryRecorder(), key_modes=key_modes_of)), Clock(),
                                  QueueSettings(
                                      job_types=frozenset({"email"}), lease_seconds=300,
                                      max_payload_bytes=65_536, backoff=Backoff(1.0, 3600.0),
                                      bulk_batch_size=500))
        self.claimed: list[Any] = []

    def enqueue(self, n: int) -> None:
        self.service.enqueue(PRODUCER, {
            "type": "email", "payload": {"to": f"user-{n}@example.com",
                                         "template": "welcome-v2", "locale": "en-GB"},
            "priority": None, "max_retries": 3, "run_at": None, "delay_seconds": None,
            "idempotency_key": None})

    def claim(self, _n: int) -> None:
        self.claimed.append(self.service.claim(WORKER)[0])

    def complete(self, n: int) -> None:
        held = self.claimed[n]
        self.service.complete(WORKER, held.job.id, lease_token=held.lease_token,
                              result={"message_id": "0123456789abcdef"})


class Statements:
    """The SQL the repository sends for each operation, caught on its way to the driver, with
    the order of its parameters and the values of the constants SQLAlchemy binds itself."""

    def __init__(self, directory: str) -> None:
        from sqlalchemy import event

        url = migrated_database(directory, "statements.sqlite3")
        caught: list[tuple[str, tuple[Any, ...], list[str]]] = []

        def catch(_conn: Any, _cursor: Any, statement: str, parameters: Any, context: Any,
                  _many: bool) -> None:
            if not statement.startswith(("BEGIN", "COMMIT")):
                caught.append((statement, tuple(parameters),
                               list(getattr(context.compiled, "positiontup", None) or [])))

        probe = RepositoryWay(url, "FULL", lambda engine: event.listen(
            engine, "before_cursor_execute", catch))
        try:
            for operation in OPERATIONS:
                probe.step(operation, 0)
        finally:
            probe.close()
        if len(caught) != 3:
            raise RuntimeError(f"expected 3 statements from the repository, caught {caught}")
        self.by_operation = dict(zip(OPERATIONS, caught, strict=True))

    def bind(self, operation: str, values: dict[str, Any]) -> tuple[str, tuple[Any, ...]]:
        """The statement and its parameters with `values` in place of the caught ones."""
        sql, caught, names = self.by_operation[operation]
        return sql, tuple(values.get(name, caught[i]) for i, name in enumerate(names))


class RawWay:
    """sqlite3 alone: the repository's statements, the engine's pragmas, nothing else."""

    def __init__(self, path: str, synchronous: str, statements: Statements) -> None:
        # The connection set up as app/storage/engine.py's connect hook sets up the engine's.
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        self.conn.execute(f"PRAGMA synchronous={synchronous}")
        self.conn.execute("PRAGMA foreign_keys=ON")
        self.statements = statements
        self.insert_sql, _, self.insert_names = statements.by_operation["enqueue"]
        self.id_at, self.token_at = COLUMNS.index("id"), COLUMNS.index("lease_token")
        self.held: list[tuple[int, str]] = []

    def step(self, operation: str, n: int) -> None:
        getattr(self, operation)(n)

    def write(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            rows = self.conn.execute(sql, params).fetchall()
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")
        return rows

    def enqueue(self, n: int) -> None:
        values = new_job_values(n, now_us())
        self.write(self.insert_sql, tuple(values[name] for name in self.insert_names))

    def claim(self, _n: int) -> None:
        now = now_us()
        row = self.write(*self.statements.bind("claim", {
            "now": now, "limit": 1, "worker": WORKER.name, "lease_expires_at": now + LEASE_US,
            "nonce": secrets.token_hex(16)}))[0]
        self.held.append((row[self.id_at], row[self.token_at]))

    def complete(self, n: int) -> None:
        job_id, token = self.held[n]
        now = now_us()
        values = {f"new_{name}": value for name, value in completed_values(now).items()}
        rows = self.write(*self.statements.bind("complete", {
            **values, "job_id": job_id, "worker": WORKER.name, "now": now,
            "held_lease_token": token}))
        if not rows:
            raise RuntimeError(f"job {job_id} was not completed")

    def close(self) -> None:
        self.conn.close()


WAYS = ("raw", "repository", "service")
# The ways take turns every CHUNK jobs, so that the disk's and the machine's changing load
# falls on all three alike.
CHUNK = 10


def run_pass(directory: str, tag: str, count: int, synchronous: str,
             statements: Statements, repeat: int) -> dict[str, dict[str, list[float]]]:
    """One pass: every way enqueues, then claims, then completes `count` jobs, in turns.
    Returns latencies[way][operation]."""
    ways: dict[str, Any] = {}
    for way in WAYS:
        name = f"{way}-{tag}.sqlite3"
        url = migrated_database(directory, name)
        if way == "raw":
            ways[way] = RawWay(str(Path(directory) / name), synchronous, statements)
        elif way == "repository":
            ways[way] = RepositoryWay(url, synchronous)
        else:
            ways[way] = ServiceWay(url, synchronous)
    latencies = {way: {operation: [] for operation in OPERATIONS} for way in WAYS}
    turn = 0
    try:
        for operation in OPERATIONS:
            for first in range(0, count, CHUNK):
                turn += 1
                shift = (repeat + turn) % len(WAYS)
                for way in WAYS[shift:] + WAYS[:shift]:
                    out, step = latencies[way][operation], ways[way].step
                    for n in range(first, min(first + CHUNK, count)):
                        began = time.perf_counter()
                        step(operation, n)
                        out.append(time.perf_counter() - began)
    finally:
        for runner in ways.values():
            runner.close()
    return latencies


# -- the run -----------------------------------------------------------------------------------

def measure(options: Any) -> Report:
    count = SMOKE_JOBS if options.smoke else FULL_JOBS
    report = Report("Storage: repository vs raw sqlite3", "python bench/storage.py",
                    options.smoke, options.repeats)
    # figures[(synchronous, way, operation)]: jobs/s; p50[(synchronous, way, operation)]: µs
    figures: dict[tuple[str, str, str], Spread] = {}
    p50: dict[tuple[str, str, str], Spread] = {}
    ratios: dict[tuple[str, str, str], Spread] = {}
    with scratch_directory("queuelog-bench-storage-") as directory:
        statements = Statements(directory)
        for repeat in range(options.repeats):
            for synchronous in ("FULL", "OFF"):
                latencies = run_pass(directory, f"{synchronous}-{repeat}", count, synchronous,
                                     statements, repeat)
                rate: dict[tuple[str, str], float] = {}
                for way in WAYS:
                    for operation in OPERATIONS:
                        rate[(way, operation)] = count / sum(latencies[way][operation])
                        p50.setdefault((synchronous, way, operation), Spread()).add(
                            percentile(latencies[way][operation], 50) * 1e6)
                    rate[(way, "cycle")] = count / (sum(latencies[way]["claim"])
                                                    + sum(latencies[way]["complete"]))
                for (way, operation), value in rate.items():
                    figures.setdefault((synchronous, way, operation), Spread()).add(value)
                    if way != "raw":
                        ratios.setdefault((synchronous, way, operation), Spread()).add(
                            value / rate[("raw", operation)])
                print(f"repeat {repeat + 1}, synchronous={synchronous}: claim+complete "
                      f"repository {rate[('repository', 'cycle')]:,.0f}/s, "
                      f"raw {rate[('raw', 'cycle')]:,.0f}/s", file=sys.stderr, flush=True)

    labels = {"enqueue": "enqueue", "claim": "claim", "complete": "complete",
              "cycle": "claim + complete"}
    for synchronous in ("FULL", "OFF"):
        title = (f"synchronous={synchronous}: jobs/s, one job per transaction, {count:,} jobs "
                 "(median [min-max] over repeats)")
        if synchronous == "OFF":
            title += " — informational: without the fsync, the CPU cost of each layer shows"
        table = Table(title, ["operation", "raw sqlite3", "repository", "repository / raw",
                              "service", "service / raw", "p50 µs raw / repository / service"])
        for operation in (*OPERATIONS, "cycle"):
            latency = "" if operation == "cycle" else " / ".join(
                f"{p50[(synchronous, way, operation)].median:,.0f}" for way in WAYS)
            table.add(labels[operation], figures[(synchronous, "raw", operation)].show(),
                      figures[(synchronous, "repository", operation)].show(),
                      ratios[(synchronous, "repository", operation)].show(2),
                      figures[(synchronous, "service", operation)].show(),
                      ratios[(synchronous, "service", operation)].show(2), latency)
        report.tables.append(table)
    ratio = ratios[("FULL", "repository", "cycle")]
    report.targets.append(Target("repository claim + complete vs raw sqlite3 (synchronous=FULL)",
                                 f"≥ {TARGET_RATIO}", ratio.show(2),
                                 ratio.median >= TARGET_RATIO))
    report.notes += [
        "One thread, one job per write transaction (BEGIN IMMEDIATE … COMMIT), as a lone "
        "HTTP request runs it; with no concurrent callers the group commit has nothing to "
        "group, so every job pays its own commit.",
        "raw sqlite3 runs the statements the repository sent (caught from SQLAlchemy's "
        "before_cursor_execute in a probe run) with the same connection pragmas (WAL, "
        "busy_timeout, synchronous, foreign_keys) and reads the RETURNING rows; it skips "
        "SQLAlchemy, the Job records and Database.run_write's group-commit machinery "
        "(thread handoff, flock on the -writelock file).",
        "repository: JobRepository methods inside Database.run_write. service: JobService "
        "enqueue / claim / complete (validation, the expired-lease rescue query before "
        "each claim, metrics events).",
        f"Each way has its own fresh database per pass; the three take turns every {CHUNK} "
        "jobs (in rotating order), so the shared machine's changing load falls on all alike.",
    ]
    return report


def main(argv: list[str] | None = None) -> None:
    run_script(measure, __doc__, argv)


if __name__ == "__main__":
    main()
