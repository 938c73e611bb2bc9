"""Backlog: what the counting read paths cost with a deep queue (docs/SCALING.md), under
real gunicorn (the shipped gunicorn.conf.py, 4 workers) on SQLite.

With PENDING jobs pending (default 1,000,000; a fifth scheduled ahead, as bench/flow.py
builds them), it measures, printing the median over the repeats of each figure:

1. one explain (GET /jobs/{id}/explain) of the newest job, by its producer, sequentially;
2. a flood: 64 concurrent explains from one producer key while another producer does
   POST /jobs and anyone GET /healthz one after the other: the other client's latencies
   (p50, max) and how many explains answered 503;
3. GET /types p50 (admin), public GET /metrics p50;
4. the dashboard (a signed-in admin): /ui/ p50 and a job's page (/ui/jobs/{id}) p95.

    PYTHONPATH=. python bench/backlog.py [--pending N] [--repeats N] [--database FILE]
        [--postgres URL] [--skip-sqlite] [--root CHECKOUT]

--database keeps the built SQLite file there (built when missing), so that runs before and
after a change measure the same database. With --postgres (default: $QUEUELOG_BENCH_POSTGRES_URL)
the same is measured on a fresh database of that server, dropped afterwards.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/backlog.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.dashboard import Browser
from bench.data import (
    JOB_TYPES,
    POSTGRES_VARIABLE,
    create_keys,
    postgres_database,
    scratch_directory,
    sqlite_url,
)
from bench.flow import build_million
from bench.load import LOOPBACK
from bench.servers import gunicorn_server
from bench.stats import percentile

FLOOD = 64
KEYS = {"admin-0": "admin", "producer-0": "producer", "producer-1": "producer",
        "worker-0": "worker"}


def timed(port: int, method: str, path: str, headers: dict[str, str],
          body: Any = None) -> tuple[float, int, bytes]:
    """One request on a connection of its own: (seconds, status, body)."""
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=120)
    data = None if body is None else json.dumps(body).encode()
    began = time.perf_counter()
    conn.request(method, path, body=data, headers=headers)
    response = conn.getresponse()
    raw = response.read()
    elapsed = time.perf_counter() - began
    conn.close()
    return elapsed, response.status, raw


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def sequential(port: int, path: str, headers: dict[str, str], n: int) -> list[float]:
    out = []
    for _ in range(n):
        elapsed, status, raw = timed(port, "GET", path, headers)
        assert status == 200, (path, status, raw[:300])
        out.append(elapsed)
    return out


def flood(port: int, tokens: dict[str, str], job_id: int) -> dict[str, float]:
    """64 explains at once by producer-0; producer-1 enqueues and probes /healthz meanwhile."""
    statuses: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(FLOOD + 1)

    def explain() -> None:
        start.wait()
        _elapsed, status, _raw = timed(port, "GET", f"/jobs/{job_id}/explain",
                                       bearer(tokens["producer-0"]))
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=explain) for _ in range(FLOOD)]
    for thread in threads:
        thread.start()
    start.wait()
    posts, probes = [], []
    while any(thread.is_alive() for thread in threads):
        elapsed, status, raw = timed(port, "POST", "/jobs", bearer(tokens["producer-1"]),
                                     {"type": "email", "payload": {"n": 1}})
        assert status == 201, (status, raw[:300])
        posts.append(elapsed)
        elapsed, status, raw = timed(port, "GET", "/healthz", {})
        assert status == 200, (status, raw[:300])
        probes.append(elapsed)
    for thread in threads:
        thread.join()
    return {"post_p50_ms": ms(statistics.median(posts)), "post_max_ms": ms(max(posts)),
            "healthz_p50_ms": ms(statistics.median(probes)), "healthz_max_ms": ms(max(probes)),
            "explain_503": float(statuses.count(503)),
            "explain_other": float(len([s for s in statuses if s not in (200, 503)]))}


def measure_once(port: int, tokens: dict[str, str], job_id: int) -> dict[str, float]:
    figures: dict[str, float] = {}
    producer, admin = bearer(tokens["producer-0"]), bearer(tokens["admin-0"])
    sequential(port, f"/jobs/{job_id}/explain", producer, 2)  # warm every path once
    figures["explain_ms"] = ms(statistics.median(
        sequential(port, f"/jobs/{job_id}/explain", producer, 9)))
    figures.update(flood(port, tokens, job_id))
    sequential(port, "/types", admin, 2)
    figures["types_p50_ms"] = ms(percentile(sequential(port, "/types", admin, 30), 50))
    sequential(port, "/metrics", {}, 2)
    figures["metrics_p50_ms"] = ms(percentile(sequential(port, "/metrics", {}, 15), 50))
    browser = Browser(port)
    browser.sign_in(tokens["admin-0"])
    overview, page = [], []
    for _ in range(15):
        began = time.perf_counter()
        browser.request("GET", "/ui/")
        overview.append(time.perf_counter() - began)
    for _ in range(20):
        began = time.perf_counter()
        browser.request("GET", f"/ui/jobs/{job_id}")
        page.append(time.perf_counter() - began)
    browser.close()
    figures["ui_overview_p50_ms"] = ms(percentile(overview, 50))
    figures["ui_job_p95_ms"] = ms(percentile(page, 95))
    return figures


def fill_postgres(url: str, pending: int) -> None:
    """`pending` jobs as build_million stores them (types alternating, a fifth scheduled an
    hour ahead, ids from 1), generated by the server itself: setup, not timed."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    now = time.time_ns() // 1000
    began = time.monotonic()
    with engine.begin() as conn:
        conn.execute(text("""
            INSERT INTO jobs (type, payload, priority, status, retry_count, max_retries,
                              producer, run_at, created_at, updated_at, concurrency_key)
            SELECT CASE WHEN n % 2 = 0 THEN 'email' ELSE 'report' END,
                   '{"to":"user@example.com"}', (ARRAY[0, 10, 20])[1 + n % 3], 'pending',
                   0, 3, 'producer-0',
                   CASE WHEN (n - 1) % 5 = 0 THEN :first + n + 90000000000 ELSE :first + n END,
                   :first + n, :first + n + 2000, 'customer-' || (n % 64)
            FROM generate_series(1, :pending) AS n"""),
            {"first": now - 86_400_000_000, "pending": pending})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE jobs"))
    engine.dispose()
    print(f"built {pending:,} jobs on PostgreSQL in {time.monotonic() - began:.1f} s",
          file=sys.stderr, flush=True)


