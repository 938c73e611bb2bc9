"""Retention (docs/OPERATIONS.md): single enqueues and claims while the ticker removes a
million expired jobs, beside the same server with nothing to remove; and the longest write
lock one retention batch holds.

The store: a million completed jobs (types email and report alternating) with what real ones
carry, each its attempt and its three events (enqueued, claimed with its lease, completed),
inserted by SQL (setup, not timed: INSERT ... SELECT over a recursive series, the same
statements on both engines), last updated two days ago — in the past by the real clock, so
expired for a type keeping completed jobs 60 s, kept by the default 7 days. Plus 40,000
pending report jobs (the real enqueue path) for the claims, and the keys. Built once per
engine as a template; every run gets a copy of its own (a file copy on SQLite, CREATE
DATABASE ... TEMPLATE on PostgreSQL).

1. Over HTTP, against real gunicorn (the shipped gunicorn.conf.py, QUEUELOG_SCHEDULER on:
   wsgi.py starts each worker's ticker, whose retention chore removes the expired jobs in
   batches of 200, for at most 50 ms a tick): 4 client threads doing single POST /jobs
   (email) and 4 doing POST /jobs/claim {"types": ["report"]} + complete, at once, for
   WINDOW seconds from the moment the server answers, on
   - "during removal": a copy whose types keep completed jobs 60 s (the million expired);
   - "baseline": a copy whose types keep completed jobs for ever (nothing to remove).
   The two alternate which goes first. Enqueues/s and claims + completes/s of each, and
   during / baseline (target: >= 0.7 each). A thread counts the million's rows left every two
   seconds, and in the first repeat the "during" server runs on until none is left: the
   removal's duration (from the server's launch; the load runs in its first WINDOW seconds
   only; later repeats stop after the window, the removal still under way).
2. The write lock one batch holds, in this process, once: Retention.remove_expired(windows,
   max_batches=1) called until a copy's million is gone, each batch's write transaction
   (UnitOfWork.write_alone: BEGIN IMMEDIATE to COMMIT on SQLite) timed: median, p99, max.
   One thread, nothing else writing: the hold itself, no wait for the lock. The first call
   of a pass also reads the windows and forgets stale failure groups (a transaction of its
   own, timed too).

    PYTHONPATH=. python bench/retention.py [--smoke] [--repeats N] [--engines sqlite,postgresql]

With QUEUELOG_BENCH_POSTGRES_URL set to a PostgreSQL server URL, it is measured on
PostgreSQL as well, in databases of its own.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/retention.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.data import (
    JOB_TYPES,
    POSTGRES_VARIABLE,
    RESULT,
    StandInAutovacuum,
    chosen_engines,
    create_keys,
    engines_option,
    job_body,
    migrated_database,
    scratch_directory,
)
from bench.load import Client, LoadResult, run_load, scenario
from bench.report import Report, Table, Target, finish, load_note, parse_options
from bench.servers import queuelog_server
from bench.stats import Spread, percentile

TARGET_RATIO = 0.7
CLIENTS_EACH = 4  # enqueuers, and as many claim + complete workers: 8 clients in all
WINDOW_SECONDS_FULL, WINDOW_SECONDS_SMOKE = 30.0, 1.0
HOUR_US = 3_600_000_000
AGE_US = 48 * HOUR_US  # the million's last update: two days ago
EXPIRED_SECONDS = 60  # the shortest window a type may set
POLL_SECONDS = 2.0
KEYS = {"producer-0": "producer", "producer-1": "producer", "worker-0": "worker",
        "worker-1": "worker"}
CLAIM_TYPE = "report"


@dataclass(frozen=True)
class Sizes:
    jobs: int  # finished jobs in the store
    prefill: int  # pending report jobs for the claims
    window: float  # seconds of load per run
    removal_cap: float  # seconds a "during" server may take to remove the million


FULL = Sizes(jobs=1_000_000, prefill=40_000, window=WINDOW_SECONDS_FULL, removal_cap=900.0)
SMOKE = Sizes(jobs=1_000, prefill=2_000, window=WINDOW_SECONDS_SMOKE, removal_cap=60.0)


# -- the store ----------------------------------------------------------------------------------

# The statements are the same on both engines ('text' || integer concatenates on both).
INSERT_JOBS = (
    "INSERT INTO jobs (type, payload, priority, status, retry_count, max_retries, producer,"
    " run_at, claimed_at, worker_id, lease_token, result, created_at, updated_at)"
    " WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < :count)"
    " SELECT {type_case},"
    " '{\"to\":\"user-' || n || '@example.com\",\"template\":\"welcome-v2\","
    "\"locale\":\"en-GB\"}',"
    " 10, :status, 0, 3, 'producer-0', :base + n * 1000, :base + n * 1000 + 100000,"
    " 'worker-0', '0123456789abcdef0123456789abcdef.' || n, :result, :base + n * 1000,"
    " :base + n * 1000 + 200000 FROM s")
INSERT_ATTEMPTS = (
    "INSERT INTO job_attempts (job_id, number, worker_id, claimed_at, ended_at, outcome)"
    " SELECT id, 1, worker_id, claimed_at, updated_at, 'completed' FROM jobs"
    " WHERE id > :after ORDER BY id")
# Each job's three events, written chunk by chunk as a running queue interleaves them: a
# job's events lie within a few thousand rows of each other, not side by side.
INSERT_EVENTS = (
    "INSERT INTO job_events (job_id, at, event, actor, detail)"
    " SELECT j.id, CASE k.k WHEN 0 THEN j.created_at WHEN 1 THEN j.claimed_at"
    " ELSE j.updated_at END,"
    " CASE k.k WHEN 0 THEN 'enqueued' WHEN 1 THEN 'claimed' ELSE 'completed' END,"
    " CASE k.k WHEN 0 THEN j.producer ELSE j.worker_id END,"
    " CASE k.k WHEN 1 THEN :claimed_detail ELSE NULL END"
    " FROM jobs j CROSS JOIN (SELECT 0 AS k UNION ALL SELECT 1 UNION ALL SELECT 2) k"
    " WHERE j.id > :after ORDER BY j.id / 1000, k.k, j.id")


def insert_finished(url: str, count: int, types: tuple[str, ...] = ("email", "report"),
                    ) -> int:
    """`count` completed jobs of `types` in turn, with their attempts and events, last
    updated AGE_US ago; returns the highest id among them."""
    from sqlalchemy import create_engine, event, text

    engine = create_engine(url)
    if url.startswith("sqlite"):
        @event.listens_for(engine, "connect")
        def bulk_load(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.execute("PRAGMA journal_mode=WAL")
            dbapi_conn.execute("PRAGMA synchronous=OFF")  # a bulk load

    base = time.time_ns() // 1000 - AGE_US - count * 1000
    began = time.monotonic()
    try:
        with engine.begin() as conn:
            after = conn.execute(text("SELECT coalesce(max(id), 0) FROM jobs")).scalar_one()
            type_case = "CASE n % {} {} END".format(len(types), " ".join(
                f"WHEN {i} THEN '{name}'" for i, name in enumerate(types)))
            conn.execute(text(INSERT_JOBS.replace("{type_case}", type_case)), {
                "count": count, "status": "completed", "base": base,
                "result": '{"message_id":"0123456789abcdef"}'})
            conn.execute(text(INSERT_ATTEMPTS), {"after": after})
            conn.execute(text(INSERT_EVENTS), {
                "after": after,
                "claimed_detail": '{"lease_expires_at":"2026-11-30T10:00:00.000000Z"}'})
            last = conn.execute(text("SELECT max(id) FROM jobs")).scalar_one()
        if url.startswith("sqlite"):
            with engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        else:
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.exec_driver_sql("VACUUM ANALYZE")
    finally:
        engine.dispose()
    print(f"built {count:,} completed jobs with attempts and events in "
          f"{time.monotonic() - began:.1f} s", file=sys.stderr, flush=True)
    return int(last)


def enqueue_pending(url: str, job_type: str, count: int) -> None:
    """`count` pending jobs of `job_type` through JobService.enqueue_many (setup)."""
    from app import create_app
    from app.core.callers import Role

    app = create_app({"DATABASE_URL": url, "JOB_TYPES": JOB_TYPES})
    services = app.extensions["queuelog"]
    try:
        producer = services.keys.caller_for_token(
            services.keys.create_key(f"filler-{uuid.uuid4().hex[:6]}", Role.PRODUCER))
        for start in range(0, count, 1000):
            services.jobs.enqueue_many(producer, [
                {**job_body(n), "type": job_type, "priority": None, "max_retries": 3}
                for n in range(start, min(count, start + 1000))])
    finally:
        services.db.engine.dispose()


def set_completed_retention(url: str, seconds: int | None) -> None:
    """Every type keeps its completed jobs `seconds` (None: for ever), as PATCH /types sets."""
    from app import create_app

    app = create_app({"DATABASE_URL": url, "JOB_TYPES": JOB_TYPES})
    services = app.extensions["queuelog"]
    try:
        for job_type in JOB_TYPES.split(","):
            services.types.update_type(job_type, {"retention": {"completed_seconds": seconds}})
    finally:
        services.db.engine.dispose()


class Store:
    """One engine's template database and the copies made of it."""

    def __init__(self, engine: str, directory: str, stack: contextlib.ExitStack) -> None:
        self.engine = engine
        self.directory = directory
        self.stack = stack
        self.server_url = os.environ.get(POSTGRES_VARIABLE, "")
        if engine == "PostgreSQL":
            self.url = stack.enter_context(_postgres_database(self.server_url, "tmpl"))
        else:
            self.url = migrated_database(directory, "template.sqlite3")
        self.last_old_id = 0
        self.tokens: dict[str, str] = {}

    def build(self, sizes: Sizes) -> None:
        self.tokens = create_keys(self.url, KEYS)
        self.last_old_id = insert_finished(self.url, sizes.jobs)
        enqueue_pending(self.url, CLAIM_TYPE, sizes.prefill)
        if self.engine == "SQLite":
            from sqlalchemy import create_engine

            engine = create_engine(self.url)
            with engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            engine.dispose()

    @contextlib.contextmanager
    def copy(self) -> Iterator[str]:
        """A copy of the template, dropped after."""
        if self.engine == "SQLite":
            path = Path(self.directory) / f"copy-{uuid.uuid4().hex[:8]}.sqlite3"
            shutil.copyfile(self.url.removeprefix("sqlite:///"), path)
            try:
                yield f"sqlite:///{path}"
            finally:
                for suffix in ("", "-wal", "-shm", "-writelock"):
                    Path(f"{path}{suffix}").unlink(missing_ok=True)
        else:
            with _postgres_database(self.server_url, "copy", template=self.url) as url, \
                    StandInAutovacuum(url):
                yield url


