"""Bloat: the claim rate on a table a million jobs have cycled through, beside a fresh one.

Two databases alike but for their past, both migrated to head (on PostgreSQL with the
storage parameters of migration 0011): one fresh; through the other a million jobs are
cycled first (enqueued, claimed, completed, then every one of them purged with the
service's purge, as `queuelog purge` does). SQLite cycles through the service's batch paths
(1,000 enqueued a call, 100 claimed and completed together); PostgreSQL writes the same row
versions 10,000 jobs a statement (Side.cycle_in_sql says why), then purges through the
service. Then, each repeat: the same number of jobs is enqueued in each, both are left
until analyzed (as autovacuum leaves them within a minute), and one thread claims and
completes them one at a time through JobService, the two databases taking turns every TURN
jobs, so that the shared machine's changing load falls on both alike. The target is the
median over the repeats of the cycled table's rate over the fresh one's.

    PYTHONPATH=. python bench/bloat.py [--smoke] [--cycle N] [--storage shipped|default]
                                       [--engines sqlite,postgresql] [--claims N]

SQLite is always measured (its B-trees reuse freed pages, with no vacuum); with
QUEUELOG_BENCH_POSTGRES_URL set to a PostgreSQL server URL, PostgreSQL is measured as well.
`--storage default` resets the cycled PostgreSQL database's tables to PostgreSQL's defaults
first: the comparison that shows what 0011's parameters are worth.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/bloat.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.data import (
    CHURNED_TABLES,
    JOB_TYPES,
    POSTGRES_VARIABLE,
    RESULT,
    STAND_INS,
    job_body,
    migrated_database,
    postgres_database,
    scratch_directory,
)
from bench.report import Report, Table, Target, finish, parse_options
from bench.stats import Spread, percentile

FULL_CYCLE, SMOKE_CYCLE = 1_000_000, 500
FULL_CLAIMS, SMOKE_CLAIMS = 3_000, 60
TURN = 20
ENQUEUE_BATCH, CLAIM_BATCH = 1000, 100
CHUNK = 10_000  # jobs per statement of the SQL cycle
# PostgreSQL's goal is the higher: autovacuum and the fillfactor should
# leave a cycled table as fast to claim from as a fresh one.
TARGET_RATIO = {"SQLite": 0.8, "PostgreSQL": 0.95}
FULL_VACUUM_WAIT, SMOKE_VACUUM_WAIT = 900.0, 3.0  # seconds at most


def body(n: int) -> dict[str, Any]:
    return {**job_body(n), "priority": None, "max_retries": 3}


class Side:
    """One database and the services of an app over it."""

    def __init__(self, url: str) -> None:
        from app import create_app
        from app.core.callers import Role

        self.url = url
        app = create_app({"DATABASE_URL": url, "JOB_TYPES": JOB_TYPES})
        found = app.extensions["queuelog"]
        self.services = found
        self.jobs = found.jobs
        self.producer = found.keys.caller_for_token(found.keys.create_key("p", Role.PRODUCER))
        self.worker = found.keys.caller_for_token(found.keys.create_key("w", Role.WORKER))

    def close(self) -> None:
        self.services.db.engine.dispose()

    def enqueue(self, count: int, start: int = 0) -> None:
        for first in range(start, start + count, ENQUEUE_BATCH):
            self.jobs.enqueue_many(self.producer, [
                body(n) for n in range(first, min(start + count, first + ENQUEUE_BATCH))])

    def cycle(self, count: int) -> tuple[int, float, float]:
        """Enqueue, claim and complete `count` jobs through the batch paths, then purge them.
        Returns (jobs purged, seconds cycling, seconds purging)."""

        def one_batch(done: int, size: int) -> None:
            self.enqueue(size, done)
            left = size
            while left:
                claimed = self.jobs.claim(self.worker, limit=min(CLAIM_BATCH, left))
                self.jobs.complete_many(self.worker, [
                    {"id": c.job.id, "lease_token": c.lease_token, "result": RESULT}
                    for c in claimed])
                left -= len(claimed)

        return self._cycle_then_purge(count, ENQUEUE_BATCH, one_batch)

    def cycle_in_sql(self, count: int) -> tuple[int, float, float]:
        """PostgreSQL: the same row versions the batch paths write, CHUNK jobs a statement:
        each job inserted pending with its enqueued event, updated to running (the claim's
        columns) with its attempt opened and its claimed event, updated to completed with
        its attempt closed and its completed event; then the service's purge. The
        service's own cycle goes at a few hundred jobs a second on this shared machine;
        this one writes the million in minutes. Returns as cycle() does."""
        from sqlalchemy import text

        steps = [
            "INSERT INTO jobs (type, payload, priority, status, retry_count, max_retries,"
            " producer, run_at, created_at, updated_at)"
            " SELECT 'email', '{\"to\": \"user-' || n || '@example.com\", \"template\":"
            " \"welcome-v2\", \"locale\": \"en-GB\"}', 10, 'pending', 0, 3, 'p', :now,"
            " :now, :now FROM generate_series(1, :chunk) AS n",
            "INSERT INTO job_events (job_id, at, event, actor)"
            " SELECT id, :now, 'enqueued', 'p' FROM jobs WHERE status = 'pending'",
            "UPDATE jobs SET status = 'running', claimed_at = :now, worker_id = 'w',"
            " lease_expires_at = :now + 60000000, lease_token = md5(id::text) || '.' || id,"
            " updated_at = :now WHERE status = 'pending'",
            "INSERT INTO job_attempts (job_id, number, worker_id, claimed_at, outcome)"
            " SELECT id, 1, 'w', :now, 'running' FROM jobs WHERE status = 'running'",
            "INSERT INTO job_events (job_id, at, event, actor)"
            " SELECT id, :now, 'claimed', 'w' FROM jobs WHERE status = 'running'",
            "UPDATE job_attempts SET ended_at = :now, outcome = 'completed'"
            " WHERE outcome = 'running'",
            "INSERT INTO job_events (job_id, at, event, actor)"
            " SELECT id, :now, 'completed', 'w' FROM jobs WHERE status = 'running'",
            "UPDATE jobs SET status = 'completed', result = '{\"message_id\":"
            " \"0123456789abcdef\"}', lease_expires_at = NULL, updated_at = :now"
            " WHERE status = 'running'",
        ]
        engine = self.services.db.engine

        def one_chunk(_done: int, size: int) -> None:
            now = time.time_ns() // 1000
            for step in steps:  # a transaction each, as the claims and completions are
                with engine.begin() as conn:
                    conn.execute(text(step), {"now": now, "chunk": size})

        return self._cycle_then_purge(count, CHUNK, one_chunk)

    def _cycle_then_purge(self, count: int, chunk: int,
                          one_chunk: Callable[[int, int], None]) -> tuple[int, float, float]:
        """`one_chunk(done, size)` until `count` jobs have cycled, then the service's purge
        of them all: (jobs purged, seconds cycling, seconds purging)."""
        began = time.monotonic()
        done = 0
        while done < count:
            size = min(chunk, count - done)
            one_chunk(done, size)
            done += size
            if done % 100_000 == 0:
                print(f"cycled {done:,} jobs in {time.monotonic() - began:.0f} s",
                      file=sys.stderr, flush=True)
        cycled = time.monotonic() - began
        began = time.monotonic()
        purged = self.jobs.purge(older_than_seconds=0)
        purging = time.monotonic() - began
        # A backend reports its dead rows to pg_stat_user_tables when idle a while or when it
        # closes: closed now, so that what autovacuum's rule reads next includes the purge.
        self.services.db.engine.dispose()
        return purged, cycled, purging

    def claim_complete(self) -> float:
        """One claim and its completion; returns its seconds."""
        began = time.perf_counter()
        claimed = self.jobs.claim(self.worker)
        self.jobs.complete(self.worker, claimed[0].job.id, lease_token=claimed[0].lease_token,
                           result=RESULT)
        return time.perf_counter() - began


def postgres_storage(url: str) -> dict[str, str]:
    """Per table: its size with indexes, its dead rows and vacuums so far, and its options."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT c.relname, pg_total_relation_size(c.oid), s.n_dead_tup,"
                " s.autovacuum_count + s.vacuum_count, c.reloptions"
                " FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid"
                " WHERE c.relname = ANY(:names)"), {"names": list(CHURNED_TABLES)}).all()
    finally:
        engine.dispose()
    return {name: f"{size / 2**20:,.1f} MiB, {dead:,} dead, {vacuums} vacuum(s)"
            for name, size, dead, vacuums, _options in sorted(rows)}