def run(directory: str, url: str, engine: str, options: argparse.Namespace) -> None:
    tokens = create_keys(url, KEYS)
    # The newest due job: the jobs of its priority and above are ahead of it. (Ids count
    # from 1; every fifth job from the first is scheduled an hour ahead.)
    job_id = options.pending - 1 if (options.pending - 1) % 5 == 0 else options.pending
    runs = []
    for _repeat in range(options.repeats):
        with gunicorn_server("wsgi:app", directory, {
                "QUEUELOG_DATABASE_URL": url, "QUEUELOG_JOB_TYPES": JOB_TYPES,
                "GUNICORN_WORKERS": "4", "QUEUELOG_METRICS_PUBLIC": "1"},
                root=options.root) as server:
            runs.append(measure_once(server.port, tokens, job_id))
        print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    print(f"backlog: {options.pending:,} pending, {engine}, 4 gunicorn workers, median of "
          f"{options.repeats} repeats")
    for name in runs[0]:
        print(f"  {name:22} {statistics.median(run[name] for run in runs):>10}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--database", type=Path, default=None)
    parser.add_argument("--postgres", default=os.environ.get(POSTGRES_VARIABLE),
                        help="a PostgreSQL server URL: measure there too (default: "
                             f"${POSTGRES_VARIABLE})")
    parser.add_argument("--skip-sqlite", action="store_true")
    parser.add_argument("--root", type=Path, default=None,
                        help="serve another checkout's code (e.g. `git archive` of the commit "
                             "before a change, for the figures before it)")
    options = parser.parse_args(argv)
    with scratch_directory("queuelog-bench-backlog-") as directory:
        if not options.skip_sqlite:
            target = Path(directory) / "million.sqlite3"
            if options.database is not None and options.database.exists():
                shutil.copyfile(options.database, target)
                url = sqlite_url(target)
            else:
                url = build_million(directory, [("pending", options.pending)])
                if options.database is not None:
                    shutil.copyfile(target, options.database)
            run(directory, url, "SQLite", options)
        if options.postgres:
            with postgres_database(options.postgres) as pg_url:
                fill_postgres(pg_url, options.pending)
                run(directory, pg_url, "PostgreSQL", options)


if __name__ == "__main__":
    main()
