"""Stats over time (docs/API.md, GET /stats): what counting costs the job transactions, and what
the dashboard's charts cost to read.

1. Over HTTP, against real gunicorn (the shipped gunicorn.conf.py), CLIENTS client threads:
   single-job enqueue (POST /jobs) and the worker's claim + complete (POST /jobs/claim, then
   POST /jobs/{id}/complete) on a server counting the stats (QUEUELOG_STATS=1, the default:
   each process adds its committed transactions' counts once a second,
   app/jobs/timeline/stats_buffer.py)
   beside the same server with them off (QUEUELOG_STATS=0). Each on a fresh database of its
   own; the counting one already holds HISTORY_DAYS days of minutes for HISTORY_TYPES types,
   as a server that has run for a while does. Each repeat runs on and off in turns, the order
   alternating. Jobs per second of each, and their ratio. Target: on / off >= 0.9.
2. GET /stats (admin, one keep-alive client) on the counting server's database: the last day
   by hour and the last hour by minute, of every type summed and of one type; what the
   dashboard's charts read. p50 and p95; no target (a figure for information).

    PYTHONPATH=. python bench/over_time.py [--smoke] [--repeats N] [--engines sqlite,postgresql]

With QUEUELOG_BENCH_POSTGRES_URL set to a PostgreSQL server URL, it is measured on PostgreSQL
as well, in databases of its own.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/over_time.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.data import (
    JOB_TYPES,
    chosen_engines,
    create_keys,
    engine_database,
    engines_option,
    fill_queue,
    scratch_directory,
)
from bench.http_single import KEYS as HTTP_KEYS
from bench.http_single import claim_complete_one, enqueue_one  # noqa: F401 (the scenarios)
from bench.load import Client, run_load
from bench.report import Report, Table, Target, finish, load_note, parse_options
from bench.servers import queuelog_server
from bench.stats import Spread, ms, percentile

CLIENTS = 8
LOADS = {"enqueue_one": "enqueue (POST /jobs)", "claim_complete_one": "claim + complete"}
SERVERS = {"stats on": "1", "stats off": "0"}
TARGET_RATIO = 0.9
MAX_SECONDS = 15.0
WARM_UP = 200  # jobs enqueued, claimed and completed on each server before any is measured
KEYS = {**HTTP_KEYS, "admin-0": "admin"}
# The history the counting server's database holds: every minute of HISTORY_DAYS days, for
# HISTORY_TYPES types (the bench's own among them). On PostgreSQL each transaction adds to
# its connection's slot, so a busy minute holds a row per slot that wrote in it.
HISTORY_DAYS = 14
HISTORY_TYPES = (*JOB_TYPES.split(","), "billing", "thumbnail", "webhook", "export",
                 "invoice", "sms", "push", "cleanup")
HISTORY_SLOTS = {"SQLite": 1, "PostgreSQL": 4}
MINUTE_US = 60_000_000
HOUR_US = 60 * MINUTE_US


@dataclass(frozen=True)
class Sizes:
    operations: int  # jobs per HTTP load run (bounded again by MAX_SECONDS)
    history_days: int
    requests: int  # per GET /stats query and repeat


FULL = Sizes(operations=2000, history_days=HISTORY_DAYS, requests=50)
SMOKE = Sizes(operations=80, history_days=1, requests=3)


# Each history table's SQLite insert and PostgreSQL COPY, the columns as history_rows() has
# them.
LOADS_OF_HISTORY = (
    ("INSERT INTO job_stats (type, minute, slot, enqueued, claimed, completed, failed)"
     " VALUES (?, ?, ?, ?, ?, ?, ?)",
     "COPY job_stats (type, minute, slot, enqueued, claimed, completed, failed) FROM STDIN"),
    ("INSERT INTO job_depth (type, minute, pending) VALUES (?, ?, ?)",
     "COPY job_depth (type, minute, pending) FROM STDIN"),
)


def history_rows(days: int, slots: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The job_stats rows and the job_depth rows (LOADS_OF_HISTORY's columns) of every minute
    of the last `days` days up to now, for each of HISTORY_TYPES: made-up but varied counts."""
    now = time.time_ns() // 1000
    last = now - now % MINUTE_US
    counts: list[tuple[Any, ...]] = []
    depth: list[tuple[Any, ...]] = []
    for m, minute in enumerate(range(last - days * 24 * 60 * MINUTE_US, last + MINUTE_US,
                                     MINUTE_US)):
        for t, job_type in enumerate(HISTORY_TYPES):
            base = 5 + (m * 7 + t * 13) % 60
            depth.append((job_type, minute, (m * 3 + t * 11) % 500))
            counts += [(job_type, minute, slot, base + slot, base, base - 1, (m + t + slot) % 3)
                       for slot in range(slots)]
    return counts, depth