@contextlib.contextmanager
def _postgres_database(server_url: str, kind: str, template: str | None = None,
                       ) -> Iterator[str]:
    """A database of its own on the server, migrated (or copied from `template`, a database
    nobody is connected to), dropped after. Unlike bench/data.py's postgres_database it runs
    no stand-in autovacuum itself: a template must have no connection while it is copied."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from app.storage.migrations import upgrade

    name = f"queuelog_bench_ret_{kind}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        if template is None:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        else:
            source = make_url(template).database
            conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{source}" '
                              "STRATEGY FILE_COPY"))
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    try:
        if template is None:
            upgrade(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


# -- part 1: over HTTP, during the removal and without it ---------------------------------------

@scenario
def enqueue_single(client: Client, context: Mapping[str, Any]) -> int:
    client.call("POST", "/jobs", job_body(context["client_index"]), expect=(201,))
    return 1


@scenario
def claim_complete_report(client: Client, _context: Mapping[str, Any]) -> int:
    status, job = client.call("POST", "/jobs/claim", {"types": [CLAIM_TYPE]},
                              expect=(200, 204))
    if status == 204:
        return 0
    client.call("POST", f"/jobs/{job['id']}/complete",
                {"lease_token": job["lease_token"], "result": RESULT}, expect=(200,))
    return 1


LOADS = {"enqueue_single": "enqueue (POST /jobs)",
         "claim_complete_report": "claim + complete"}


def _load_process(name: str, port: int, tokens: list[str], seconds: float,
                  results: Any) -> None:
    try:
        result = run_load(name, port, tokens, clients=CLIENTS_EACH, operations=10**9,
                          max_seconds=seconds)
        results.put((name, result))
    except Exception as exc:  # handed to the parent, which fails the run
        results.put((name, f"{type(exc).__name__}: {exc}"))


def run_both(port: int, tokens: Mapping[str, str], seconds: float) -> dict[str, LoadResult]:
    """Enqueuers and claim + complete workers at once, for `seconds`: each load in a
    process of its own (which forks its client processes), so that the two run together."""
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    keys = {"enqueue_single": [tokens["producer-0"], tokens["producer-1"]],
            "claim_complete_report": [tokens["worker-0"], tokens["worker-1"]]}
    children = [context.Process(target=_load_process,
                                args=(name, port, keys[name], seconds, results))
                for name in LOADS]
    for child in children:
        child.start()
    found: dict[str, LoadResult] = {}
    try:
        for _ in children:
            name, result = results.get(timeout=seconds + 300)
            if isinstance(result, str):
                raise RuntimeError(f"{name}: {result}")
            found[name] = result
    finally:
        for child in children:
            child.join(timeout=30)
            if child.is_alive():
                child.kill()
    return found


class LeftCounter:
    """Counts, every POLL_SECONDS in a thread, the million's rows not yet removed."""

    def __init__(self, url: str, last_old_id: int) -> None:
        from sqlalchemy import create_engine

        self.engine = create_engine(url)
        self.last_old_id = last_old_id
        self.samples: list[tuple[float, int]] = []  # (monotonic time, rows left)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def count(self) -> int:
        from sqlalchemy import text

        with self.engine.connect() as conn:
            # Through ix_jobs_producer_id (producer, id), the narrowest index holding them:
            # a count of the table's own rows would read every page of a million rows.
            return int(conn.execute(text(
                "SELECT count(*) FROM jobs WHERE producer = 'producer-0' AND id <= :last"),
                {"last": self.last_old_id}).scalar_one())

    def _run(self) -> None:
        while True:
            self.samples.append((time.monotonic(), self.count()))
            if self.samples[-1][1] == 0 or self.stopped.wait(POLL_SECONDS):
                return

    def start(self) -> LeftCounter:
        self.thread.start()
        return self

    def left_at(self, moment: float) -> int:
        """Rows left at the last count at or before `moment`."""
        before = [left for at, left in self.samples if at <= moment]
        return before[-1] if before else self.samples[0][1]

    def done_at(self) -> float | None:
        return next((at for at, left in self.samples if left == 0), None)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()
        self.engine.dispose()


