"""Tags (docs/API.md, Tags): GET /jobs?tag= with a million stored jobs.

The store (setup, not timed), on types email and report:
- COMPLETED completed jobs with their attempts and events, inserted by SQL
  (bench/retention.py's insert_finished), then PENDING pending jobs enqueued through
  JobService (the newest: a backlog);
- their tags, inserted by SQL straight into job_tags as the enqueue writes them, spread as
  a multi-tenant producer would tag: every job "tenant:<id % 1000>" (1 job in 1000 each),
  1 % of them "order:<n>" (one job each), 10 % "vip".

One admin client (bearer token, one keep-alive http.client connection) asks the store's
gunicorn server (the shipped gunicorn.conf.py), in turns, GET /jobs?tag= of a common tag (vip),
a tenant's (tenant:17), a single job's (order:<n>) and the common tag with status=pending,
each its first page (the default limit) and the page after it (through next_cursor), and
GET /jobs without a tag beside them. Timed on the client over loopback: an upper bound of
server time. Target: p50 <= 50 ms for every tagged listing.

    PYTHONPATH=. python bench/tags.py [--smoke] [--repeats N] [--engines sqlite,postgresql]

With QUEUELOG_BENCH_POSTGRES_URL set to a PostgreSQL server URL, it is measured on PostgreSQL
as well, in a database of its own.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/tags.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.data import (
    chosen_engines,
    create_keys,
    engine_database,
    engines_option,
    scratch_directory,
)
from bench.load import Client
from bench.report import Report, Table, Target, finish, load_note, parse_options
from bench.retention import enqueue_pending, insert_finished
from bench.servers import queuelog_server
from bench.stats import Spread, ms, percentile

TARGET_MS = 50.0
TENANTS = 1000  # as TAG_JOBS writes them
# The tags of every job, by SQL on both engines ('text' || integer concatenates on both).
TAG_JOBS = (
    "INSERT INTO job_tags (job_id, tag) SELECT id, 'tenant:' || (id % 1000) FROM jobs",
    "INSERT INTO job_tags (job_id, tag) SELECT id, 'vip' FROM jobs WHERE id % 10 = 3",
    # Unique: the job's order number.
    "INSERT INTO job_tags (job_id, tag) SELECT id, 'order:' || (id * 7 + 100000) FROM jobs"
    " WHERE id % 100 = 7",
)


@dataclass(frozen=True)
class Sizes:
    completed: int
    pending: int
    requests: int  # per query and repeat


FULL = Sizes(completed=990_000, pending=10_000, requests=100)
SMOKE = Sizes(completed=3_000, pending=300, requests=5)


def tag_jobs(url: str) -> tuple[int, int]:
    """Tag every stored job (TAG_JOBS); returns (jobs, job_tags rows)."""
    from sqlalchemy import create_engine, func, select, text

    from app.storage.schema import job_tags, jobs

    engine = create_engine(url)
    began = time.monotonic()
    try:
        with engine.begin() as conn:
            for statement in TAG_JOBS:
                conn.execute(text(statement))
            stored = conn.execute(select(func.count()).select_from(jobs)).scalar_one()
            tagged = conn.execute(select(func.count()).select_from(job_tags)).scalar_one()
        if url.startswith("sqlite"):
            with engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        else:
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.exec_driver_sql("VACUUM ANALYZE job_tags")
    finally:
        engine.dispose()
    print(f"tagged: {tagged:,} job_tags rows in {time.monotonic() - began:.1f} s",
          file=sys.stderr, flush=True)
    return int(stored), int(tagged)


@contextlib.contextmanager
def built_store(engine: str, directory: str, sizes: Sizes
                ) -> Iterator[tuple[str, str, tuple[int, int]]]:
    """(url, admin token, (jobs, job_tags rows)) of the million's store."""
    with engine_database(engine, directory, "tags.sqlite3") as url:
        began = time.monotonic()
        tokens = create_keys(url, {"admin-0": "admin"})
        insert_finished(url, sizes.completed)
        enqueue_pending(url, "email", sizes.pending)
        stored = tag_jobs(url)
        print(f"{engine}: store built in {time.monotonic() - began:.1f} s", file=sys.stderr,
              flush=True)
        yield url, tokens["admin-0"], stored


def one_order_tag(url: str) -> str:
    """The order tag of a job in the middle of the store."""
    from sqlalchemy import create_engine, func, select

    from app.storage.schema import job_tags

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            orders = select(job_tags.c.job_id).where(job_tags.c.tag.like("order:%"))
            middle = conn.execute(select(func.count()).select_from(orders.subquery())
                                  ).scalar_one() // 2
            job_id = conn.execute(orders.order_by(job_tags.c.job_id).offset(middle).limit(1)
                                  ).scalar_one()
    finally:
        engine.dispose()
    return f"order:{job_id * 7 + 100000}"


def listings(order_tag: str) -> list[tuple[str, dict[str, str]]]:
    """(label, query) of each listing whose pages are timed."""
    return [
        ("GET /jobs (no tag; baseline)", {}),
        ("?tag=vip (10 % of jobs)", {"tag": "vip"}),
        (f"?tag=tenant:17 (1 in {TENANTS})", {"tag": "tenant:17"}),
        ("?tag=order:<n> (one job)", {"tag": order_tag}),
        ("?tag=vip&status=pending", {"tag": "vip", "status": "pending"}),
    ]


