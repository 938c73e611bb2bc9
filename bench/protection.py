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
    job_body,
    migrated_database,
    postgres_database,
    scratch_directory,
)
from bench.flow import compare_claims
from bench.report import Report, Table, Target, load_note, run_script

TARGET_RATIO = 0.9
SERVICE_CYCLES, SERVICE_SMOKE_CYCLES, TURN = 4000, 200, 20
PROTECTED = {"circuit": {"failure_ratio": 0.5, "min_attempts": 20, "window_seconds": 60,
                         "cooldown_seconds": 30},
             "retry_budget": {"ratio": 0.2, "window_seconds": 60, "minimum": 10}}
UNPROTECTED = {"circuit": None, "retry_budget": None}
LABELS = {"without": "without a breaker or budget",
          "with": "circuit breaker (closed) and retry budget configured"}


def measure_claims(options: Any, report: Report, engine: str) -> None:
    compare_claims(options, report, engine,
                   {LABELS["without"]: UNPROTECTED, LABELS["with"]: PROTECTED},
                   f"claim rate, circuit breaker configured but closed (and a retry budget) / "
                   f"without (same run), {engine}", TARGET_RATIO)


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
