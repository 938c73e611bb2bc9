"""Reserved jobs (docs/JOBS.md): what a reservation costs a producer, and how fast the
check-back resolves reservations their producers left unanswered.

1. Over HTTP, against real gunicorn (the shipped gunicorn.conf.py), CLIENTS client threads:
   "reserve + confirm" (POST /jobs with `reserve`, then POST /jobs/{id}/confirm: two
   requests per job, what a producer enqueuing inside its own transaction makes) beside
   "plain enqueue" (one POST /jobs). Jobs per second of each, and their ratio.
   Target: reserve + confirm >= 0.5 x plain enqueue's jobs/s (two requests for one job).
2. The check-back, in this process: RESERVATIONS reservations with a check url pointing at a
   local receiver (a threaded http.server that verifies the signature and answers
   {"commit": true}), their deadline passed; then the dispatcher's own check loop
   (app/dispatch/check_rounds.py: Checker.run with its default settings, its threads, as
   `queuelog dispatch` runs it) asks each: the time until all are confirmed, and
   reservations resolved per second. Target: >= 200 checks a second.

    PYTHONPATH=. python bench/reserve.py [--smoke] [--repeats N]

With QUEUELOG_BENCH_POSTGRES_URL set to a PostgreSQL server URL, both parts are measured on
PostgreSQL as well, in databases of their own.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

if __package__ in (None, ""):  # run as `python bench/reserve.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.data import (
    JOB_TYPES,
    POSTGRES_VARIABLE,
    create_keys,
    engine_databases,
    job_body,
    migrated_database,
    postgres_database,
    scratch_directory,
)
from bench.load import Client, run_load, scenario
from bench.report import Report, Table, Target, run_script
from bench.servers import queuelog_server
from bench.stats import Spread

CLIENTS = 8
SCENARIO_NAMES = {"enqueue_plain": "plain enqueue", "reserve_confirm": "reserve + confirm"}
TARGET_RATIO = 0.5
TARGET_CHECKS_PER_SECOND = 200
MAX_SECONDS = 15.0
WARM_OPERATIONS = 4 * CLIENTS
# A deadline far enough ahead that no reservation of part 1 is ever checked or released.
CONFIRM_WITHIN_SECONDS = 3600


@dataclass(frozen=True)
class Sizes:
    operations: int  # jobs per HTTP load run (bounded again by MAX_SECONDS)
    reservations: int  # reservations the check-back resolves per repeat


WARM_RESERVATIONS = 20
FULL = Sizes(operations=2000, reservations=500)
SMOKE = Sizes(operations=80, reservations=40)


# -- part 1: over HTTP --------------------------------------------------------------------------

@scenario
def enqueue_plain(client: Client, context: Mapping[str, Any]) -> int:
    client.call("POST", "/jobs", job_body(context["client_index"]), expect=(201,))
    return 1


@scenario
def reserve_confirm(client: Client, context: Mapping[str, Any]) -> int:
    body = {**job_body(context["client_index"]),
            "reserve": {"confirm_within_seconds": CONFIRM_WITHIN_SECONDS}}
    _status, job = client.call("POST", "/jobs", body, expect=(201,))
    # ... the producer's own commit happens here ...
    client.call("POST", f"/jobs/{job['id']}/confirm", None, expect=(200,))
    return 1


KEYS = {"producer-0": "producer", "producer-1": "producer"}


@dataclass
class HttpFigures:
    jobs: dict[str, Spread]
    p50: dict[str, Spread]
    ratio: Spread


def measure_http(sizes: Sizes, repeats: int, directory: str,
                 stack: contextlib.ExitStack) -> dict[str, HttpFigures]:
    urls = engine_databases(directory, stack, "reserve-http.sqlite3")
    figures = {}
    for engine, url in urls.items():
        tokens = create_keys(url, KEYS)
        server = stack.enter_context(queuelog_server(directory, url))
        found = HttpFigures({n: Spread() for n in SCENARIO_NAMES},
                            {n: Spread() for n in SCENARIO_NAMES}, Spread())
        for name in SCENARIO_NAMES:  # warm: connections, statements, pages (not measured)
            run_load(name, server.port, list(tokens.values()), clients=CLIENTS,
                     operations=WARM_OPERATIONS, max_seconds=MAX_SECONDS)
        for repeat in range(repeats):
            order = list(SCENARIO_NAMES)
            if repeat % 2:  # alternate which goes first: neither always follows the other
                order.reverse()
            rate = {}
            for name in order:
                result = run_load(name, server.port, list(tokens.values()), clients=CLIENTS,
                                  operations=sizes.operations, max_seconds=MAX_SECONDS)
                rate[name] = result.jobs_per_second
                found.jobs[name].add(result.jobs_per_second)
                found.p50[name].add(result.p50_ms)
            found.ratio.add(rate["reserve_confirm"] / rate["enqueue_plain"])
            print(f"repeat {repeat + 1}, {engine}: " + ", ".join(
                f"{SCENARIO_NAMES[n]} {rate[n]:,.0f} jobs/s" for n in SCENARIO_NAMES),
                file=sys.stderr, flush=True)
        figures[engine] = found
    return figures


# -- part 2: the check-back ---------------------------------------------------------------------

class Receiver:
    """A producer's check endpoint: verifies each check's signature, answers commit."""

    def __init__(self) -> None:
        from queuelog_client.signature import SignatureError, verify_check

        receiver = self
        self.secret = ""  # the producer key's check secret, once made
        self.asked = 0
        self.refused = 0
        self.lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a real endpoint would
            # Headers and body are two writes: without TCP_NODELAY, Nagle's algorithm holds
            # the body until the client's delayed ACK (40 ms a check).
            disable_nagle_algorithm = True

            def do_GET(self) -> None:
                try:
                    verify_check(receiver.secret, self.headers, urlsplit(self.path).query)
                    status, body = 200, b'{"commit": true}'
                except SignatureError:
                    status, body = 401, b""
                with receiver.lock:
                    receiver.asked += 1
                    receiver.refused += status != 200
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def prefix(self) -> str:
        """What the operator allows (QUEUELOG_CHECK_URL_ORIGINS): this endpoint's port."""
        return f"http://127.0.0.1:{self.server.server_address[1]}/queuelog/"

    @property
    def url(self) -> str:
        return f"{self.prefix}check"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def fresh_database(engine: str, directory: str) -> Iterator[str]:
    if engine == "PostgreSQL":
        with postgres_database(os.environ[POSTGRES_VARIABLE]) as url:
            yield url
    else:
        yield migrated_database(directory, "reserve-checks.sqlite3")