def pages(client: Client, query: dict[str, str]) -> list[tuple[str, str]]:
    """(page, path) of the listing's first page and, when there is one, its second."""
    first = "/jobs?" + urllib.parse.urlencode(query) if query else "/jobs"
    _status, body = client.call("GET", first, expect=(200,))
    found = [("page 1", first)]
    if body["next_cursor"] is not None:
        found.append(("page 2", "/jobs?" + urllib.parse.urlencode(
            {**query, "cursor": body["next_cursor"]})))
    return found


@dataclass
class Figures:
    p50: dict[str, Spread] = field(default_factory=dict)  # row label
    p95: dict[str, Spread] = field(default_factory=dict)
    shown: dict[str, int] = field(default_factory=dict)  # jobs on the page
    tagged: dict[str, bool] = field(default_factory=dict)
    stored: tuple[int, int] = (0, 0)


def measure_engine(engine: str, directory: str, sizes: Sizes, repeats: int) -> Figures:
    figures = Figures()
    with built_store(engine, directory, sizes) as (url, token, stored), \
            queuelog_server(directory, url) as server:
        figures.stored = stored
        client = Client(server.port, token)
        try:
            timed: list[tuple[str, str]] = []
            for label, query in listings(one_order_tag(url)):
                for page, path in pages(client, query):
                    row = f"{label}, {page}"
                    timed.append((row, path))
                    figures.tagged[row] = "tag" in query
                    _status, body = client.call("GET", path, expect=(200,))  # warm
                    figures.shown[row] = len(body["jobs"])
            for repeat in range(repeats):
                seconds: dict[str, list[float]] = {row: [] for row, _ in timed}
                for _turn in range(sizes.requests):  # in turns: the load falls on all alike
                    for row, path in timed:
                        began = time.perf_counter()
                        client.call("GET", path, expect=(200,))
                        seconds[row].append(time.perf_counter() - began)
                for row, values in seconds.items():
                    figures.p50.setdefault(row, Spread()).add(ms(percentile(values, 50)))
                    figures.p95.setdefault(row, Spread()).add(ms(percentile(values, 95)))
                print(f"{engine} repeat {repeat + 1}: " + ", ".join(
                    f"{row} p50 {ms(percentile(values, 50)):.1f} ms"
                    for row, values in seconds.items()), file=sys.stderr, flush=True)
        finally:
            client.close()
    return figures


def measure(options: Any) -> Report:
    sizes = SMOKE if options.smoke else FULL
    engines = chosen_engines(options)
    report = Report("Tags: GET /jobs?tag= at a million jobs", "python bench/tags.py",
                    options.smoke, options.repeats)
    load = os.getloadavg()
    with scratch_directory("queuelog-bench-tags-") as directory:
        results = {engine: measure_engine(engine, directory, sizes, options.repeats)
                   for engine in engines}
    for engine, figures in results.items():
        jobs_stored, tag_rows = figures.stored
        table = Table(
            f"{engine}: one admin client, {sizes.requests} requests per page and repeat, in "
            f"turns; {jobs_stored:,} jobs ({sizes.pending:,} of them pending, the newest), "
            f"{tag_rows:,} job_tags rows (ms; median [min-max] over repeats)",
            ["request", "jobs shown", "p50", "p95", "target"])
        for row in figures.p50:
            if figures.tagged[row]:
                verdict = "met" if figures.p50[row].median <= TARGET_MS else "NOT met"
                goal = f"p50 ≤ {TARGET_MS:.0f} ms: {verdict}"
            else:
                goal = ""
            table.add(row, figures.shown[row], figures.p50[row].show(2),
                      figures.p95[row].show(2), goal)
        report.tables.append(table)
    for engine, figures in results.items():
        tagged = [row for row in figures.p50 if figures.tagged[row]]
        worst = max(tagged, key=lambda row: figures.p50[row].median)
        spread = figures.p50[worst]
        report.targets.append(Target(
            f"{engine}: GET /jobs?tag= p50, {figures.stored[0]:,} jobs stored, the slowest "
            f"of {len(tagged)} tagged pages ({worst})", f"≤ {TARGET_MS:.0f} ms",
            spread.show(2, " ms"), spread.median <= TARGET_MS))
    report.notes += [
        load_note(load),
        "A tagged listing walks the tag's entries of ix_job_tags_tag_job_id (tag, job_id) "
        "from the cursor in id order, each job then looked up by id; the other filters "
        "(status) are checked on the job row, so a filter the tag's older jobs fail (the "
        "pending ones are the newest) walks past them.",
        "The tags were inserted by SQL, one statement per kind of tag, as the enqueue writes "
        "them (a row per job and tag); the pending jobs went through JobService.",
    ]
    return report


def main(argv: list[str] | None = None) -> None:
    started = time.monotonic()
    options = parse_options((__doc__ or "").splitlines()[0], argv,
                            add_arguments=engines_option)
    finish(measure(options), options, started)


if __name__ == "__main__":
    main()