@dataclass
class HttpFigures:
    rate: dict[tuple[str, str], Spread] = field(default_factory=dict)  # (run, load)
    p99: dict[tuple[str, str], Spread] = field(default_factory=dict)
    ratio: dict[str, Spread] = field(default_factory=lambda: {n: Spread() for n in LOADS})
    removal_seconds: Spread = field(default_factory=Spread)
    removed_in_window: Spread = field(default_factory=Spread)  # jobs/s removed under load
    unfinished: list[str] = field(default_factory=list)

    def add(self, run: str, load: str, result: LoadResult) -> None:
        self.rate.setdefault((run, load), Spread()).add(result.jobs_per_second)
        self.p99.setdefault((run, load), Spread()).add(result.p99_ms)


RUNS = ("during removal", "baseline")


def measure_http(store: Store, sizes: Sizes, repeats: int) -> HttpFigures:
    figures = HttpFigures()
    for repeat in range(repeats):
        order = list(RUNS) if repeat % 2 == 0 else list(reversed(RUNS))
        rate: dict[str, dict[str, float]] = {}
        for run in order:
            removing = run == "during removal"
            with store.copy() as url:
                set_completed_retention(url, EXPIRED_SECONDS if removing else None)
                launched = time.monotonic()
                with queuelog_server(store.directory, url) as server:
                    counter = LeftCounter(url, store.last_old_id).start()
                    try:
                        began = time.monotonic()
                        found = run_both(server.port, store.tokens, sizes.window)
                        ended = time.monotonic()
                        if removing and repeat == 0:  # once: the whole removal
                            while counter.thread.is_alive() and \
                                    time.monotonic() - launched < sizes.removal_cap:
                                counter.thread.join(POLL_SECONDS)
                    finally:
                        counter.stop()
                left_before, left_after = counter.left_at(began), counter.left_at(ended)
            rate[run] = {name: result.jobs_per_second for name, result in found.items()}
            for name, result in found.items():
                figures.add(run, name, result)
            note = ""
            if removing:
                done = counter.done_at()
                figures.removed_in_window.add((left_before - left_after) / (ended - began))
                if done is None and repeat == 0:
                    figures.unfinished.append(
                        f"repeat {repeat + 1}: {counter.samples[-1][1]:,} of {sizes.jobs:,} "
                        f"left after {sizes.removal_cap:.0f} s")
                elif done is not None:
                    figures.removal_seconds.add(done - launched)
                    if done < ended:
                        figures.unfinished.append(
                            f"repeat {repeat + 1}: the removal ended {ended - done:.1f} s "
                            "before the load did (part of the window had nothing to remove)")
                note = (f"; {left_before - left_after:,} removed in the window"
                        + (f", all removed {done - launched:.0f} s after launch"
                           if done is not None else ""))
            print(f"{store.engine} repeat {repeat + 1}, {run}: " + ", ".join(
                f"{LOADS[n]} {r:,.0f}/s" for n, r in rate[run].items()) + note,
                file=sys.stderr, flush=True)
        for name in LOADS:
            figures.ratio[name].add(rate["during removal"][name] / rate["baseline"][name])
    return figures