@dataclass
class CheckFigures:
    seconds: Spread
    per_second: Spread


def reserve_many(app: Any, token: str, check_url: str, count: int) -> list[int]:
    """`count` reservations with a one-second deadline and a check url (set-up, not timed;
    no check loop runs meanwhile)."""
    client = app.test_client()
    headers = {"Authorization": f"Bearer {token}"}
    made = []
    for n in range(count):
        answer = client.post("/jobs", headers=headers, json={
            **job_body(n), "reserve": {"confirm_within_seconds": 1, "check_url": check_url}})
        if answer.status_code != 201:
            raise RuntimeError(f"reserve answered {answer.status_code}")
        made.append(answer.json["id"])
    return made


def reserved_count(app: Any, admin_token: str) -> int:
    """Jobs still reserved (GET /types/email's counts, taken fresh)."""
    answer = app.test_client().get("/types/email",
                                   headers={"Authorization": f"Bearer {admin_token}"})
    reserved: int = answer.json["counts"]["reserved"]
    return reserved


def measure_checks(engine: str, directory: str, sizes: Sizes, repeats: int) -> CheckFigures:
    from app import create_app
    from app.core.callers import Role
    from app.core.clock import Clock
    from app.dispatch.check_rounds import Checker
    from app.dispatch.checks import CheckSettings
    from app.dispatch.http import PushClient

    figures = CheckFigures(Spread(), Spread())
    clock = Clock()  # the loop puts checks off in real time
    settings = CheckSettings()

    def ask_all(checker: Any, expected: int) -> float:
        """Run the check loop until the receiver was asked `expected` more times and every
        answer is recorded; the seconds it took."""
        time.sleep(1.1)  # every deadline passed: all their checks are due
        before = receiver.asked
        stopping = threading.Event()
        began = time.perf_counter()
        loop = threading.Thread(target=checker.run, args=(stopping,), daemon=True)
        loop.start()
        while receiver.asked - before < expected:
            time.sleep(0.002)
        checker.wait_idle(60)
        seconds = time.perf_counter() - began
        stopping.set()
        loop.join()
        return seconds

    with fresh_database(engine, directory) as url:
        receiver = Receiver()
        app = create_app({"DATABASE_URL": url, "JOB_TYPES": JOB_TYPES, "CLOCK": clock,
                          "CHECK_URL_ORIGINS": receiver.prefix,
                          "TYPE_COUNTS_MAX_AGE_SECONDS": 0})
        services = app.extensions["queuelog"]
        try:
            token = services.keys.create_key("shop", Role.PRODUCER)
            admin = services.keys.create_key("ops", Role.ADMIN)
            receiver.secret = services.keys.rotate_check_secret("shop")
            reservations = services.jobs.reservations
            # The dispatcher's client: a connection per delivery thread and per check of one
            # origin in flight.
            checker = Checker(reservations, PushClient(16 + settings.per_origin), clock,
                              settings)
            reserve_many(app, token, receiver.url, WARM_RESERVATIONS)  # warm, not measured
            ask_all(checker, WARM_RESERVATIONS)
            for repeat in range(repeats):
                made = reserve_many(app, token, receiver.url, sizes.reservations)
                asked_before = receiver.asked
                seconds = ask_all(checker, len(made))
                left = reserved_count(app, admin)
                if left or receiver.refused or receiver.asked - asked_before != len(made):
                    raise RuntimeError(f"{engine}: the checks left {left} reservations "
                                       f"unresolved (asked {receiver.asked - asked_before} "
                                       f"of {len(made)}, refused {receiver.refused})")
                figures.seconds.add(seconds)
                figures.per_second.add(len(made) / seconds)
                print(f"repeat {repeat + 1}, {engine}: {len(made)} reservations confirmed by "
                      f"their checks in {seconds:.2f} s", file=sys.stderr, flush=True)
        finally:
            receiver.close()
            services.db.engine.dispose()
    return figures


