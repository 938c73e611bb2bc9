"""Push delivery: deliveries per second through `queuelog dispatch` beside a plain loop of the
same HTTP client.

1. `queuelog dispatch --concurrency 16` delivering a backlog of jobs to a receiver that
   answers 200 at once (its own process: a threaded standard-library server), each delivery
   a claim, a signed POST and a complete; the rate is read from the database between 10 %
   and 90 % of the backlog done, so that the dispatcher's start and its pick-up of the push
   setting are left out.
2. The baseline: 16 threads posting the same number of requests, of the same size, through
   the same client (one urllib3 PoolManager, 16 connections) to the same receiver.

Taking turns within each repeat, on one SQLite file under the shipped gunicorn.conf.py.

    PYTHONPATH=. python bench/push.py [--smoke] [--repeats N]
"""

from __future__ import annotations

import http.server
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/push.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import urllib3

from bench import ROOT
from bench.data import JOB_TYPES, create_keys, job_body, migrated_database, scratch_directory
from bench.load import Client
from bench.report import Report, Table, Target, run_script
from bench.servers import queuelog_server
from bench.stats import Spread
from tests.servers import HOST, free_port, server_environment

CONCURRENCY = 16
FULL_JOBS, SMOKE_JOBS = 4000, 300
TARGET_RATIO = 0.5
MAX_SECONDS = 180.0
# A delivery's body: a job of job_body's payload as the dispatcher sends it (about 500 B).
BASELINE_BODY = (b'{"id":1,"type":"email","payload":{"to":"user-1@example.com",'
                 b'"template":"welcome-v2","locale":"en-GB"},"priority":"medium",'
                 b'"status":"running","retry_count":0,"max_retries":3,'
                 b'"idempotency_key":null,"concurrency_key":null,'
                 b'"run_at":"2026-11-30T06:00:00.000000Z","claimed_at":'
                 b'"2026-11-30T06:00:00.000000Z","worker_id":"queuelog:dispatch",'
                 b'"lease_expires_at":"2026-11-30T06:00:35.000000Z","result":null,'
                 b'"created_at":"2026-11-30T06:00:00.000000Z","updated_at":'
                 b'"2026-11-30T06:00:00.000000Z","unique_key":null,"attempt":1}')


class _Answer(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *_args: object) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256


def serve_receiver(port: int) -> None:
    _Server((HOST, port), _Answer).serve_forever()


