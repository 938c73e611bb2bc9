"""Backlog: explain and the counting read paths with a million pending jobs.

What they cost with a deep queue (docs/SCALING.md), under real gunicorn (the shipped
gunicorn.conf.py, 4 workers), on SQLite (and PostgreSQL: see below).

With PENDING jobs pending (default 1,000,000; a fifth scheduled ahead, as bench/flow.py
builds them), each repeat starts a fresh server and measures:

1. one explain (GET /jobs/{id}/explain, with its position and estimate) of the newest due
   job, by its producer, sequentially: the median of 9;
2. a flood: 64 concurrent explains from one producer key while another producer does
   POST /jobs and anyone GET /healthz one after the other: the other client's latencies
   (p50, max) and how many explains answered 503;
3. GET /types p50 (admin), public GET /metrics p50;
4. the dashboard (a signed-in admin): /ui/ p50 and a job's page (/ui/jobs/{id}) p95.

Target: the single explain's p50 <= 50 ms, on each engine.

    PYTHONPATH=. python bench/backlog.py [--smoke] [--repeats N] [--pending N]
        [--database FILE] [--root CHECKOUT] [--engines sqlite,postgresql]

With QUEUELOG_BENCH_POSTGRES_URL set to a PostgreSQL server URL, the same is measured on a
fresh database of that server, dropped afterwards (`--engines postgresql` for PostgreSQL
alone). --database keeps the built SQLite file there (built when missing), so that runs
before and after a change measure the same database; --root serves another checkout's code.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/backlog.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.dashboard import Browser
from bench.data import (
    POSTGRES_VARIABLE,
    chosen_engines,
    create_keys,
    engines_option,
    postgres_database,
    scratch_directory,
    sqlite_url,
)
from bench.flow import build_million
from bench.load import LOOPBACK
from bench.report import Report, Table, Target, load_note, run_script
from bench.servers import queuelog_server
from bench.stats import Spread, ms, percentile

FULL_PENDING, SMOKE_PENDING = 1_000_000, 3_000
TARGET_MS = 50.0
FLOOD = 64
WORKERS = "4"  # the smoke run leaves the servers' workers to the shipped settings
KEYS = {"admin-0": "admin", "producer-0": "producer", "producer-1": "producer",
        "worker-0": "worker"}
# figure: (request, statistic, digits shown)
FIGURES = {
    "explain_ms": ("GET /jobs/{id}/explain, one at a time", "p50 of 9, ms", 1),
    "post_p50_ms": (f"{FLOOD} explains at once: another client's POST /jobs", "p50, ms", 1),
    "post_max_ms": (f"{FLOOD} explains at once: another client's POST /jobs", "max, ms", 1),
    "healthz_p50_ms": (f"{FLOOD} explains at once: its GET /healthz", "p50, ms", 1),
    "healthz_max_ms": (f"{FLOOD} explains at once: its GET /healthz", "max, ms", 1),
    "explain_503": (f"{FLOOD} explains at once", "answered 503", 0),
    "explain_other": (f"{FLOOD} explains at once", "answered neither 200 nor 503", 0),
    "types_p50_ms": ("GET /types (admin)", "p50 of 30, ms", 1),
    "metrics_p50_ms": ("GET /metrics (public)", "p50 of 15, ms", 1),
    "ui_overview_p50_ms": ("GET /ui/ (signed in)", "p50 of 15, ms", 1),
    "ui_job_p95_ms": ("GET /ui/jobs/{id} (signed in)", "p95 of 20, ms", 1),
}


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
    _elapsed, status, raw = timed(port, "GET", f"/jobs/{job_id}/explain", producer)
    assert status == 200 and json.loads(raw)["position"] is not None, (status, raw[:300])
    sequential(port, f"/jobs/{job_id}/explain", producer, 1)  # warm every path once
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
    """`pending` jobs as build_million stores them (types alternating, a fifth scheduled 25
    hours ahead, ids from 1), generated by the server itself: setup, not timed."""
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


@contextlib.contextmanager
def built_store(engine: str, directory: str, options: Any) -> Iterator[str]:
    """The URL of a database holding `options.pending` pending jobs (on SQLite, the file
    --database names when it exists)."""
    if engine == "PostgreSQL":
        with postgres_database(os.environ[POSTGRES_VARIABLE]) as url:
            fill_postgres(url, options.pending)
            yield url
        return
    target = Path(directory) / "million.sqlite3"
    if options.database is not None and options.database.exists():
        shutil.copyfile(options.database, target)
        yield sqlite_url(target)
        return
    url = build_million(directory, [("pending", options.pending)])
    if options.database is not None:
        shutil.copyfile(target, options.database)
    yield url


def measure_engine(engine: str, directory: str, options: Any) -> dict[str, Spread]:
    figures = {name: Spread() for name in FIGURES}
    # The newest due job: the jobs of its priority and above are ahead of it. (Ids count
    # from 1; every fifth job from the first is scheduled 25 hours ahead.)
    job_id = options.pending - 1 if (options.pending - 1) % 5 == 0 else options.pending
    workers = {} if options.smoke else {"GUNICORN_WORKERS": WORKERS}
    with built_store(engine, directory, options) as url:
        tokens = create_keys(url, KEYS)
        for repeat in range(options.repeats):
            with queuelog_server(directory, url, root=options.root, QUEUELOG_METRICS_PUBLIC="1",
                                 **workers) as server:
                once = measure_once(server.port, tokens, job_id)
            for name, value in once.items():
                figures[name].add(value)
            shown = {name: round(value, 1) for name, value in once.items()}
            print(f"{engine} repeat {repeat + 1}: {json.dumps(shown)}", file=sys.stderr,
                  flush=True)
    return figures


def measure(options: Any) -> Report:
    if options.pending is None:
        options.pending = SMOKE_PENDING if options.smoke else FULL_PENDING
    report = Report("Backlog: explain and the counting read paths at a million pending",
                    "python bench/backlog.py", options.smoke, options.repeats)
    load = os.getloadavg()
    workers = ("gunicorn workers as the shipped settings (or a smoke test) set them"
               if options.smoke else f"{WORKERS} gunicorn workers")
    with scratch_directory("queuelog-bench-backlog-") as directory:
        for engine in chosen_engines(options):
            figures = measure_engine(engine, directory, options)
            table = Table(f"{engine}: {options.pending:,} pending, {workers}, a fresh server "
                          "each repeat (median [min-max] over repeats)",
                          ["request", "statistic", "value"])
            for name, (request, statistic, digits) in FIGURES.items():
                table.add(request, statistic, figures[name].show(digits))
            report.tables.append(table)
            explain = figures["explain_ms"]
            report.targets.append(Target(
                f"GET /jobs/{{id}}/explain with position and estimate at {options.pending:,} "
                f"pending, {engine}", f"≤ {TARGET_MS:.0f} ms", explain.show(1, " ms"),
                explain.median <= TARGET_MS))
    report.notes += [
        load_note(load),
        "The store: only pending jobs, types email and report alternating, a fifth scheduled "
        "25 hours ahead, inserted directly (SQLite: bench/flow.py's build_million; "
        "PostgreSQL: one INSERT ... SELECT from generate_series, then VACUUM ANALYZE).",
        "The explained job is the newest due one, read by its producer: its position counts "
        "the claimable jobs of its type ahead through the type's claim-order index and stops "
        "at 10,000 (position_capped); its estimate reads the type's last 5 minutes of stats.",
        f"The flood: {FLOOD} explains sent at once, each on a connection of its own, while "
        "another producer sends POST /jobs and GET /healthz one after the other until they "
        "are all answered. Explains beyond QUEUELOG_COUNTING_READS per process wait up to "
        "0.5 s and then answer 503 with Retry-After.",
    ]
    return report


def own_arguments(parser: Any) -> None:
    parser.add_argument("--pending", type=int, default=None,
                        help=f"pending jobs stored (default {FULL_PENDING:,}; "
                             f"{SMOKE_PENDING:,} with --smoke)")
    parser.add_argument("--database", type=Path, default=None,
                        help="keep the built SQLite file here, or start from it when it exists")
    parser.add_argument("--root", type=Path, default=None,
                        help="serve another checkout's code (e.g. `git archive` of the commit "
                             "before a change, for the figures before it)")
    engines_option(parser)


def main(argv: list[str] | None = None) -> None:
    run_script(measure, __doc__, argv, add_arguments=own_arguments)


if __name__ == "__main__":
    main()