# -- part 2: the write lock a batch holds -------------------------------------------------------

@dataclass
class LockFigures:
    median_ms: Spread = field(default_factory=Spread)
    p99_ms: Spread = field(default_factory=Spread)
    max_ms: Spread = field(default_factory=Spread)
    batches: Spread = field(default_factory=Spread)
    seconds: Spread = field(default_factory=Spread)  # removing the million alone


def measure_lock(store: Store) -> LockFigures:
    """One in-process removal of the whole store, every batch timed (thousands of them: the
    percentiles need no repeat)."""
    from app import create_app

    figures = LockFigures()
    held: list[float] = []
    with store.copy() as url:
        set_completed_retention(url, EXPIRED_SECONDS)
        app = create_app({"DATABASE_URL": url, "JOB_TYPES": JOB_TYPES})
        services = app.extensions["queuelog"]
        try:
            retention = services.jobs.retention
            uow = retention.uow
            write_alone = uow.write_alone

            def timed(work: Any) -> Any:
                began = time.perf_counter()
                try:
                    return write_alone(work)
                finally:
                    held.append(time.perf_counter() - began)

            uow.write_alone = timed  # this process's instance only
            removed, zeros = 0, 0
            began = time.perf_counter()
            # A pass visits 6 (type, status) scans; once calls in a row have removed nothing
            # more often than that, the pass is over and nothing is left.
            while zeros < 8:
                count = retention.remove_expired(services.types.retention_windows,
                                                 max_batches=1)
                removed += count
                zeros = zeros + 1 if count == 0 else 0
            seconds = time.perf_counter() - began
        finally:
            services.db.engine.dispose()
        counter = LeftCounter(url, store.last_old_id)
        remaining = counter.count()
        counter.engine.dispose()
    if remaining:
        raise RuntimeError(f"{store.engine}: {remaining:,} expired jobs left after the "
                           "in-process removal")
    figures.median_ms.add(statistics.median(held) * 1000)
    figures.p99_ms.add(percentile(held, 99) * 1000)
    figures.max_ms.add(max(held) * 1000)
    figures.batches.add(len(held))
    figures.seconds.add(seconds)
    print(f"{store.engine}: {removed:,} removed in-process in {seconds:.1f} s, "
          f"{len(held):,} write transactions, longest {max(held) * 1000:.1f} ms",
          file=sys.stderr, flush=True)
    return figures


