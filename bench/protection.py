"""A type that protects itself: what a circuit breaker and a retry budget, configured and
never acting (the circuit closed, no retry), cost a type's claims.

HTTP claim + complete, 8 clients, on one server and database: every type with a circuit
breaker and a retry budget configured against the same types without, taking turns within
each repeat (the settings are changed through PATCH /types between runs), on SQLite and, with
QUEUELOG_BENCH_POSTGRES_URL set, on PostgreSQL.

    PYTHONPATH=. python bench/protection.py [--smoke] [--repeats N]
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/protection.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.core.callers import Role
from bench.data import (
    POSTGRES_VARIABLE,
    create_keys,
    job_body,
    migrated_database,
    postgres_database,
    scratch_directory,
)
from bench.flow import (
    CLIENTS,
    FULL_OPERATIONS,
    MAX_SECONDS,
    SMOKE_OPERATIONS,
    fill_with_keys,
    set_limits,
)
from bench.http_single import claim_complete_one
from bench.load import run_load
from bench.report import Report, Table, Target, load_note, run_script
from bench.servers import queuelog_server
from bench.stats import Spread

TARGET_RATIO = 0.9
SERVICE_CYCLES, SERVICE_SMOKE_CYCLES, TURN = 4000, 200, 20
PROTECTED = {"circuit": {"failure_ratio": 0.5, "min_attempts": 20, "window_seconds": 60,
                         "cooldown_seconds": 30},
             "retry_budget": {"ratio": 0.2, "window_seconds": 60, "minimum": 10}}
UNPROTECTED = {"circuit": None, "retry_budget": None}
LABELS = {"without": "without a breaker or budget",
          "with": "circuit breaker (closed) and retry budget configured"}


def measure_claims(options: Any, report: Report, engine: str) -> None:
    count = SMOKE_OPERATIONS if options.smoke else FULL_OPERATIONS
    rates = {label: Spread() for label in LABELS.values()}
    p50 = {label: Spread() for label in LABELS.values()}
    ratio = Spread()
    with scratch_directory("queuelog-bench-protection-") as directory, \
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
                order = list(LABELS.values())
                if repeat % 2:
                    order.reverse()
                run = {}
                for label in order:
                    set_limits(server.port, tokens["admin-0"],
                               PROTECTED if label == LABELS["with"] else UNPROTECTED)
                    fill_with_keys(server.port, tokens["producer-0"], count)
                    result = run_load(claim_complete_one.__name__, server.port, workers,
                                      clients=CLIENTS, operations=count,
                                      max_seconds=MAX_SECONDS)
                    run[label] = result.jobs_per_second
                    rates[label].add(result.jobs_per_second)
                    p50[label].add(result.p50_ms)
                ratio.add(run[LABELS["with"]] / run[LABELS["without"]])
                print(f"{engine} repeat {repeat + 1}: " + ", ".join(
                    f"{label} {value:,.0f} jobs/s" for label, value in run.items()),
                    file=sys.stderr, flush=True)
    table = Table(f"HTTP claim + complete, {CLIENTS} clients, {engine} (median [min-max] "
                  "over repeats)", ["types", "jobs/s", "p50 ms per claim + complete"])
    for label in LABELS.values():
        table.add(label, rates[label].show(), p50[label].show(2))
    report.tables.append(table)
    report.targets.append(Target(
        f"claim rate, circuit breaker configured but closed (and a retry budget) / without "
        f"(same run), {engine}", f"≥ {TARGET_RATIO}", ratio.show(2),
        ratio.median >= TARGET_RATIO))


def measure_service(options: Any, report: Report, engine: str) -> None:
    """The claim and complete alone (JobService, their transactions, the process's tally
    thread running), in this process, against two databases alike but for the settings,
    taking turns every TURN cycles so that the machine's changing load falls on both."""
    from app import create_app

    cycles = SERVICE_SMOKE_CYCLES if options.smoke else SERVICE_CYCLES
    seconds = {label: 0.0 for label in LABELS.values()}
    with scratch_directory("queuelog-bench-protection-svc-") as directory, \
            contextlib.ExitStack() as stack:
        services = {}
        for name, label in LABELS.items():
            if engine == "PostgreSQL":
                url = stack.enter_context(postgres_database(os.environ[POSTGRES_VARIABLE]))
            else:
                url = migrated_database(directory, f"{name}.sqlite3")
            app = create_app({"DATABASE_URL": url, "JOB_TYPES": "email"})
            found = app.extensions["queuelog"]
            for thread in (found.type_settings, found.protection, found.stats_flusher):
                thread.start()
                stack.callback(thread.stop)
            stack.callback(found.db.engine.dispose)
            producer = found.keys.caller_for_token(found.keys.create_key("p", Role.PRODUCER))
            worker = found.keys.caller_for_token(found.keys.create_key("w", Role.WORKER))
            found.jobs.enqueue_many(producer, [
                {**job_body(n), "type": "email", "priority": None, "max_retries": 3}
                for n in range(cycles)])
            found.types.update_type("email", PROTECTED if name == "with" else UNPROTECTED)
            services[label] = (found.jobs, worker)
        for turn in range(0, cycles, TURN):
            labels = list(seconds) if (turn // TURN) % 2 == 0 else list(reversed(seconds))
            for label in labels:
                jobs_service, worker = services[label]
                began = time.perf_counter()
                for _ in range(TURN):
                    claimed = jobs_service.claim(worker)
                    jobs_service.complete(worker, claimed[0].job.id, lease_token=None,
                                          result=None)
                seconds[label] += time.perf_counter() - began
    rate = {label: cycles / spent for label, spent in seconds.items()}
    table = Table(f"Claim + complete in this process (JobService, the tally thread running), "
                  f"{engine}, one thread, {cycles:,} each, taking turns every {TURN}",
                  ["types", "cycles/s"])
    for label, value in rate.items():
        table.add(label, f"{value:,.0f}")
    report.tables.append(table)
    ratio = rate[LABELS["with"]] / rate[LABELS["without"]]
    report.targets.append(Target(
        f"claim + complete, circuit breaker configured but closed (and a retry budget) / "
        f"without, {engine}, in process", f"≥ {TARGET_RATIO}", f"{ratio:.2f}",
        ratio >= TARGET_RATIO))


def measure(options: Any) -> Report:
    report = Report("A type that protects itself: a closed circuit's and a retry budget's cost",
                    "python bench/protection.py", options.smoke, options.repeats)
    report.notes.append(load_note(os.getloadavg()))
    engines = ["SQLite"] + (["PostgreSQL"] if os.environ.get(POSTGRES_VARIABLE) else [])
    for engine in engines:
        measure_service(options, report, engine)
    for engine in engines:
        measure_claims(options, report, engine)
    report.notes.append(
        "One gunicorn server with the shipped gunicorn.conf.py; the two kinds of run "
        "alternate which goes first. 'Configured' sets a circuit breaker (ratio 0.5, 20 "
        "attempts, 60 s window, 30 s cooldown) and a retry budget (0.2, 60 s, 10) on every "
        "type; nothing fails, so the circuit stays closed and no retry is budgeted. Its "
        "claims are the plain claim (the closed circuit puts no type under flow control); "
        "each process counts the attempts that end in memory and writes them to type_tallies "
        "about once a second, beside the requests.")
    return report


def main(argv: list[str] | None = None) -> None:
    run_script(measure, __doc__, argv)


if __name__ == "__main__":
    main()
