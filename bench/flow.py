"""Flow control: what limits cost a claim, and GET /types beside a million stored jobs.

1. HTTP claim + complete, 8 clients, on one server and database: the jobs' types with limits
   configured but never reached (max_running, max_running_per_key and a rate far above what
   runs; every job has a concurrency key) against the same types without limits, taking
   turns within each repeat (the settings are changed through PATCH /types between runs).
2. GET /types p50 with a million jobs stored (mostly finished, 25k pending of which 5k
   scheduled, 5k running), after the first request of the process (which counts the
   finished jobs before answering; later requests take those counts from a cache at most
   QUEUELOG_TYPE_COUNTS_MAX_AGE_SECONDS old, refreshed in the background).

    PYTHONPATH=. python bench/flow.py [--smoke] [--repeats N]

With QUEUELOG_BENCH_POSTGRES_URL set to a PostgreSQL server URL, the claim rows are measured
on PostgreSQL as well.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/flow.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.core.callers import Role
from app.storage.schema import jobs

# The worker's cycle (POST /jobs/claim, then complete) as http_single.py measures it; the
# import registers the scenario under its name for the load generator.
from bench.data import (
    JOB_TYPES,
    POSTGRES_VARIABLE,
    create_keys,
    job_body,
    migrated_database,
    postgres_database,
    scratch_directory,
)
from bench.http_single import claim_complete_one
from bench.load import Client, run_load
from bench.report import Report, Table, Target, run_script
from bench.servers import queuelog_server
from bench.stats import Spread, ms, percentile

CLIENTS = 8
FULL_OPERATIONS, SMOKE_OPERATIONS = 3000, 100
MAX_SECONDS = 15.0
KEYS = 64
TARGET_RATIO = 0.8
SERVICE_CLAIMS, SERVICE_SMOKE_CLAIMS, TURN = 2000, 100, 10
LIMITS = {"max_running": 100_000, "max_running_per_key": 100_000,
          "rate_per_second": 100_000, "burst": 100_000}
NO_LIMITS = dict.fromkeys(LIMITS)
TYPES = JOB_TYPES.split(",")
# The million: (status, how many); pending ones are split between due and scheduled below.
STORE_FULL = [("completed", 940_000), ("failed", 20_000), ("cancelled", 10_000),
              ("pending", 25_000), ("running", 5_000)]
STORE_SMOKE = [("completed", 2_000), ("failed", 100), ("cancelled", 100), ("pending", 300),
               ("running", 20)]
TYPES_REQUESTS_FULL, TYPES_REQUESTS_SMOKE = 300, 20
TYPES_TARGET_MS = 50.0
COLUMNS = [column.name for column in jobs.c if column.name != "id"]


def fill_with_keys(port: int, token: str, count: int) -> None:
    client = Client(port, token)
    try:
        for start in range(0, count, 1000):
            client.call("POST", "/jobs/batch", {"jobs": [
                {**job_body(n), "type": TYPES[n % len(TYPES)],
                 "concurrency_key": f"customer-{n % KEYS}"}
                for n in range(start, min(count, start + 1000))]})
    finally:
        client.close()


def set_limits(port: int, token: str, settings: Mapping[str, Any]) -> None:
    client = Client(port, token)
    try:
        for job_type in TYPES:
            client.call("PATCH", f"/types/{job_type}", dict(settings), expect=(200,))
    finally:
        client.close()


def compare_claims(options: Any, report: Report, engine: str,
                   settings: Mapping[str, Mapping[str, Any]], target: str,
                   goal: float) -> None:
    """HTTP claim + complete, CLIENTS clients, on one server and database, once per label of
    `settings` (each with its PATCH /types body set on every type first), taking turns in
    each repeat; the target: the second label's rate / the first's, in the same run."""
    count = SMOKE_OPERATIONS if options.smoke else FULL_OPERATIONS
    labels = list(settings)
    rates: dict[str, Spread] = {label: Spread() for label in labels}
    p50: dict[str, Spread] = {label: Spread() for label in labels}
    ratio = Spread()
    with scratch_directory("queuelog-bench-claims-") as directory, \
            contextlib.ExitStack() as stack:
        if engine == "PostgreSQL":
            url = stack.enter_context(postgres_database(os.environ[POSTGRES_VARIABLE]))
        else:
            url = migrated_database(directory)
        tokens = create_keys(url, {"producer-0": "producer", "worker-0": "worker",
                                          "worker-1": "worker", "admin-0": "admin"})
        workers = [tokens["worker-0"], tokens["worker-1"]]
        with queuelog_server(directory, url) as server:
            for repeat in range(options.repeats):
                order = list(labels)
                if repeat % 2:
                    order.reverse()
                run = {}
                for label in order:
                    set_limits(server.port, tokens["admin-0"], settings[label])
                    fill_with_keys(server.port, tokens["producer-0"], count)
                    result = run_load(claim_complete_one.__name__, server.port, workers,
                                             clients=CLIENTS, operations=count,
                                             max_seconds=MAX_SECONDS)
                    run[label] = result.jobs_per_second
                    rates[label].add(result.jobs_per_second)
                    p50[label].add(result.p50_ms)
                ratio.add(run[labels[1]] / run[labels[0]])
                print(f"{engine} repeat {repeat + 1}: " + ", ".join(
                    f"{label} {value:,.0f} jobs/s" for label, value in run.items()),
                    file=sys.stderr, flush=True)
    table = Table(f"HTTP claim + complete, {CLIENTS} clients, {engine} (median [min-max] "
                  "over repeats)", ["types", "jobs/s", "p50 ms per claim + complete"])
    for label in labels:
        table.add(label, rates[label].show(), p50[label].show(2))
    report.tables.append(table)
    report.targets.append(Target(target, f"≥ {goal}", ratio.show(2), ratio.median >= goal))


def measure_claims(options: Any, report: Report, engine: str) -> None:
    compare_claims(options, report, engine,
                   {"without limits": NO_LIMITS, "limits configured, not reached": LIMITS},
                   f"claim rate, limits configured but not reached / without limits (same "
                   f"run), {engine}", TARGET_RATIO)


def measure_service_claims(options: Any, report: Report, engine: str) -> None:
    """The claim alone (JobService.claim: its transaction, flow control included), in this
    process, against two databases alike but for the limits, taking turns every TURN
    claims so that the machine's changing load falls on both."""
    from app import create_app

    count = SERVICE_SMOKE_CLAIMS if options.smoke else SERVICE_CLAIMS
    seconds: dict[str, list[float]] = {"without limits": [], "limits configured, not reached":
                                       []}
    with scratch_directory("queuelog-bench-flow-svc-") as directory, \
            contextlib.ExitStack() as stack:
        services = {}
        for label in seconds:
            if engine == "PostgreSQL":
                url = stack.enter_context(postgres_database(os.environ[POSTGRES_VARIABLE]))
            else:
                url = migrated_database(directory, f"{label[:7]}.sqlite3")
            app = create_app({"DATABASE_URL": url, "JOB_TYPES": JOB_TYPES})
            found = app.extensions["queuelog"]
            stack.callback(found.db.engine.dispose)
            producer = found.keys.caller_for_token(found.keys.create_key("p", Role.PRODUCER))
            worker = found.keys.caller_for_token(found.keys.create_key("w", Role.WORKER))
            found.jobs.enqueue_many(producer, [
                {**job_body(n), "type": TYPES[n % len(TYPES)], "priority": None,
                 "max_retries": 3, "concurrency_key": f"customer-{n % KEYS}"}
                for n in range(count)])
            for job_type in TYPES:
                found.types.update_type(job_type, LIMITS if label.startswith("limits")
                                        else NO_LIMITS)
            services[label] = (found.jobs, worker)
        for turn in range(0, count, TURN):
            labels = list(seconds) if (turn // TURN) % 2 == 0 else list(reversed(seconds))
            for label in labels:
                jobs_service, worker = services[label]
                for _ in range(TURN):
                    began = time.perf_counter()
                    claimed = jobs_service.claim(worker)
                    seconds[label].append(time.perf_counter() - began)
                    # Completed at once (not timed): as many run as workers hold, not more.
                    jobs_service.complete(worker, claimed[0].job.id, lease_token=None,
                                          result=None)
    rate = {label: len(values) / sum(values) for label, values in seconds.items()}
    table = Table(f"The claim transaction alone (JobService.claim), {engine}, one thread, "
                  f"{count:,} claims each, taking turns every {TURN}",
                  ["types", "claims/s", "p50 µs", "p99 µs"])
    for label, values in seconds.items():
        table.add(label, f"{rate[label]:,.0f}",
                  f"{percentile(values, 50) * 1e6:,.0f}",
                  f"{percentile(values, 99) * 1e6:,.0f}")
    report.tables.append(table)
    ratio = rate["limits configured, not reached"] / rate["without limits"]
    report.targets.append(Target(
        f"claim rate, limits configured but not reached / without limits, {engine}, "
        "claim transaction", f"≥ {TARGET_RATIO}", f"{ratio:.2f}", ratio >= TARGET_RATIO))


def build_million(directory: str, store: list[tuple[str, int]]) -> str:
    """A migrated database holding `store`, inserted directly (setup, not timed)."""
    url = migrated_database(directory, "million.sqlite3")
    conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")  # a bulk load
    placeholders = ", ".join("?" for _ in COLUMNS)
    insert = f"INSERT INTO jobs ({', '.join(COLUMNS)}) VALUES ({placeholders})"  # noqa: S608
    now = time.time_ns() // 1000
    rng = random.Random(7)
    began = time.monotonic()
    conn.execute("BEGIN")
    n = 0
    for status, count in store:
        rows = []
        for i in range(count):
            n += 1
            at = now - 86_400_000_000 + n
            # A fifth of the pending jobs are scheduled an hour ahead.
            run_at = at + 3_600_000_000 * 25 if status == "pending" and i % 5 == 0 else at
            running = status == "running"
            rows.append((TYPES[n % len(TYPES)], '{"to":"user@example.com"}',
                         rng.choice((0, 10, 20)), status, 0, 3, "producer-0", None, None,
                         run_at, at + 1000 if status != "pending" else None,
                         "worker-0" if status != "pending" else None,
                         now + 3_600_000_000 if running else None,
                         f"t.{n}" if running else None, None, None, at, at + 2000,
                         f"customer-{n % KEYS}",
                         # Columns appended since (unique jobs' and any later ones) are NULL.
                         *[None] * (len(COLUMNS) - 19)))
        conn.executemany(insert, rows)
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    print(f"built {n:,} jobs in {time.monotonic() - began:.1f} s", file=sys.stderr, flush=True)
    return url


def measure_types(options: Any, report: Report) -> None:
    store = STORE_SMOKE if options.smoke else STORE_FULL
    requests = TYPES_REQUESTS_SMOKE if options.smoke else TYPES_REQUESTS_FULL
    total = sum(count for _status, count in store)
    p50, p99, first = Spread(), Spread(), Spread()
    with scratch_directory("queuelog-bench-types-") as directory:
        url = build_million(directory, store)
        tokens = create_keys(url, {"admin-0": "admin"})
        for _repeat in range(options.repeats):
            # A fresh server each repeat, so that its first request counts from nothing.
            with queuelog_server(directory, url) as server:
                client = Client(server.port, tokens["admin-0"])
                began = time.perf_counter()
                client.call("GET", "/types")
                first.add(ms(time.perf_counter() - began))
                latencies = []
                for _ in range(requests):
                    began = time.perf_counter()
                    _, body = client.call("GET", "/types")
                    latencies.append(time.perf_counter() - began)
                client.close()
                assert sum(sum(t["counts"].values()) - t["counts"]["scheduled"]
                           for t in body["types"]) == total, body
            p50.add(ms(percentile(latencies, 50)))
            p99.add(ms(percentile(latencies, 99)))
    label = f"{total:,} jobs stored"
    table = Table(f"GET /types, one admin client, SQLite, {requests} requests per repeat (ms; "
                  "median [min-max] over repeats)",
                  ["store", "first request of a process", "p50", "p99"])
    table.add(label, first.show(1), p50.show(2), p99.show(2))
    report.tables.append(table)
    report.targets.append(Target(f"GET /types p50, {label}", f"≤ {TYPES_TARGET_MS:.0f} ms",
                                 p50.show(2, " ms"), p50.median <= TYPES_TARGET_MS))


def measure(options: Any) -> Report:
    report = Report("Flow control: limited claims and GET /types", "python bench/flow.py",
                    options.smoke, options.repeats)
    engines = ["SQLite"] + (["PostgreSQL"] if os.environ.get(POSTGRES_VARIABLE) else [])
    for engine in engines:
        measure_service_claims(options, report, engine)
    for engine in engines:
        measure_claims(options, report, engine)
    measure_types(options, report)
    report.notes += [
        "Claims: one gunicorn server with the shipped gunicorn.conf.py over a fresh SQLite "
        "file; the two kinds of run alternate which goes first. 'Limits configured' sets "
        "max_running, max_running_per_key, rate_per_second and burst (all 100,000) on every "
        "type. On SQLite each claim then reads the limited types' settings, counts the "
        "running jobs by (type, key) through their partial index, claims with the plain "
        "claim statement (no key is full and a single claim cannot exceed any room), and "
        "spends tokens, all in the claim's transaction. On PostgreSQL it reads the settings "
        "(and counts only when its process's last check found a cap more than half used), "
        "claims with the same statement, then locks its job's type row, counts again and "
        "spends the tokens in one statement, and commits.",
        "GET /types: pending, scheduled and running counts and the oldest claimable age are "
        "read from partial indexes of the pending and running rows on every request; "
        "completed, failed and cancelled come from a per-process cache (default at most 10 s "
        "old) over a partial index of the finished rows, refreshed in the background. The "
        "first request of a process waits for that count.",
    ]
    return report


def main(argv: list[str] | None = None) -> None:
    run_script(measure, __doc__, argv)


if __name__ == "__main__":
    main()