# -- the report ---------------------------------------------------------------------------------

def measure(options: Any) -> Report:
    sizes = SMOKE if options.smoke else FULL
    engines = chosen_engines(options)
    report = Report("Retention: enqueues and claims while a million expired jobs are removed",
                    "python bench/retention.py", options.smoke, options.repeats)
    http: dict[str, HttpFigures] = {}
    lock: dict[str, LockFigures] = {}
    load = os.getloadavg()
    with scratch_directory("queuelog-bench-retention-") as directory:
        for engine in engines:
            with contextlib.ExitStack() as stack:
                store = Store(engine, directory, stack)
                store.build(sizes)
                lock[engine] = measure_lock(store)
                http[engine] = measure_http(store, sizes, options.repeats)
    table = Table(f"Over HTTP: {CLIENTS_EACH} clients enqueuing (POST /jobs) and "
                  f"{CLIENTS_EACH} claiming + completing at once, {sizes.window:.0f} s from "
                  f"the server's start, {sizes.jobs:,} completed jobs stored (median "
                  "[min-max] over repeats)",
                  ["database", "load", "during removal /s", "baseline /s",
                   "during / baseline", "during p99 ms", "baseline p99 ms"])
    for engine, figures in http.items():
        for name, label in LOADS.items():
            table.add(engine, label, figures.rate[(RUNS[0], name)].show(),
                      figures.rate[(RUNS[1], name)].show(), figures.ratio[name].show(2),
                      figures.p99[(RUNS[0], name)].show(1),
                      figures.p99[(RUNS[1], name)].show(1))
    report.tables.append(table)
    removal = Table(f"The removal of the {sizes.jobs:,} expired jobs (served: the first "
                    "repeat's removal to its end, and the removal rate during each repeat's "
                    "load, median [min-max]; in-process: one removal)",
                    ["database", "served: seconds from launch until none left",
                     "served: removed/s under load", "in-process alone: seconds",
                     "in-process alone: removed/s"])
    for engine in engines:
        alone = lock[engine].seconds
        removal.add(engine, http[engine].removal_seconds.show(1),
                    http[engine].removed_in_window.show(),
                    alone.show(1), f"{sizes.jobs / alone.median:,.0f}")
    report.tables.append(removal)
    hold = Table("The write lock one retention batch holds (200 jobs with their attempts and "
                 "events; in-process, one thread, every batch of one removal of the whole "
                 "store timed; ms)",
                 ["database", "write transactions", "median", "p99", "max"])
    for engine, held in lock.items():
        hold.add(engine, held.batches.show(), held.median_ms.show(2),
                 held.p99_ms.show(2), held.max_ms.show(2))
    report.tables.append(hold)
    for engine, figures in http.items():
        for name, label in LOADS.items():
            ratio = figures.ratio[name]
            report.targets.append(Target(
                f"{engine}: {label} rate during the removal / without it",
                f"≥ {TARGET_RATIO}", ratio.show(2), ratio.median >= TARGET_RATIO))
    report.notes += [
        load_note(load, "a shared 2-core machine: the server, its tickers, the clients and, "
                        "for PostgreSQL, the database share the 2 cores"),
        "Both runs use the same server settings (shipped gunicorn.conf.py: 2 workers, 16 "
        "threads, each worker's ticker on) and a copy of the same store; only the types' "
        "retention of completed jobs differs (60 s: all expired; for ever: none). The "
        "baseline's tickers still run their retention passes, which find nothing.",
        "Each served worker runs its own retention pass (batches of 200 jobs, each one "
        "write transaction, for at most 50 ms of each 0.5 s tick: RETENTION_SECONDS_PER_TICK"
        "); two workers take disjoint batches "
        "(a batch already deleted is not found again).",
        "The removal's duration counts from the server's launch (its workers' boot "
        "included) to the first count that found none of the million left, in the first "
        f"repeat only (a few minutes each); the load runs in its first {sizes.window:.0f} s "
        "only. Later repeats stop the server after the load window, the removal still "
        "under way. Removed/s under load is the count's fall during the load window.",
        "The write-lock figure times UnitOfWork.write_alone around each batch: on SQLite "
        "the app's exclusive writer (its -writelock file lock, which every other writer of "
        "every process waits for, then BEGIN IMMEDIATE to COMMIT at synchronous=FULL, and "
        "any WAL auto-checkpoint that COMMIT runs); on PostgreSQL the transaction holding "
        "the batch's row locks. The hold itself: nothing else wrote meanwhile.",
        *[f"Not as planned, {engine}: {line}" for engine, figures in http.items()
          for line in figures.unfinished],
    ]
    return report


def main(argv: list[str] | None = None) -> None:
    started = time.monotonic()

    options = parse_options((__doc__ or "").splitlines()[0], argv,
                            add_arguments=engines_option)
    finish(measure(options), options, started)


if __name__ == "__main__":
    main()