def measure(options: Any) -> Report:
    sizes = SMOKE if options.smoke else FULL
    report = Report("Reserved jobs: reserve + confirm, and the check-back",
                    "python bench/reserve.py", options.smoke, options.repeats)
    with scratch_directory("queuelog-bench-reserve-") as directory, \
            contextlib.ExitStack() as stack:
        over_http = measure_http(sizes, options.repeats, directory, stack)
        checks = {engine: measure_checks(engine, directory, sizes, options.repeats)
                  for engine in over_http}
    table = Table(f"Over HTTP, {CLIENTS} clients, {sizes.operations:,} jobs per run "
                  "(median [min-max] over repeats)",
                  ["database", "operation", "jobs/s", "p50 ms per job",
                   "reserve + confirm / plain"])
    for engine, figures in over_http.items():
        for name, label in SCENARIO_NAMES.items():
            table.add(engine, label, figures.jobs[name].show(), figures.p50[name].show(1),
                      figures.ratio.show(2) if name == "reserve_confirm" else "")
    report.tables.append(table)
    check_table = Table(f"The check-back: {sizes.reservations:,} reservations past their "
                        "deadline, the dispatcher's check loop (default settings) asking a "
                        "local receiver (median [min-max] over repeats)",
                        ["database", "seconds until all confirmed", "resolved/s"])
    for engine, checked in checks.items():
        check_table.add(engine, checked.seconds.show(2), checked.per_second.show())
    report.tables.append(check_table)
    for engine, figures in over_http.items():
        report.targets.append(Target(
            f"{engine}: reserve + confirm vs plain enqueue, jobs/s over HTTP, {CLIENTS} "
            "clients", f"≥ {TARGET_RATIO}", figures.ratio.show(2),
            figures.ratio.median >= TARGET_RATIO))
    for engine, checked in checks.items():
        report.targets.append(Target(
            f"{engine}: checks asked and recorded per second, one prompt receiver",
            f"≥ {TARGET_CHECKS_PER_SECOND}", checked.per_second.show(),
            checked.per_second.median >= TARGET_CHECKS_PER_SECOND))
    report.notes += [
        "The server runs the shipped gunicorn.conf.py (workers = cores, 16 threads each) on a "
        "fresh database; the clients are threads in forked processes on the same 2 cores.",
        "A reserve is an enqueue that stores the job `reserved` and a job_reservations row; "
        "its confirm is a second request, a conditional UPDATE from reserved and the job's "
        "entry into the queue. So reserve + confirm makes two requests and two transactions "
        "per job, where a plain enqueue makes one.",
        "The check-back runs in this process, without HTTP in front of the database: the "
        "dispatcher's check loop takes due checks in rounds (one transaction each) and its "
        "threads (QUEUELOG_CHECK_CONCURRENCY) GET them, signed, at most "
        "QUEUELOG_CHECK_ORIGIN_CONCURRENCY at the one receiver at once, each confirmed in a "
        "transaction of its own (grouped into shared commits on SQLite). The receiver "
        "verifies each signature (queuelog_client.verify_check) and answers with "
        "TCP_NODELAY. The figure runs from the loop's start, every deadline passed, to the "
        "last answer recorded.",
    ]
    return report


def main(argv: list[str] | None = None) -> None:
    run_script(measure, __doc__, argv)


if __name__ == "__main__":
    main()
