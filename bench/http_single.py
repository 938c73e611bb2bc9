"""HTTP, one job per request: enqueue (POST /jobs) and the worker's claim + complete cycle
(POST /jobs/claim, then POST /jobs/{id}/complete), at 1, 8 and 32 concurrent clients, each
beside the bare Flask baseline (bench/baseline_app.py) under the same gunicorn.conf.py and
driven by the same client.

    PYTHONPATH=. python bench/http_single.py [--smoke] [--repeats N]
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/http_single.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.data import (
    RESULT,
    create_keys,
    fill_queue,
    job_body,
    migrated_database,
    scratch_directory,
)
from bench.load import Client, run_load, scenario
from bench.report import Report, Table, Target, run_script
from bench.servers import baseline_server, queuelog_server
from bench.stats import Spread

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


def measure(options: Any) -> Report:
    operations = SMOKE_OPERATIONS if options.smoke else FULL_OPERATIONS
    report = Report("HTTP, one job per request", "python bench/http_single.py",
                    options.smoke, options.repeats)
    # figures[(scenario, clients, server)] = {"jobs": Spread, "p50": ..., "p99": ...}
    figures: dict[tuple[str, int, str], dict[str, Spread]] = {}
    ratios: dict[tuple[str, int], Spread] = {}
    client_cpu = Spread()
    with scratch_directory("queuelog-bench-http-") as directory:
        url = migrated_database(directory)
        tokens = create_keys(url, {"producer-0": "producer", "producer-1": "producer",
                                   "worker-0": "worker", "worker-1": "worker"})
        producers = [tokens["producer-0"], tokens["producer-1"]]
        workers = [tokens["worker-0"], tokens["worker-1"]]
        with queuelog_server(directory, url) as queuelog, \
                baseline_server(directory) as baseline:
            for repeat in range(options.repeats):
                for clients in CLIENTS:
                    for name in SCENARIO_NAMES:
                        count = operations[clients]
                        if name == "claim_complete_one":
                            fill_queue(queuelog.port, producers[0], count)
                        keys = producers if name == "enqueue_one" else workers
                        # Alternate which server goes first, so neither always follows the
                        # other's disk writes.
                        order = [("baseline", baseline), ("queuelog", queuelog)]
                        if repeat % 2:
                            order.reverse()
                        run = {}
                        for label, server in order:
                            result = run_load(name, server.port, keys, clients=clients,
                                              operations=count, max_seconds=MAX_SECONDS)
                            run[label] = result
                            spread = figures.setdefault((name, clients, label), {
                                "jobs": Spread(), "p50": Spread(), "p99": Spread()})
                            spread["jobs"].add(result.jobs_per_second)
                            spread["p50"].add(result.p50_ms)
                            spread["p99"].add(result.p99_ms)
                            client_cpu.add(result.client_cpu_seconds / result.seconds)
                        ratios.setdefault((name, clients), Spread()).add(
                            run["queuelog"].jobs_per_second / run["baseline"].jobs_per_second)
                        print(f"repeat {repeat + 1}: {SCENARIO_NAMES[name]} at {clients} "
                              f"client(s): queuelog {run['queuelog'].jobs_per_second:,.0f} "
                              f"jobs/s, baseline {run['baseline'].jobs_per_second:,.0f}",
                              file=sys.stderr, flush=True)

    table = Table("Jobs/s and latency per operation (median [min-max] over repeats)",
                  ["operation", "clients", "queuelog jobs/s", "bare Flask jobs/s",
                   "ratio", "queuelog p50 ms", "queuelog p99 ms", "bare Flask p50 ms",
                   "bare Flask p99 ms"])
    for name, label in SCENARIO_NAMES.items():
        for clients in CLIENTS:
            q = figures[(name, clients, "queuelog")]
            b = figures[(name, clients, "baseline")]
            table.add(label, clients, q["jobs"].show(), b["jobs"].show(),
                      ratios[(name, clients)].show(2), q["p50"].show(1), q["p99"].show(1),
                      b["p50"].show(1), b["p99"].show(1))
    report.tables.append(table)
    for name, label in SCENARIO_NAMES.items():
        ratio = ratios[(name, TARGET_CLIENTS)]
        report.targets.append(Target(
            f"HTTP {label} vs bare Flask, {TARGET_CLIENTS} clients", f"≥ {TARGET_RATIO}",
            ratio.show(2), ratio.median >= TARGET_RATIO))
    report.notes += [
        "Both servers run the shipped gunicorn.conf.py (its threaded worker class, workers = "
        "cores, 16 threads each); only the bind address differs. queuelog runs on a fresh "
        "SQLite file with its defaults (WAL, synchronous=FULL, group commit), its request "
        "log to /dev/null.",
        "The ratio is queuelog's jobs/s over the baseline's in the same repeat; the two runs "
        "of a repeat alternate which goes first.",
        "A claim + complete operation is two requests; its latency spans both. The queue is "
        "filled through /jobs/batch before each claim run (not timed).",
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
