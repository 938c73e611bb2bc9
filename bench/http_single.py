"""HTTP, one job per request: enqueue (POST /jobs) and the worker's claim + complete cycle
(POST /jobs/claim, then POST /jobs/{id}/complete), at 1, 8 and 32 concurrent clients, each
beside the bare Flask baseline (bench/baseline_app.py) under the same gunicorn.conf.py and
driven by the same client.

    PYTHONPATH=. python bench/http_single.py [--smoke] [--repeats N]

With QUEUELOG_BENCH_POSTGRES_URL set to a PostgreSQL server URL, every row is measured on
PostgreSQL as well, in the same run, and one queuelog server is compared with two on one
PostgreSQL database.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/http_single.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.data import (
    RESULT,
    create_keys,
    engine_databases,
    fill_queue,
    job_body,
    scratch_directory,
)
from bench.load import Client, run_load, scenario
from bench.report import Report, Table, Target, run_script
from bench.servers import baseline_server, queuelog_server
from bench.stats import Spread
from tests.servers import GunicornServer

CLIENTS = (1, 8, 32)
# Operations per load run (bounded again by MAX_SECONDS): enough for a steady p99.
FULL_OPERATIONS = {1: 800, 8: 3000, 32: 4000}
SMOKE_OPERATIONS = {1: 40, 8: 80, 32: 96}
MAX_SECONDS = 15.0
SCENARIO_NAMES = {"enqueue_one": "enqueue", "claim_complete_one": "claim + complete"}
TARGET_CLIENTS = 8
TARGET_RATIO = 0.5


@scenario
def enqueue_one(client: Client, context: Mapping[str, Any]) -> int:
    client.call("POST", "/jobs", job_body(context["client_index"]), expect=(201,))
    return 1


@scenario
def claim_complete_one(client: Client, context: Mapping[str, Any]) -> int:
    status, job = client.call("POST", "/jobs/claim", {}, expect=(200, 204))
    if status == 204:
        return 0
    client.call("POST", f"/jobs/{job['id']}/complete",
                {"lease_token": job["lease_token"], "result": RESULT}, expect=(200,))
    return 1


KEYS = {"producer-0": "producer", "producer-1": "producer", "worker-0": "worker",
        "worker-1": "worker"}
# One server against two over one PostgreSQL database, at these client counts.
SCALE_CLIENTS = (8, 32)


def measure(options: Any) -> Report:
    operations = SMOKE_OPERATIONS if options.smoke else FULL_OPERATIONS
    report = Report("HTTP, one job per request", "python bench/http_single.py",
                    options.smoke, options.repeats)
    # figures[(scenario, clients, server)] = {"jobs": Spread, "p50": ..., "p99": ...}; server
    # is "baseline" or an engine ("SQLite", "PostgreSQL").
    figures: dict[tuple[str, int, str], dict[str, Spread]] = {}
    ratios: dict[tuple[str, int, str], Spread] = {}
    # scaled[(scenario, clients, servers)]: one or two queuelog servers on one PostgreSQL.
    scaled: dict[tuple[str, int, int], dict[str, Spread]] = {}
    scale_ratios: dict[tuple[str, int], Spread] = {}
    client_cpu = Spread()
    with scratch_directory("queuelog-bench-http-") as directory, \
            contextlib.ExitStack() as stack:
        urls = engine_databases(directory, stack)
        engines = list(urls)
        tokens = {engine: create_keys(url, KEYS) for engine, url in urls.items()}
        servers: dict[str, GunicornServer] = {
            engine: stack.enter_context(queuelog_server(directory, url))
            for engine, url in urls.items()}
        servers["baseline"] = stack.enter_context(baseline_server(directory))
        second = (stack.enter_context(queuelog_server(directory, urls["PostgreSQL"]))
                  if "PostgreSQL" in urls else None)

        def keys(engine: str, name: str) -> list[str]:
            role = "producer" if name == "enqueue_one" else "worker"
            found = tokens.get(engine, tokens["SQLite"])  # the baseline reads no key
            return [found[f"{role}-0"], found[f"{role}-1"]]

        def record(key: tuple[Any, ...], into: dict[Any, dict[str, Spread]],
                   result: Any) -> None:
            spread = into.setdefault(key, {"jobs": Spread(), "p50": Spread(),
                                           "p99": Spread()})
            spread["jobs"].add(result.jobs_per_second)
            spread["p50"].add(result.p50_ms)
            spread["p99"].add(result.p99_ms)
            client_cpu.add(result.client_cpu_seconds / result.seconds)

        for repeat in range(options.repeats):
            for clients in CLIENTS:
                for name in SCENARIO_NAMES:
                    count = operations[clients]
                    if name == "claim_complete_one":
                        for engine in engines:  # set-up, not timed
                            fill_queue(servers[engine].port, keys(engine, "enqueue_one")[0],
                                       count)
                    # Alternate which server goes first, so none always follows another's
                    # disk writes.
                    order = ["baseline", *engines]
                    if repeat % 2:
                        order.reverse()
                    run = {}
                    for label in order:
                        run[label] = result = run_load(
                            name, servers[label].port, keys(label, name), clients=clients,
                            operations=count, max_seconds=MAX_SECONDS)
                        record((name, clients, label), figures, result)
                    for engine in engines:
                        ratios.setdefault((name, clients, engine), Spread()).add(
                            run[engine].jobs_per_second / run["baseline"].jobs_per_second)
                    print(f"repeat {repeat + 1}: {SCENARIO_NAMES[name]} at {clients} "
                          "client(s): " + ", ".join(
                              f"{label} {result.jobs_per_second:,.0f} jobs/s"
                              for label, result in run.items()), file=sys.stderr, flush=True)
            if second is None:
                continue
            pair = [servers["PostgreSQL"].port, second.port]
            for clients in SCALE_CLIENTS:
                for name in SCENARIO_NAMES:
                    count = operations[clients]
                    shapes = [1, 2] if repeat % 2 == 0 else [2, 1]
                    done = {}
                    for count_of_servers in shapes:
                        if name == "claim_complete_one":
                            fill_queue(pair[0], keys("PostgreSQL", "enqueue_one")[0], count)
                        done[count_of_servers] = result = run_load(
                            name, pair[:count_of_servers], keys("PostgreSQL", name),
                            clients=clients, operations=count, max_seconds=MAX_SECONDS)
                        record((name, clients, count_of_servers), scaled, result)
                    scale_ratios.setdefault((name, clients), Spread()).add(
                        done[2].jobs_per_second / done[1].jobs_per_second)
                    print(f"repeat {repeat + 1}: {SCENARIO_NAMES[name]} at {clients} "
                          f"client(s) on PostgreSQL: one server "
                          f"{done[1].jobs_per_second:,.0f} jobs/s, two "
                          f"{done[2].jobs_per_second:,.0f}", file=sys.stderr, flush=True)

    table = Table("Jobs/s and latency per operation (median [min-max] over repeats)",
                  ["operation", "clients", "database", "queuelog jobs/s", "bare Flask jobs/s",
                   "ratio", "queuelog p50 ms", "queuelog p99 ms", "bare Flask p50 ms",
                   "bare Flask p99 ms"])
    for name, label in SCENARIO_NAMES.items():
        for clients in CLIENTS:
            b = figures[(name, clients, "baseline")]
            for engine in engines:
                q = figures[(name, clients, engine)]
                table.add(label, clients, engine, q["jobs"].show(), b["jobs"].show(),
                          ratios[(name, clients, engine)].show(2), q["p50"].show(1),
                          q["p99"].show(1), b["p50"].show(1), b["p99"].show(1))
    report.tables.append(table)
    if scaled:
        scale_table = Table(
            "One server vs two servers (two gunicorn instances, clients split between them) "
            "on one PostgreSQL database (median [min-max] over repeats)",
            ["operation", "clients", "one server jobs/s", "two servers jobs/s",
             "two / one", "one server p99 ms", "two servers p99 ms"])
        for name, label in SCENARIO_NAMES.items():
            for clients in SCALE_CLIENTS:
                one, two = scaled[(name, clients, 1)], scaled[(name, clients, 2)]
                scale_table.add(label, clients, one["jobs"].show(), two["jobs"].show(),
                                scale_ratios[(name, clients)].show(2), one["p99"].show(1),
                                two["p99"].show(1))
        report.tables.append(scale_table)
    for name, label in SCENARIO_NAMES.items():
        ratio = ratios[(name, TARGET_CLIENTS, "SQLite")]
        report.targets.append(Target(
            f"HTTP {label} vs bare Flask, {TARGET_CLIENTS} clients", f"≥ {TARGET_RATIO}",
            ratio.show(2), ratio.median >= TARGET_RATIO))
    report.notes += [
        "Every server runs the shipped gunicorn.conf.py (its threaded worker class, workers = "
        "cores, 16 threads each); only the bind address differs. queuelog runs on a fresh "
        "SQLite file with its defaults (WAL, synchronous=FULL, group commit), and, when "
        "QUEUELOG_BENCH_POSTGRES_URL is set, on a fresh PostgreSQL database on the same "
        "machine (the server's own settings, fsync on); its request log goes to /dev/null.",
        "A PostgreSQL server running with autovacuum = off (the test server does) gets the "
        "bench's stand-in (bench/data.py, StandInAutovacuum): without ANALYZE the planner "
        "has no statistics for jobs and sorts every pending row for each claim.",
        "The ratio is queuelog's jobs/s over the baseline's in the same repeat; the runs "
        "of a repeat alternate which goes first. The targets are SQLite's.",
        "A claim + complete operation is two requests; its latency spans both. The queue is "
        "filled through /jobs/batch before each claim run (not timed).",
        "One vs two servers: a second gunicorn (same settings) over the same PostgreSQL "
        "database, the clients taking the two servers in turn. On this 2-core machine the "
        "two servers, PostgreSQL and the clients share the same cores, so the ratio shows "
        "what a second server costs or gains through the database (row locks, SKIP LOCKED, "
        "connections), not what a second host would add.",
        "The clients are threads in forked processes (one per core), each with its own "
        "keep-alive connection. They share the 2 cores with the servers and used "
        f"{client_cpu.show(2)} CPU-seconds per second of load, which caps the baseline "
        "more than queuelog: the ratios flatter queuelog a little.",
    ]
    return report


def main(argv: list[str] | None = None) -> None:
    run_script(measure, __doc__, argv)


if __name__ == "__main__":
    main()
