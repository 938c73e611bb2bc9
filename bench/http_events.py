"""HTTP claim + complete with each job's timeline written (QUEUELOG_JOB_EVENTS=1, the default)
beside the same server with events switched off (QUEUELOG_JOB_EVENTS=0), at 1 and 8
concurrent clients. Attempts are written in both; the difference is the events alone (a
claimed and a completed event per job, in the transactions of the claim and the complete).

With QUEUELOG_BENCH_PREVIOUS set to a git revision (one from before job history), that
release runs beside them, from `git archive` of the revision, on its own migrated database:
its ratio is the cost of the whole history (attempts and events).

    PYTHONPATH=. python bench/http_events.py [--smoke] [--repeats N]
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/http_events.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import ROOT
from bench.data import (
    JOB_TYPES,
    create_keys,
    fill_queue,
    migrated_database,
    scratch_directory,
    sqlite_url,
)
from bench.http_single import claim_complete_one  # noqa: F401 (registers the scenario)
from bench.load import run_load
from bench.report import Report, Table, Target, run_script
from bench.servers import gunicorn_server, queuelog_server
from bench.stats import Spread

CLIENTS = (1, 8)
FULL_OPERATIONS = {1: 800, 8: 3000}
SMOKE_OPERATIONS = {1: 40, 8: 80}
MAX_SECONDS = 15.0
TARGET_CLIENTS = 8
PREVIOUS = "previous release"
WARM_UP = 200  # claim + complete cycles run on each server before any is measured
TARGET_RATIO = 0.85  # events may cost at most 15 % of the hot path's throughput


def _previous_release(directory: Path, revision: str) -> tuple[Path, str, dict[str, str]]:
    """The project at `revision`, unpacked under `directory`, a database migrated by its own
    migrations, and its keys; (root, database URL, tokens)."""
    root = directory / "previous"
    root.mkdir()
    archive = subprocess.run(["git", "archive", revision], cwd=ROOT, check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(root, filter="data")
    url = sqlite_url(root / "queuelog.sqlite3")
    script = (
        "import json, sys\n"
        "from app import create_app\nfrom app.keys.models import Role\n"
        "from app.migrations import upgrade\n"
        "upgrade(sys.argv[1])\n"
        "app = create_app({'DATABASE_URL': sys.argv[1], 'JOB_TYPES': sys.argv[2]})\n"
        "keys = app.extensions['queuelog'].keys\n"
        "print(json.dumps({name: keys.create_key(name, Role(name.split('-')[0]))\n"
        "                  for name in ('producer-0', 'worker-0', 'worker-1')}))\n")
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("QUEUELOG_")} | {"PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", script, url, JOB_TYPES], cwd=root,
                          env=env, check=True, capture_output=True, text=True)
    return root, url, json.loads(done.stdout.strip().splitlines()[-1])


def measure(options: Any) -> Report:
    operations = SMOKE_OPERATIONS if options.smoke else FULL_OPERATIONS
    report = Report("HTTP claim + complete: events on vs off", "python bench/http_events.py",
                    options.smoke, options.repeats)
    figures: dict[tuple[int, str], dict[str, Spread]] = {}
    ratios: dict[int, Spread] = {}
    previous_ratios: dict[int, Spread] = {}
    with scratch_directory("queuelog-bench-events-") as directory:
        servers = {}
        tokens = {}
        for label, flag in (("events on", "1"), ("events off", "0")):
            sub = Path(directory) / label.replace(" ", "-")
            sub.mkdir()
            url = migrated_database(sub)
            tokens[label] = create_keys(url, {"producer-0": "producer",
                                                     "worker-0": "worker",
                                                     "worker-1": "worker"})
            servers[label] = queuelog_server(str(sub), url, QUEUELOG_JOB_EVENTS=flag)
        previous = os.environ.get("QUEUELOG_BENCH_PREVIOUS")
        if previous:
            root, url, tokens[PREVIOUS] = _previous_release(Path(directory), previous)
            servers[PREVIOUS] = gunicorn_server(
                "wsgi:app", directory, {"QUEUELOG_DATABASE_URL": url,
                                        "QUEUELOG_JOB_TYPES": JOB_TYPES}, root=root)
        try:
            for label, server in servers.items():  # warm up: not measured
                fill_queue(server.port, tokens[label]["producer-0"], WARM_UP)
                run_load("claim_complete_one", server.port,
                                [tokens[label]["worker-0"], tokens[label]["worker-1"]],
                                clients=TARGET_CLIENTS, operations=WARM_UP,
                                max_seconds=MAX_SECONDS)
            for repeat in range(options.repeats):
                for clients in CLIENTS:
                    count = operations[clients]
                    order = list(servers)
                    if repeat % 2:
                        order.reverse()
                    run = {}
                    for label in order:
                        port = servers[label].port
                        fill_queue(port, tokens[label]["producer-0"], count)
                        result = run_load(
                            "claim_complete_one", port,
                            [tokens[label]["worker-0"], tokens[label]["worker-1"]],
                            clients=clients, operations=count, max_seconds=MAX_SECONDS)
                        run[label] = result
                        spread = figures.setdefault((clients, label), {
                            "jobs": Spread(), "p50": Spread(), "p99": Spread()})
                        spread["jobs"].add(result.jobs_per_second)
                        spread["p50"].add(result.p50_ms)
                        spread["p99"].add(result.p99_ms)
                    ratios.setdefault(clients, Spread()).add(
                        run["events on"].jobs_per_second / run["events off"].jobs_per_second)
                    if PREVIOUS in run:
                        previous_ratios.setdefault(clients, Spread()).add(
                            run["events on"].jobs_per_second / run[PREVIOUS].jobs_per_second)
                    print(f"repeat {repeat + 1}: {clients} client(s): " + ", ".join(
                          f"{label} {result.jobs_per_second:,.0f} jobs/s"
                          for label, result in run.items()), file=sys.stderr, flush=True)
        finally:
            for server in servers.values():
                server.stop()

    table = Table("claim + complete jobs/s and latency (median [min-max] over repeats)",
                  ["clients", "events on jobs/s", "events off jobs/s", "on / off",
                   "on p50 ms", "on p99 ms", "off p50 ms", "off p99 ms"])
    for clients in CLIENTS:
        on, off = figures[(clients, "events on")], figures[(clients, "events off")]
        table.add(clients, on["jobs"].show(), off["jobs"].show(), ratios[clients].show(2),
                  on["p50"].show(1), on["p99"].show(1), off["p50"].show(1),
                  off["p99"].show(1))
    report.tables.append(table)
    if previous_ratios:
        release = Table(
            f"Beside the previous release ({os.environ['QUEUELOG_BENCH_PREVIOUS']}): attempts "
            "and events together",
            ["clients", "previous jobs/s", "events on / previous", "previous p50 ms",
             "previous p99 ms"])
        for clients in CLIENTS:
            old = figures[(clients, PREVIOUS)]
            release.add(clients, old["jobs"].show(), previous_ratios[clients].show(2),
                        old["p50"].show(1), old["p99"].show(1))
        report.tables.append(release)
    ratio = ratios[TARGET_CLIENTS]
    report.targets.append(Target(
        f"HTTP claim + complete with events vs without, {TARGET_CLIENTS} clients",
        f"≥ {TARGET_RATIO}", ratio.show(2), ratio.median >= TARGET_RATIO))
    report.notes += [
        "Two queuelog servers from the same checkout, each on its own fresh SQLite file with "
        "the shipped gunicorn.conf.py, differing only in QUEUELOG_JOB_EVENTS; each repeat "
        "alternates which runs first. Attempts are written by both.",
        "The queue is filled through /jobs/batch before each run (not timed; with events on "
        "that also writes the enqueued events).",
    ]
    return report


def main(argv: list[str] | None = None) -> None:
    run_script(measure, __doc__, argv)


if __name__ == "__main__":
    main()
