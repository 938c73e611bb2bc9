"""HTTP, many jobs per request: batch enqueue (POST /jobs/batch, 100 and 1,000 jobs), the
claim-many + complete-many cycle (10 and 100 jobs per request), at 1 and 8 clients, and the
latency from an enqueue to the delivery of a long-polling claim (`wait_seconds`).

Beside each batch row at 8 clients, in turns with it, raw sqlite3 does the same database work
(bench/raw_batch.py): the same rows inserted in one transaction per batch, or the same
claims and completes with the repository's statements, on a fresh file with the same
pragmas. The ratio of the two is the batch routes' target.

    PYTHONPATH=. python bench/http_batch.py [--smoke] [--repeats N]

With QUEUELOG_BENCH_POSTGRES_URL set to a PostgreSQL server URL, the batch rows are measured
on PostgreSQL as well, in the same run, and one queuelog server is compared with two on one
PostgreSQL database.
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/http_batch.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.background import LOAD_TYPE, BackgroundLoad
from bench.data import (
    RESULT,
    create_keys,
    engine_databases,
    fill_queue,
    job_body,
    migrated_database,
    scratch_directory,
)
from bench.load import Client, HttpError, run_load, scenario, settle
from bench.raw_batch import raw_cycle_rate, raw_insert_rate
from bench.report import Report, Table, Target, run_script
from bench.servers import queuelog_server
from bench.stats import Spread, ms, percentile
from bench.storage import Statements

CLIENTS = (1, 8)
# (scenario, jobs per request): requests per load run at 1 and at 8 clients. Bounded again by
# MAX_SECONDS.
FULL_REQUESTS = {
    ("enqueue_batch", 100): {1: 150, 8: 400},
    ("enqueue_batch", 1000): {1: 20, 8: 48},
    ("claim_complete_many", 10): {1: 300, 8: 800},
    ("claim_complete_many", 100): {1: 60, 8: 160},
}
SMOKE_REQUESTS = {
    ("enqueue_batch", 100): {1: 2, 8: 8},
    ("enqueue_batch", 1000): {1: 1, 8: 8},
    ("claim_complete_many", 10): {1: 5, 8: 16},
    ("claim_complete_many", 100): {1: 2, 8: 8},
}
MAX_SECONDS = 20.0
LABELS = {"enqueue_batch": "batch enqueue", "claim_complete_many": "claim-many + complete-many"}
LONG_POLL_SAMPLES = {False: 30, True: 3}
LONG_POLL_WAIT_SECONDS = 5
# Long-polling claims ask for this type only, so the jobs the other runs leave pending never
# answer them before the enqueue being timed.
LONG_POLL_TYPE = "report"
ENQUEUE_GOAL = 10_000
CYCLE_GOAL = 5_000
LONG_POLL_GOAL_MS = 100
# Issue 37's raised goal: a waiting claim woken within 20 ms (p99) while BUSY_CLIENTS clients
# keep enqueuing jobs of another type on the same server.
BUSY_CLIENTS = 8
BUSY_POLL_GOAL_MS = 20
KEYS = {"producer-0": "producer", "producer-1": "producer", "worker-0": "worker",
        "worker-1": "worker"}
# One server against two over one PostgreSQL database, at this many clients.
SCALE_CLIENTS = 8
# The HTTP rows (SQLite) compared with raw sqlite3 doing the same work: at this many clients,
# against these goals for (scenario, jobs per request).
RAW_CLIENTS = 8
RAW_GOALS = {("enqueue_batch", 1000): 0.5, ("claim_complete_many", 100): 0.7}
RAW_LABELS = {"enqueue_batch": "insert, one transaction per batch (executemany)",
              "claim_complete_many": "claim UPDATE … RETURNING, then the completes, one "
                                     "transaction each"}


@scenario
def enqueue_batch(client: Client, context: Mapping[str, Any]) -> int:
    size = context["size"]
    client.call("POST", "/jobs/batch",
                {"jobs": [job_body(context["client_index"]) for _ in range(size)]},
                expect=(201,))
    return size


@scenario
def claim_complete_many(client: Client, context: Mapping[str, Any]) -> int:
    _, claimed = client.call("POST", "/jobs/claim-many", {"max_jobs": context["size"]},
                             expect=(200,))
    jobs = claimed["jobs"]
    if not jobs:
        return 0
    _, answer = client.call("POST", "/jobs/complete-many", {"items": [
        {"id": job["id"], "lease_token": job["lease_token"], "result": RESULT}
        for job in jobs]}, expect=(200,))
    if any(result["status"] != 200 for result in answer["results"]):
        raise HttpError(f"complete-many refused some jobs: {answer['results'][:3]}")
    return len(jobs)


def long_poll_latency(port: int, producer: str, worker: str,
                      types: list[str] | None) -> tuple[float, float] | None:
    """One sample: a claim waits (nothing it may take is pending), a producer enqueues one
    job it may take. Returns (ms from the enqueue's 201 to the claim's answer, ms from
    sending the enqueue to the claim's answer), or None when the claim was answered with
    another job (one left pending by an earlier phase): not a sample of waking."""
    answered: dict[str, Any] = {}
    body: dict[str, Any] = {"wait_seconds": LONG_POLL_WAIT_SECONDS}
    if types is not None:
        body["types"] = types

    def wait_for_job() -> None:
        client = Client(port, worker)
        try:
            status, job = client.call("POST", "/jobs/claim", body, expect=(200, 204))
            if status == 200:
                answered["at"] = time.perf_counter()
                answered["job"] = job
        finally:
            client.close()

    waiter = threading.Thread(target=wait_for_job, daemon=True)
    waiter.start()
    settle(0.25)  # the claim has found nothing and is waiting
    client = Client(port, producer)
    try:
        sent = time.perf_counter()
        _status, made = client.call("POST", "/jobs", {"type": LONG_POLL_TYPE,
                                                      "payload": {"n": 1}}, expect=(201,))
        stored = time.perf_counter()
    finally:
        client.close()
    waiter.join(LONG_POLL_WAIT_SECONDS + 10)
    if "at" not in answered:
        raise HttpError("the waiting claim was not answered with the job it waited for")
    if answered["job"]["id"] != made["id"]:
        _drain(port, worker, answered["job"], body)
        return None
    return ms(answered["at"] - stored), ms(answered["at"] - sent)


def _drain(port: int, worker: str, taken: dict[str, Any], claim: dict[str, Any]) -> None:
    """Complete the job a waiting claim took in place of the one enqueued, and every other
    job that claim could take now (the one enqueued among them), so the next sample's claim
    waits again."""
    client = Client(port, worker)
    try:
        job: dict[str, Any] | None = taken
        while job is not None:
            client.call("POST", f"/jobs/{job['id']}/complete",
                        {"lease_token": job["lease_token"], "result": RESULT}, expect=(200,))
            status, answer = client.call("POST", "/jobs/claim", {**claim, "wait_seconds": 0},
                                         expect=(200, 204))
            job = answer if status == 200 else None
    finally:
        client.close()


class LongPoll:
    """Samples of one long-polling setting, summarised per repeat."""

    def __init__(self) -> None:
        self.stored, self.stored_p99, self.maximum, self.sent = (Spread(), Spread(), Spread(),
                                                                 Spread())

    def sample(self, count: int, port: int, producer: str, worker: str,
               types: list[str] | None) -> None:
        stored: list[float] = []
        sent: list[float] = []
        for _ in range(3 * count):
            if len(stored) == count:
                break
            one = long_poll_latency(port, producer, worker, types)
            if one is not None:  # else the claim took a leftover job: sampled again
                stored.append(one[0])
                sent.append(one[1])
        if len(stored) < count:
            raise HttpError("the waiting claims kept taking jobs other than the one enqueued")
        self.stored.add(percentile(stored, 50))
        self.stored_p99.add(percentile(stored, 99))
        self.maximum.add(max(stored))
        self.sent.add(percentile(sent, 50))


def pending_jobs(url: str) -> int:
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        return conn.execute("SELECT count(*) FROM jobs WHERE status = 'pending'").fetchone()[0]


def raw_rate(directory: str, statements: Statements, name: str, size: int, count: int,
             run: int) -> float:
    """raw sqlite3's jobs/s doing `count` jobs of scenario `name`, `size` per transaction (or
    claim), on a fresh database of its own."""
    file = f"raw-{run}.sqlite3"
    if name == "enqueue_batch":
        return raw_insert_rate(directory, file, statements, count, size)
    return raw_cycle_rate(directory, file, statements, count, size)


def measure(options: Any) -> Report:
    requests = SMOKE_REQUESTS if options.smoke else FULL_REQUESTS
    report = Report("HTTP, batches and long polling", "python bench/http_batch.py",
                    options.smoke, options.repeats)
    # figures[(scenario, jobs per request, clients, engine)]; scaled[(scenario, jobs per
    # request, servers)]: one or two queuelog servers on one PostgreSQL database.
    figures: dict[tuple[str, int, int, str], dict[str, Spread]] = {}
    scaled: dict[tuple[str, int, int], dict[str, Spread]] = {}
    scale_ratios: dict[tuple[str, int], Spread] = {}
    idle_poll, backlog_poll, busy_poll = LongPoll(), LongPoll(), LongPoll()
    backlog, busy_load = Spread(), Spread()
    # raw[(scenario, jobs per request)]: raw sqlite3's jobs/s; against_raw[...]: the HTTP
    # row at RAW_CLIENTS on SQLite over raw sqlite3's, each repeat's pair measured in turns.
    raw: dict[tuple[str, int], Spread] = {}
    against_raw: dict[tuple[str, int], Spread] = {}

    def record(key: tuple[Any, ...], into: dict[Any, dict[str, Spread]], result: Any) -> None:
        spread = into.setdefault(key, {"jobs": Spread(), "requests": Spread(),
                                       "p50": Spread(), "p99": Spread()})
        spread["jobs"].add(result.jobs_per_second)
        spread["requests"].add(result.operations_per_second)
        spread["p50"].add(result.p50_ms)
        spread["p99"].add(result.p99_ms)

    with scratch_directory("queuelog-bench-batch-") as directory, \
            contextlib.ExitStack() as stack:
        urls = engine_databases(directory, stack)
        engines = list(urls)
        tokens = {engine: create_keys(url, KEYS) for engine, url in urls.items()}
        servers = {engine: stack.enter_context(queuelog_server(directory, url))
                   for engine, url in urls.items()}
        second = (stack.enter_context(queuelog_server(directory, urls["PostgreSQL"]))
                  if "PostgreSQL" in urls else None)
        idle_url = migrated_database(directory, "idle.sqlite3")
        idle_tokens = create_keys(idle_url, {"producer": "producer",
                                             "worker": "worker"})
        idle = stack.enter_context(queuelog_server(directory, idle_url))
        busy_url = migrated_database(directory, "busy.sqlite3")
        busy_tokens = create_keys(busy_url, {"producer": "producer", "worker": "worker",
                                             "load": "producer"})
        busy = stack.enter_context(queuelog_server(directory, busy_url))
        statements = Statements(directory)
        raw_runs = 0

        def keys(engine: str, name: str) -> list[str]:
            role = "producer" if name == "enqueue_batch" else "worker"
            return [tokens[engine][f"{role}-0"], tokens[engine][f"{role}-1"]]

        for repeat in range(options.repeats):
            for (name, size), counts in requests.items():
                for clients in CLIENTS:
                    count = counts[clients]
                    order = engines if repeat % 2 == 0 else list(reversed(engines))
                    # raw sqlite3 takes its turn first in even repeats, last in odd ones.
                    if clients == RAW_CLIENTS:
                        order = (["raw", *order] if repeat % 2 == 0 else [*order, "raw"])
                    http_rate: dict[tuple[str, int], float] = {}
                    for engine in order:
                        if engine == "raw":
                            raw_runs += 1
                            rate = raw_rate(directory, statements, name, size, count * size,
                                            raw_runs)
                            raw.setdefault((name, size), Spread()).add(rate)
                            print(f"repeat {repeat + 1}: {LABELS[name]} {size}/request, raw "
                                  f"sqlite3: {rate:,.0f} jobs/s", file=sys.stderr, flush=True)
                            continue
                        server = servers[engine]
                        if name == "claim_complete_many":
                            fill_queue(server.port, keys(engine, "enqueue_batch")[0],
                                       count * size)
                        result = run_load(name, server.port, keys(engine, name),
                                          clients=clients, operations=count,
                                          max_seconds=MAX_SECONDS, params={"size": size})
                        record((name, size, clients, engine), figures, result)
                        if engine == "SQLite" and clients == RAW_CLIENTS:
                            http_rate[(name, size)] = result.jobs_per_second
                        print(f"repeat {repeat + 1}: {LABELS[name]} {size}/request at "
                              f"{clients} client(s), {engine}: "
                              f"{result.jobs_per_second:,.0f} jobs/s",
                              file=sys.stderr, flush=True)
                    if clients == RAW_CLIENTS:
                        against_raw.setdefault((name, size), Spread()).add(
                            http_rate[(name, size)] / raw[(name, size)].values[-1])
                if second is None:
                    continue
                pair = [servers["PostgreSQL"].port, second.port]
                count = counts[SCALE_CLIENTS]
                done = {}
                for count_of_servers in ([1, 2] if repeat % 2 == 0 else [2, 1]):
                    if name == "claim_complete_many":
                        fill_queue(pair[0], keys("PostgreSQL", "enqueue_batch")[0],
                                   count * size)
                    done[count_of_servers] = result = run_load(
                        name, pair[:count_of_servers], keys("PostgreSQL", name),
                        clients=SCALE_CLIENTS, operations=count, max_seconds=MAX_SECONDS,
                        params={"size": size})
                    record((name, size, count_of_servers), scaled, result)
                scale_ratios.setdefault((name, size), Spread()).add(
                    done[2].jobs_per_second / done[1].jobs_per_second)
                print(f"repeat {repeat + 1}: {LABELS[name]} {size}/request on PostgreSQL: "
                      f"one server {done[1].jobs_per_second:,.0f} jobs/s, two "
                      f"{done[2].jobs_per_second:,.0f}", file=sys.stderr, flush=True)
            samples = LONG_POLL_SAMPLES[options.smoke]
            # An empty queue, and a claim that may take any type: the wake-up alone.
            idle_poll.sample(samples, idle.port, idle_tokens["producer"],
                             idle_tokens["worker"], None)
            # Behind the jobs the runs above left pending, waiting for another type.
            backlog.add(pending_jobs(urls["SQLite"]))
            backlog_poll.sample(max(1, samples // 3), servers["SQLite"].port,
                                tokens["SQLite"]["producer-1"], tokens["SQLite"]["worker-1"],
                                [LONG_POLL_TYPE])
            # The same wake-up while BUSY_CLIENTS clients enqueue another type on its server.
            with BackgroundLoad(busy.port, busy_tokens["load"], None, BUSY_CLIENTS) as load:
                busy_poll.sample(samples, busy.port, busy_tokens["producer"],
                                 busy_tokens["worker"], [LONG_POLL_TYPE])
                load.check()
                busy_load.add(load.jobs_per_second())

    table = Table("Jobs/s and latency per request (median [min-max] over repeats)",
                  ["operation", "jobs per request", "clients", "database", "jobs/s",
                   "requests/s", "p50 ms", "p99 ms"])
    for (name, size, clients, engine), spread in figures.items():
        table.add(LABELS[name], f"{size:,}", clients, engine, spread["jobs"].show(),
                  spread["requests"].show(), spread["p50"].show(1), spread["p99"].show(1))
    report.tables.append(table)
    raw_table = Table(
        f"raw sqlite3 doing the same database work, beside the HTTP rows at {RAW_CLIENTS} "
        "clients on SQLite, measured in turns (median [min-max] over repeats)",
        ["operation", "jobs per request / transaction", "raw sqlite3 does", "raw sqlite3 jobs/s",
         f"HTTP jobs/s, {RAW_CLIENTS} clients", "HTTP / raw"])
    for (name, size), spread in raw.items():
        raw_table.add(LABELS[name], f"{size:,}", RAW_LABELS[name], spread.show(),
                      figures[(name, size, RAW_CLIENTS, "SQLite")]["jobs"].show(),
                      against_raw[(name, size)].show(2))
    report.tables.append(raw_table)
    if scaled:
        scale_table = Table(
            f"One server vs two servers (two gunicorn instances, clients split between them) "
            f"on one PostgreSQL database, {SCALE_CLIENTS} clients (median [min-max] over "
            "repeats)", ["operation", "jobs per request", "one server jobs/s",
                         "two servers jobs/s", "two / one", "one server p99 ms",
                         "two servers p99 ms"])
        for name, size in requests:
            one, two = scaled[(name, size, 1)], scaled[(name, size, 2)]
            scale_table.add(LABELS[name], f"{size:,}", one["jobs"].show(), two["jobs"].show(),
                            scale_ratios[(name, size)].show(2), one["p99"].show(1),
                            two["p99"].show(1))
        report.tables.append(scale_table)
    samples = LONG_POLL_SAMPLES[options.smoke]
    poll_table = Table(
        "Long polling: an enqueue's 201 → the waiting claim's answer, ms (median [min-max] "
        "over repeats of each repeat's percentiles)",
        ["queue the claim waits on", "samples per repeat", "p50", "p99", "max",
         "p50 from sending the enqueue"])
    poll_table.add("empty; the claim takes any type", samples, idle_poll.stored.show(1),
                   idle_poll.stored_p99.show(1), idle_poll.maximum.show(1),
                   idle_poll.sent.show(1))
    poll_table.add(f"{backlog.show()} pending jobs of another type; the claim asks for "
                   f"types=['{LONG_POLL_TYPE}']", max(1, samples // 3),
                   backlog_poll.stored.show(1), backlog_poll.stored_p99.show(1),
                   backlog_poll.maximum.show(1), backlog_poll.sent.show(1))
    poll_table.add(f"{BUSY_CLIENTS} clients enqueuing '{LOAD_TYPE}' jobs meanwhile "
                   f"({busy_load.show()} jobs/s); the claim asks for types=['{LONG_POLL_TYPE}']",
                   samples, busy_poll.stored.show(1), busy_poll.stored_p99.show(1),
                   busy_poll.maximum.show(1), busy_poll.sent.show(1))
    report.tables.append(poll_table)

    def best(name: str) -> tuple[str, Spread]:
        key = max((k for k in figures if k[0] == name and k[3] == "SQLite"),
                  key=lambda k: figures[k]["jobs"].median)
        return f"{key[1]:,} per request, {key[2]} clients", figures[key]["jobs"]

    where, spread = best("enqueue_batch")
    report.targets.append(Target(f"batch enqueue jobs/s (best: {where})",
                                 f"≥ {ENQUEUE_GOAL:,}", spread.show(),
                                 spread.median >= ENQUEUE_GOAL))
    where, spread = best("claim_complete_many")
    report.targets.append(Target(f"claim-many + complete-many jobs/s (best: {where})",
                                 f"≥ {CYCLE_GOAL:,}", spread.show(),
                                 spread.median >= CYCLE_GOAL))
    for (name, size), goal in RAW_GOALS.items():
        ratio = against_raw[(name, size)]
        report.targets.append(Target(
            f"{LABELS[name]} ({size:,} per request, {RAW_CLIENTS} clients) / raw sqlite3 "
            "doing the same work", f"≥ {goal}", ratio.show(2), ratio.median >= goal))
    report.targets.append(Target("long-poll delivery after the enqueue's 201, empty queue, p99",
                                 f"≤ about {LONG_POLL_GOAL_MS} ms (docs/JOBS.md)",
                                 idle_poll.stored_p99.show(1, " ms"),
                                 idle_poll.stored_p99.median <= LONG_POLL_GOAL_MS))
    report.targets.append(Target(
        f"long-poll delivery after the enqueue's 201 while {BUSY_CLIENTS} clients enqueue "
        "another type, p99", f"≤ {BUSY_POLL_GOAL_MS} ms",
        busy_poll.stored_p99.show(1, " ms"), busy_poll.stored_p99.median <= BUSY_POLL_GOAL_MS))
    report.notes += [
        "One gunicorn under the shipped gunicorn.conf.py (workers = cores, 16 threads each) on a "
        "fresh SQLite file with the default synchronous=FULL: durability as shipped; with "
        "QUEUELOG_BENCH_POSTGRES_URL set, another over a fresh PostgreSQL database on the "
        "same machine (fsync on), the two taking turns. The targets and the long-polling "
        "rows are SQLite's.",
        "A PostgreSQL server running with autovacuum = off (the test server does) gets the "
        "bench's stand-in (bench/data.py, StandInAutovacuum): without ANALYZE the planner "
        "has no statistics for jobs and sorts every pending row for each claim.",
        "One vs two servers: a second gunicorn over the same PostgreSQL database, the "
        "clients taking the two in turn; on this 2-core machine everything shares the same "
        "cores, so the ratio shows what a second server costs or gains through the "
        "database, not what a second host would add.",
        "A claim-many + complete-many request pair is one operation: its latency spans both, "
        "its jobs are those claimed and completed. The queue is filled through /jobs/batch "
        "before each cycle run (not timed); jobs left by the enqueue runs stay pending, so "
        "claims run over a table of tens to hundreds of thousands of jobs.",
        "Long polling: a worker's POST /jobs/claim with wait_seconds=5 waits; 250 ms later "
        "(plus a random 0-50 ms, so that the 50 ms peek is not lined up with the enqueue and "
        "a wake that failed shows) a producer enqueues one job it may take. A claim waiting "
        "in the gunicorn worker that stored the job is woken at once by its condition "
        "variable; in the other worker by the datagram the storing worker sends it "
        "(app/jobs/wake/host_wake.py), its 50 ms peek the fallback. 'Empty' runs on a second "
        "server over its own database, where nothing else is ever pending.",
        "The second row waits behind the jobs the runs above left pending (of type "
        "'email'), for a 'report' job: each peek and each claim reads only the 'report' "
        "part of the per-type claim-order index, so the backlog of other types costs it "
        "nothing (see depth.py's typed rows).",
        f"The third row runs on a third server over its own database while {BUSY_CLIENTS} "
        f"closed-loop clients in a process of their own POST /jobs of type '{LOAD_TYPE}' as "
        "fast as it answers (bench/background.py; the jobs/s is theirs): the wake-up "
        "competing with a busy writer for the server's cores and its write lock. A figure "
        "below zero is a claim answered before the producer had read its own 201.",
        "raw sqlite3 (bench/raw_batch.py): a fresh file migrated to the real schema (every "
        "index of the jobs table), the engine's pragmas (WAL, synchronous=FULL), the rows the "
        "service's intake builds for the same job bodies. Enqueue: one executemany of the "
        "jobs table's INSERT per batch, in its own transaction. Claim + complete: the "
        "repository's claim UPDATE … RETURNING (caught from SQLAlchemy, as storage.py "
        "does) for that many jobs in claim order in one transaction, then its fenced "
        "complete UPDATE … RETURNING for each of them in another. It does none of what "
        "queuelog adds: HTTP, JSON, validation, the history rows (an event per job and "
        "change, an attempt per claim), the key check, the lease rescue, flow control.",
        "The clients are threads in forked processes sharing the 2 cores with the server.",
    ]
    return report


def main(argv: list[str] | None = None) -> None:
    run_script(measure, __doc__, argv)


if __name__ == "__main__":
    main()