def insert_history(url: str, days: int, slots: int) -> int:
    """history_rows() inserted directly (setup, not timed): COPY on PostgreSQL, executemany
    on SQLite; returns the job_stats rows written."""
    from sqlalchemy import create_engine, event

    engine = create_engine(url)
    sqlite = url.startswith("sqlite")
    if sqlite:
        @event.listens_for(engine, "connect")
        def bulk_load(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.execute("PRAGMA journal_mode=WAL")
            dbapi_conn.execute("PRAGMA synchronous=OFF")  # a bulk load

    began = time.monotonic()
    counts, depth = history_rows(days, slots)
    try:
        with engine.begin() as conn:
            for (insert, copy_in), rows in zip(LOADS_OF_HISTORY, (counts, depth),
                                               strict=True):
                if sqlite:
                    conn.exec_driver_sql(insert, rows)
                else:
                    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
                    with cursor.copy(copy_in) as copy:
                        for row in rows:
                            copy.write_row(row)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            if sqlite:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            else:
                conn.exec_driver_sql("VACUUM ANALYZE job_stats")
                conn.exec_driver_sql("VACUUM ANALYZE job_depth")
    finally:
        engine.dispose()
    print(f"history: {len(counts):,} job_stats rows ({days} days x {len(HISTORY_TYPES)} types "
          f"x {slots} slot(s)) in {time.monotonic() - began:.1f} s", file=sys.stderr,
          flush=True)
    return len(counts)


def stats_queries() -> list[tuple[str, str]]:
    """(label, path) of each GET /stats timed: what the dashboard's charts ask."""
    from app.core.clock import to_rfc3339

    now = time.time_ns() // 1000
    day = urllib.parse.urlencode({"from": to_rfc3339(now - 24 * HOUR_US), "step": "hour"})
    return [
        ("last day by hour, every type", f"/stats?{day}"),
        ("last day by hour, ?type=email", f"/stats?{day}&type=email"),
        ("last hour by minute, every type", "/stats?step=minute"),
        ("last hour by minute, ?type=email", "/stats?step=minute&type=email"),
    ]


@dataclass
class Figures:
    jobs: dict[tuple[str, str], Spread] = field(default_factory=dict)  # (load, server)
    p50: dict[tuple[str, str], Spread] = field(default_factory=dict)
    ratio: dict[str, Spread] = field(default_factory=dict)  # load: on / off
    reads_p50: dict[str, Spread] = field(default_factory=dict)  # query label
    reads_p95: dict[str, Spread] = field(default_factory=dict)
    history_rows: int = 0


def measure_engine(engine: str, directory: str, sizes: Sizes, repeats: int) -> Figures:
    figures = Figures()
    with contextlib.ExitStack() as stack:
        urls = {label: stack.enter_context(engine_database(
            engine, directory, f"{label.replace(' ', '-')}.sqlite3")) for label in SERVERS}
        figures.history_rows = insert_history(urls["stats on"], sizes.history_days,
                                              HISTORY_SLOTS[engine])
        tokens = {label: create_keys(url, KEYS) for label, url in urls.items()}
        servers = {label: stack.enter_context(queuelog_server(
            directory, urls[label], QUEUELOG_STATS=flag)) for label, flag in SERVERS.items()}

        def workers(label: str) -> list[str]:
            return [tokens[label]["worker-0"], tokens[label]["worker-1"]]

        def producers(label: str) -> list[str]:
            return [tokens[label]["producer-0"], tokens[label]["producer-1"]]

        for label, server in servers.items():  # warm: connections, statements, pages
            run_load("enqueue_one", server.port, producers(label), clients=CLIENTS,
                     operations=WARM_UP, max_seconds=MAX_SECONDS)
            run_load("claim_complete_one", server.port, workers(label), clients=CLIENTS,
                     operations=WARM_UP, max_seconds=MAX_SECONDS)
        for repeat in range(repeats):
            for load in LOADS:
                order = list(SERVERS)
                if repeat % 2:  # alternate which goes first: neither always follows the other
                    order.reverse()
                rate = {}
                for label in order:
                    port = servers[label].port
                    if load == "claim_complete_one":  # a queue to take from (not timed)
                        fill_queue(port, tokens[label]["producer-0"], sizes.operations)
                    result = run_load(load, port, workers(label) if load ==
                                      "claim_complete_one" else producers(label),
                                      clients=CLIENTS, operations=sizes.operations,
                                      max_seconds=MAX_SECONDS)
                    rate[label] = result.jobs_per_second
                    figures.jobs.setdefault((load, label), Spread()).add(
                        result.jobs_per_second)
                    figures.p50.setdefault((load, label), Spread()).add(result.p50_ms)
                figures.ratio.setdefault(load, Spread()).add(
                    rate["stats on"] / rate["stats off"])
                print(f"{engine} repeat {repeat + 1}: {LOADS[load]}: " + ", ".join(
                    f"{label} {rate[label]:,.0f} jobs/s" for label in SERVERS),
                    file=sys.stderr, flush=True)
        client = Client(servers["stats on"].port, tokens["stats on"]["admin-0"])
        try:
            timed = stats_queries()
            for _label, path in timed:  # each once, before the clock starts
                client.call("GET", path, expect=(200,))
            for _repeat in range(repeats):
                for label, path in timed:
                    seconds = []
                    for _ in range(sizes.requests):
                        began = time.perf_counter()
                        client.call("GET", path, expect=(200,))
                        seconds.append(time.perf_counter() - began)
                    figures.reads_p50.setdefault(label, Spread()).add(
                        ms(percentile(seconds, 50)))
                    figures.reads_p95.setdefault(label, Spread()).add(
                        ms(percentile(seconds, 95)))
        finally:
            client.close()
    return figures


def measure(options: Any) -> Report:
    sizes = SMOKE if options.smoke else FULL
    engines = chosen_engines(options)
    report = Report("Stats over time: what counting costs", "python bench/over_time.py",
                    options.smoke, options.repeats)
    load = os.getloadavg()
    with scratch_directory("queuelog-bench-over-time-") as directory:
        results = {engine: measure_engine(engine, directory, sizes, options.repeats)
                   for engine in engines}
    table = Table(f"Over HTTP, {CLIENTS} clients, {sizes.operations:,} jobs per run, stats on "
                  "and off in turns (median [min-max] over repeats)",
                  ["database", "operation", "stats on jobs/s", "stats off jobs/s",
                   "on / off", "target", "on p50 ms", "off p50 ms"])
    for engine, figures in results.items():
        for name, label in LOADS.items():
            table.add(engine, label, figures.jobs[(name, "stats on")].show(),
                      figures.jobs[(name, "stats off")].show(), figures.ratio[name].show(2),
                      f"≥ {TARGET_RATIO}", figures.p50[(name, "stats on")].show(1),
                      figures.p50[(name, "stats off")].show(1))
    report.tables.append(table)
    for engine, figures in results.items():
        reads = Table(f"{engine}: GET /stats, one admin client, {sizes.requests} requests per "
                      f"query and repeat; job_stats holds {figures.history_rows:,} rows "
                      f"({sizes.history_days} days of minutes, {len(HISTORY_TYPES)} types, "
                      f"{HISTORY_SLOTS[engine]} slot(s) a minute) (ms; median [min-max] over "
                      "repeats)", ["GET /stats", "p50", "p95"])
        for label in figures.reads_p50:
            reads.add(label, figures.reads_p50[label].show(2), figures.reads_p95[label].show(2))
        report.tables.append(reads)
    for engine, figures in results.items():
        for name, label in LOADS.items():
            ratio = figures.ratio[name]
            report.targets.append(Target(
                f"{engine}: {label}, stats on vs off, jobs/s over HTTP, {CLIENTS} clients",
                f"≥ {TARGET_RATIO}", ratio.show(2), ratio.median >= TARGET_RATIO))
    report.notes += [
        load_note(load),
        "Two servers from the same checkout, each with the shipped gunicorn.conf.py on a "
        "fresh database of its own, differing only in QUEUELOG_STATS; the clients are "
        "threads in forked processes on the same cores. The claim + complete queue is "
        "filled through /jobs/batch before each run (not timed).",
        "Counting adds no statement to a job transaction: each process keeps its committed "
        "transactions' counts in memory and adds them about once a second in one upsert of "
        "a row per type and minute (on PostgreSQL the process's slot's rows, so processes "
        "seldom wait on one row lock). The counting server's job_stats starts with the "
        "history above, as a server that has run for two weeks has; the other's is empty.",
        "GET /stats sums the slots per minute over the span (an index range of job_stats and "
        "of job_depth) and folds the minutes into buckets in Python.",
    ]
    return report


def main(argv: list[str] | None = None) -> None:
    started = time.monotonic()
    options = parse_options((__doc__ or "").splitlines()[0], argv, default_repeats=5,
                            add_arguments=engines_option)
    finish(measure(options), options, started)


if __name__ == "__main__":
    main()