def baseline(url: str, count: int) -> float:
    """Requests per second: `count` POSTs from CONCURRENCY threads through one pool."""
    pool = urllib3.PoolManager(maxsize=CONCURRENCY, block=True, retries=False)
    headers = {"Content-Type": "application/json"}
    left = iter(range(count))
    lock = threading.Lock()

    def loop() -> None:
        while True:
            with lock:
                if next(left, None) is None:
                    return
            response = pool.request("POST", url, body=BASELINE_BODY, headers=headers,
                                    timeout=urllib3.Timeout(connect=10, read=30))
            assert response.status == 200, response.status

    threads = [threading.Thread(target=loop) for _ in range(CONCURRENCY)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    pool.clear()
    return count / seconds


def completed(database: str) -> int:
    with sqlite3.connect(database, timeout=30) as conn:
        return int(conn.execute(
            "SELECT count(*) FROM jobs WHERE status = 'completed'").fetchone()[0])


def dispatched(directory: str, url: str, database: str, port: int, tokens: dict[str, str],
               receiver_url: str, count: int, already: int) -> float:
    """Deliveries per second of one dispatcher through a backlog of `count` jobs."""
    client = Client(port, tokens["producer-0"])
    admin = Client(port, tokens["admin-0"])
    try:
        for start in range(0, count, 1000):
            client.call("POST", "/jobs/batch", {"jobs": [
                job_body(n) for n in range(start, min(count, start + 1000))]})
        env = server_environment(Path(directory) / "dispatch", QUEUELOG_DATABASE_URL=url,
                                 QUEUELOG_JOB_TYPES=JOB_TYPES)
        env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{ROOT / 'client'}"
        with open(Path(directory) / "dispatch.log", "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "app", "dispatch", "--concurrency", str(CONCURRENCY)],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        try:
            admin.call("PATCH", "/types/email", {"push": {"url": receiver_url}},
                       expect=(200,))
            low, high = already + count // 10, already + count - count // 10
            deadline = time.monotonic() + MAX_SECONDS
            marks: dict[int, float] = {}
            while len(marks) < 2:
                done = completed(database)
                now = time.perf_counter()
                if done >= low and low not in marks:
                    marks[low] = now
                if done >= high:
                    marks[high] = now
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError(f"the dispatcher did not finish: {done} of {count}")
                time.sleep(0.01)
            while completed(database) < already + count:
                if time.monotonic() > deadline:
                    raise RuntimeError("the backlog was not delivered in time")
                time.sleep(0.05)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
            admin.call("PATCH", "/types/email", {"push": None}, expect=(200,))
        return (high - low) / (marks[high] - marks[low])
    finally:
        client.close()
        admin.close()


def measure(options: Any) -> Report:
    count = SMOKE_JOBS if options.smoke else FULL_JOBS
    pushed, plain, ratio = Spread(), Spread(), Spread()
    loads: list[str] = []
    receiver_port = free_port()
    receiver = multiprocessing.get_context("fork").Process(
        target=serve_receiver, args=(receiver_port,), daemon=True)
    receiver.start()
    receiver_url = f"http://{HOST}:{receiver_port}/hook"
    try:
        with scratch_directory("queuelog-bench-push-") as directory:
            url = migrated_database(directory)
            database = url.removeprefix("sqlite:///")
            tokens = create_keys(url, {"producer-0": "producer", "admin-0": "admin"})
            with queuelog_server(directory, url) as server:
                done = 0
                for repeat in range(options.repeats):
                    loads.append(" ".join(f"{value:.2f}" for value in os.getloadavg()))
                    run: dict[str, float] = {}
                    order = ["dispatch", "plain"] if repeat % 2 == 0 else ["plain", "dispatch"]
                    for side in order:
                        if side == "dispatch":
                            run[side] = dispatched(directory, url, database, server.port,
                                                   tokens, receiver_url, count, done)
                            done += count
                        else:
                            run[side] = baseline(receiver_url, count)
                    pushed.add(run["dispatch"])
                    plain.add(run["plain"])
                    ratio.add(run["dispatch"] / run["plain"])
                    print(f"repeat {repeat + 1}: dispatch {run['dispatch']:,.0f}/s, plain "
                          f"loop {run['plain']:,.0f}/s", file=sys.stderr, flush=True)
    finally:
        receiver.terminate()
        receiver.join(10)
    table = Table(f"Push deliveries, concurrency {CONCURRENCY}, to a receiver answering at once "
                  "(median [min-max] over repeats)",
                  ["dispatch deliveries/s", "plain loop requests/s", "dispatch / plain"])
    table.add(pushed.show(), plain.show(), ratio.show(2))
    report = Report("Push delivery: the dispatcher vs a plain HTTP loop",
                    "PYTHONPATH=. python bench/push.py", options.smoke, options.repeats,
                    tables=[table])
    report.targets.append(Target(
        f"push deliveries/s vs a plain loop of the same client, {CONCURRENCY} at once",
        f"≥ {TARGET_RATIO}", ratio.show(2), ratio.median >= TARGET_RATIO))
    report.notes.append(f"{count:,} jobs per repeat on SQLite (synchronous=FULL); each "
                        "delivery is a claim, a signed POST and a complete. Load average "
                        f"(1/5/15 min) at each repeat: {'; '.join(loads)}.")
    return report


if __name__ == "__main__":
    run_script(measure, __doc__)