def reset_storage(url: str) -> None:
    """PostgreSQL's defaults on the churned tables (what 0011 changes, undone)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            for name in CHURNED_TABLES:
                conn.execute(text(f"ALTER TABLE {name} RESET (fillfactor, "
                                  "autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold, "
                                  "autovacuum_analyze_scale_factor, "
                                  "autovacuum_analyze_threshold)"))
    finally:
        engine.dispose()


@contextlib.contextmanager
def database(engine: str, directory: str, name: str) -> Iterator[str]:
    if engine == "PostgreSQL":
        with postgres_database(os.environ[POSTGRES_VARIABLE]) as url:
            yield url
    else:
        yield migrated_database(directory, f"{name}.sqlite3")


def measure_engine(options: Any, report: Report, engine: str) -> None:
    cycle = options.cycle or (SMOKE_CYCLE if options.smoke else FULL_CYCLE)
    claims = options.claims or (SMOKE_CLAIMS if options.smoke else FULL_CLAIMS)
    storage = options.storage if engine == "PostgreSQL" else "shipped"
    seconds: dict[str, list[float]] = {"fresh": [], "cycled": []}
    with scratch_directory("queuelog-bench-bloat-") as directory, \
            database(engine, directory, "fresh") as fresh_url, \
            database(engine, directory, "cycled") as cycled_url, \
            contextlib.ExitStack() as stack:
        if storage == "default":
            reset_storage(cycled_url)
        sides = {"fresh": Side(fresh_url), "cycled": Side(cycled_url)}
        for side in sides.values():
            stack.callback(side.close)
        load = os.getloadavg()[0]
        cycled_side = sides["cycled"]
        stand_in = STAND_INS.get(cycled_url)
        purged, cycling, purging = (cycled_side.cycle_in_sql(cycle)
                                    if engine == "PostgreSQL" else cycled_side.cycle(cycle))
        print(f"{engine}: {purged:,} jobs cycled in {cycling:.0f} s, purged in {purging:.0f} s",
              file=sys.stderr, flush=True)
        after_purge = (postgres_storage(cycled_url) if engine == "PostgreSQL" else {})
        # What is measured is the table a purge leaves behind, once autovacuum has cleaned
        # up after the purge as it would within minutes, not the purge's vacuum in progress.
        wait_limit = SMOKE_VACUUM_WAIT if options.smoke else FULL_VACUUM_WAIT
        settled = None if stand_in is None else stand_in.wait_until_vacuumed(wait_limit)
        ratios, analyzed = Spread(), Spread()
        for repeat in range(options.repeats):
            for side in sides.values():
                side.enqueue(claims, start=repeat * claims)
                side.services.db.engine.dispose()  # its changes reach the statistics now
            # Both tables as autovacuum leaves them within a minute of that enqueue:
            # analyzed. Before it, the planner may count no pending job in either (the fresh
            # table was never analyzed, the cycled one last when the purge had emptied it),
            # and the comparison would measure which plan each statistic chose, not the
            # table's past (docs/SCALING.md, "Statistics and the claim's plan").
            if stand_in is not None:
                analyzed.add(sum(STAND_INS[url].wait_until_vacuumed(wait_limit, analyzed=True)
                                 for url in (fresh_url, cycled_url)))
            taken: dict[str, list[float]] = {label: [] for label in sides}
            for turn in range(0, claims, TURN):
                order = list(sides) if (turn // TURN) % 2 == 0 else list(reversed(sides))
                for label in order:
                    for _ in range(min(TURN, claims - turn)):
                        taken[label].append(sides[label].claim_complete())
            ratios.add(sum(taken["fresh"]) / sum(taken["cycled"]))  # a rate's ratio
            for label, values in taken.items():
                seconds[label] += values
        after_claims = (postgres_storage(cycled_url) if engine == "PostgreSQL" else {})
        load = max(load, os.getloadavg()[0])
        vacuumed = ("" if stand_in is None else
                    f"server autovacuum off: the bench's stand-in ran {stand_in.vacuums} "
                    f"VACUUM(s), {stand_in.analyzes} ANALYZE(s)" if stand_in.active else
                    "the server's autovacuum")

    rate = {label: len(values) / sum(values) for label, values in seconds.items()}
    table = Table(f"Claim + complete one job at a time (JobService, one thread), {engine}, "
                  f"{claims:,} each a repeat, taking turns every {TURN}, "
                  f"{options.repeats} repeat(s) in all",
                  ["table", "jobs/s", "p50 ms", "p99 ms"])
    for label, values in seconds.items():
        name = ("fresh" if label == "fresh" else
                f"after {purged:,} jobs cycled and purged ({storage} storage parameters)")
        table.add(name, f"{rate[label]:,.0f}", f"{percentile(values, 50) * 1e3:.2f}",
                  f"{percentile(values, 99) * 1e3:.2f}")
    report.tables.append(table)
    cycle_table = Table(f"The cycle, {engine}", ["what", "figure"])
    cycle_table.add("jobs enqueued, claimed, completed (batch paths)",
                    f"{purged:,} in {cycling:.0f} s ({purged / cycling:,.0f} jobs/s)")
    cycle_table.add("purge of them all", f"{purging:.0f} s")
    cycle_table.add("load average (1 min), highest seen at start/end", f"{load:.2f}")
    if vacuumed:
        cycle_table.add("vacuum of the cycled database", vacuumed)
    if settled is not None:
        cycle_table.add("waited after the purge for its vacuum, before measuring",
                        f"{settled:.0f} s" + (" (gave up waiting)"
                                              if settled >= wait_limit else ""))
    if analyzed.values:
        cycle_table.add("waited after each repeat's enqueue, until autovacuum's rule had "
                        "nothing due on either database", analyzed.show(0, " s"))
    for name, figure in after_purge.items():
        cycle_table.add(f"{name} after the purge", figure)
    for name, figure in after_claims.items():
        cycle_table.add(f"{name} after the measured claims", figure)
    report.tables.append(cycle_table)
    report.targets.append(Target(
        f"claim rate after {purged:,} jobs cycled / fresh table, {engine}, {storage} storage",
        f"≥ {TARGET_RATIO[engine]}", ratios.show(2),
        ratios.median >= TARGET_RATIO[engine]))


def measure(options: Any) -> Report:
    report = Report("Bloat: claim rate after a million jobs cycled", "python bench/bloat.py",
                    options.smoke, options.repeats)
    engines = ["SQLite"] + (["PostgreSQL"] if os.environ.get(POSTGRES_VARIABLE) else [])
    if options.engines:
        engines = [e for e in engines if e.lower() in options.engines.lower().split(",")]
    for engine in engines:
        measure_engine(options, report, engine)
    report.notes += [
        "Each engine: two databases migrated to head, one cycled first; then both get the "
        "same jobs and one thread claims and completes them through JobService (each its "
        "own transaction, as a worker's requests would), alternating between the two; "
        "each repeat enqueues them anew and waits until both tables are analyzed. The "
        "ratio is each repeat's cycled rate over its fresh rate, median [min-max].",
        "PostgreSQL as shipped: jobs fillfactor 90, job_attempts fillfactor 80, autovacuum "
        "at 1,000 + 2 % of the table on jobs and job_attempts (5 % on job_events); the "
        "server's own autovacuum_naptime (1 min here). A server running with autovacuum = "
        "off (this test server does) gets a stand-in: every naptime the bench applies "
        "autovacuum's rule with each table's parameters and runs the VACUUM or ANALYZE it "
        "would (StandInAutovacuum), throttled as autovacuum is (its cost delay and "
        "limit). The claims are measured once no churned table of the cycled database has "
        "more dead rows than autovacuum lets stand: the table a purge leaves, not the "
        "purge's vacuum at work.",
        "SQLite frees pages to its freelist and reuses them (no vacuum); its row is the "
        "control.",
    ]
    return report


def main(argv: list[str] | None = None) -> None:
    def own(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--cycle", type=int, default=None,
                            help=f"jobs to cycle (default {FULL_CYCLE:,}; {SMOKE_CYCLE:,} "
                                 "with --smoke)")
        parser.add_argument("--claims", type=int, default=None,
                            help=f"claims measured on each table (default {FULL_CLAIMS:,})")
        parser.add_argument("--storage", choices=("shipped", "default"), default="shipped",
                            help="PostgreSQL storage parameters of the cycled database")
        parser.add_argument("--engines", default="",
                            help="comma-separated subset of sqlite,postgresql")

    options = parse_options((__doc__ or "").splitlines()[0], argv, add_arguments=own)
    started = time.monotonic()
    finish(measure(options), options, started)


if __name__ == "__main__":
    main()
