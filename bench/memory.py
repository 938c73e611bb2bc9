"""Memory: the peak resident set (VmHWM) of one gunicorn worker after 100,000 jobs enqueued,
claimed and completed, beside the bare Flask baseline's worker after the same requests.

The jobs go through the batch routes (POST /jobs/batch, 1,000 per request; POST
/jobs/claim-many and /jobs/complete-many, 100 per request): one job per request would take
minutes per repeat on this machine.

    PYTHONPATH=. python bench/memory.py [--smoke] [--repeats N]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/memory.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.data import create_keys, migrated_database, scratch_directory
from bench.http_batch import CLIENTS  # noqa: F401 (registers the batch scenarios)
from bench.load import run_load
from bench.report import Report, Table, run_script
from bench.servers import baseline_server, queuelog_server, worker_memory_kib
from bench.stats import Spread
from tests.servers import GunicornServer

FULL_JOBS, SMOKE_JOBS = 100_000, 300
ENQUEUE_BATCH, CLAIM_BATCH = 1000, 100
SMOKE_ENQUEUE_BATCH = 100
LOAD_CLIENTS = 4
MAX_SECONDS = 600.0


def drive(server: GunicornServer, producer: str, worker: str, jobs: int,
          enqueue_batch: int) -> None:
    """Enqueue `jobs` jobs, then claim and complete them all."""
    run_load("enqueue_batch", server.port, [producer], clients=LOAD_CLIENTS,
             operations=jobs // enqueue_batch, max_seconds=MAX_SECONDS,
             params={"size": enqueue_batch})
    result = run_load("claim_complete_many", server.port, [worker],
                      clients=LOAD_CLIENTS, operations=jobs // CLAIM_BATCH,
                      max_seconds=MAX_SECONDS, params={"size": CLAIM_BATCH})
    if result.jobs != jobs:
        print(f"warning: {result.jobs} of {jobs} jobs claimed and completed",
              file=sys.stderr, flush=True)


def one_repeat(directory: str, jobs: int, enqueue_batch: int) -> dict[str, dict[str, int]]:
    """Peak and current RSS (KiB) of the single worker: at boot and after the jobs, for
    queuelog and the baseline."""
    url = migrated_database(directory, f"memory-{time.monotonic_ns()}.sqlite3")
    tokens = create_keys(url, {"producer": "producer", "worker": "worker"})
    figures: dict[str, dict[str, int]] = {}
    for label in ("baseline", "queuelog"):
        if label == "queuelog":
            server = queuelog_server(directory, url, GUNICORN_WORKERS="1")
        else:
            server = baseline_server(directory, GUNICORN_WORKERS="1")
        with server:
            (pid,) = server.worker_pids()
            booted = worker_memory_kib(pid)
            drive(server, tokens["producer"], tokens["worker"], jobs, enqueue_batch)
            after = worker_memory_kib(pid)
            if server.worker_pids() != [pid]:
                raise RuntimeError(f"{label}: the worker was replaced during the run")
        figures[label] = {"boot_hwm": booted["VmHWM"], "hwm": after["VmHWM"],
                          "rss": after["VmRSS"]}
        print(f"{label}: VmHWM {after['VmHWM'] / 1024:.1f} MiB after {jobs:,} jobs "
              f"(boot {booted['VmHWM'] / 1024:.1f} MiB)", file=sys.stderr, flush=True)
    return figures


def measure(options: Any) -> Report:
    jobs = SMOKE_JOBS if options.smoke else FULL_JOBS
    enqueue_batch = SMOKE_ENQUEUE_BATCH if options.smoke else ENQUEUE_BATCH
    report = Report("Memory: one gunicorn worker", "python bench/memory.py", options.smoke,
                    options.repeats)
    spreads = {(label, figure): Spread() for label in ("queuelog", "baseline")
               for figure in ("boot_hwm", "hwm", "rss", "growth")}
    with scratch_directory("queuelog-bench-memory-") as directory:
        for _ in range(options.repeats):
            for label, figures in one_repeat(directory, jobs, enqueue_batch).items():
                for figure, kib in figures.items():
                    spreads[(label, figure)].add(kib / 1024)
                spreads[(label, "growth")].add((figures["hwm"] - figures["boot_hwm"]) / 1024)
    table = Table(f"Resident memory of the one worker, MiB, after {jobs:,} jobs enqueued, "
                  "claimed and completed (median [min-max] over repeats)",
                  ["server", "peak (VmHWM) at boot", "peak (VmHWM) after", "growth of peak",
                   "resident (VmRSS) after"])
    for label, name in (("queuelog", "queuelog"), ("baseline", "bare Flask")):
        table.add(name, spreads[(label, "boot_hwm")].show(1), spreads[(label, "hwm")].show(1),
                  spreads[(label, "growth")].show(1), spreads[(label, "rss")].show(1))
    report.tables.append(table)
    report.notes += [
        "GUNICORN_WORKERS=1, otherwise the shipped gunicorn.conf.py (16 threads); a fresh "
        "database and a fresh server per repeat. VmHWM and VmRSS are read from "
        "/proc/<worker pid>/status; the worker is checked to be the same process at the end "
        "(max_requests did not recycle it).",
        f"Routes used: POST /jobs/batch with {enqueue_batch:,} jobs per request, then "
        f"POST /jobs/claim-many ({CLAIM_BATCH} per request) each followed by "
        f"POST /jobs/complete-many, from {LOAD_CLIENTS} concurrent clients. The single-job "
        "routes were not used to get there.",
        "The bare Flask worker answers the same requests with bodies of the same shape "
        "(bench/baseline_app.py), without database, validation or logging.",
    ]
    return report


def main(argv: list[str] | None = None) -> None:
    run_script(measure, __doc__, argv)


if __name__ == "__main__":
    main()
