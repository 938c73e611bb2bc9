"""Failure groups (docs/API.md, GET /failures): GET /failures and a group's page with a million
stored jobs, beside the same groups over a small store.

The store (setup, not timed), on types email, report, billing and thumbnail:
- COMPLETED completed jobs with their attempts and events, inserted by SQL
  (bench/retention.py's insert_finished);
- SQL_FAILED jobs that failed for good after two failed attempts and SQL_RETRIED that
  failed once and then completed, inserted by SQL with what the recorder writes: each failed
  attempt's error (redacted as stored), its fingerprint (app.core.fingerprint, the
  recorder's own function), its end spread over the last 72 hours; and the failure_groups
  rows those attempts make (count: failed attempts; jobs_failed: jobs that ended failed with
  it; sample: the newest error; first and last seen). Their events are left out (nothing
  here reads them);
- REAL_FAILED more jobs enqueued, claimed and failed through JobService (the real failing
  path: the recorder's upsert adds them to the same groups, seen now).
The errors come from GROUPS templates (an exception and what failed), each with its numbers,
addresses and ids varying: GROUPS fingerprints, one type each, their sizes falling off as
1/rank (the largest about a sixth of the failures, the smallest a few dozen), about 50,000
failed attempts in all.

The baseline: the same failures over a small store (SMALL_COMPLETED completed jobs instead of
the million's), so that what the million costs shows beside what the groups cost.

One admin client (bearer token, one keep-alive http.client connection) asks, in turns,
GET /failures (unfiltered, ?type=, ?since= an hour ago) and GET /failures/<type>/<fp> (the
largest group and a small one) of each store's gunicorn server (the shipped
gunicorn.conf.py). Timed on the client over loopback: an upper bound of server time.

    PYTHONPATH=. python bench/failures.py [--smoke] [--repeats N] [--engines sqlite,postgresql]

With QUEUELOG_BENCH_POSTGRES_URL set to a PostgreSQL server URL, it is measured on
PostgreSQL as well, in databases of its own.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/failures.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.data import (
    POSTGRES_VARIABLE,
    chosen_engines,
    create_keys,
    engines_option,
    migrated_database,
    postgres_database,
    scratch_directory,
)
from bench.load import Client
from bench.report import Report, Table, Target, finish, load_note, parse_options
from bench.retention import insert_finished
from bench.servers import queuelog_server
from bench.stats import Spread, ms, percentile

TYPES = ("email", "report", "billing", "thumbnail")
FAILURE_TYPES = ",".join(TYPES)
TARGET_MS = 50.0
GROUPS = 200
HOUR_US = 3_600_000_000
SPREAD_US = 72 * HOUR_US  # the SQL failures' ends: over the last three days
EXCEPTIONS = ("TimeoutError", "ConnectionRefusedError", "SMTPRecipientsRefused", "KeyError",
              "ValueError", "PermissionError", "JSONDecodeError", "OperationalError",
              "HTTPError", "MemoryError")
ACTIONS = ("sending mail", "rendering template", "fetching invoice", "resizing image",
           "uploading to bucket", "reading config", "charging card", "refreshing token",
           "parsing webhook", "writing report", "querying ledger", "resolving host",
           "decoding payload", "validating address", "loading fonts", "signing request",
           "posting to chat", "exporting csv", "compressing archive", "calling geocoder")


@dataclass(frozen=True)
class Sizes:
    completed: int
    small_completed: int
    sql_failed: int  # jobs failed for good after two failed attempts
    sql_retried: int  # jobs failed once, then completed
    real_failed: int  # jobs failed once through JobService, for good
    requests: int  # per query and repeat


FULL = Sizes(completed=969_500, small_completed=2_000, sql_failed=20_000, sql_retried=9_500,
             real_failed=1_000, requests=100)
SMOKE = Sizes(completed=2_000, small_completed=200, sql_failed=300, sql_retried=100,
              real_failed=40, requests=5)


def template(index: int) -> tuple[str, str]:
    """The type and the error template of group `index`."""
    exception = EXCEPTIONS[index % len(EXCEPTIONS)]
    action = ACTIONS[index // len(EXCEPTIONS)]
    return TYPES[index % len(TYPES)], f"{exception} while {action}: request {{n}} to " \
        "10.0.{a}.{b}:5432 failed after {ms} ms (job{n}, attempt {k})"


def error_of(index: int, rng: random.Random, attempt: int) -> str:
    _type, text = template(index)
    # 5+ digits: a shorter id glued into a word (job123) is a name to the fingerprint.
    return text.format(n=rng.randrange(10**4, 10**6), a=rng.randrange(256), b=rng.randrange(256),
                       ms=rng.randrange(100, 60_000), k=attempt)


class GroupPicker:
    """Group indexes drawn with weights 1/rank."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.weights = [1 / (rank + 1) for rank in range(GROUPS)]

    def pick(self) -> int:
        return self.rng.choices(range(GROUPS), self.weights)[0]


def insert_failures(url: str, sizes: Sizes, seed: int = 11) -> None:
    """The SQL failures: jobs, attempts with their fingerprints, and their groups' rows."""
    from sqlalchemy import create_engine, insert, select

    from app.core.fingerprint import error_fingerprint
    from app.core.limits import FAILURE_SAMPLE_CHARS
    from app.core.redaction import redact_error
    from app.storage.schema import failure_groups, job_attempts, jobs

    rng = random.Random(seed)
    picker = GroupPicker(rng)
    now = time.time_ns() // 1000
    job_rows: list[dict[str, Any]] = []
    attempts_of: list[list[dict[str, Any]]] = []  # attempts_of[i]: job i's attempts
    for i in range(sizes.sql_failed + sizes.sql_retried):
        failed = i < sizes.sql_failed
        index = picker.pick()
        job_type, _ = template(index)
        first_end = now - rng.randrange(SPREAD_US)
        ends = [first_end, min(now - 1, first_end + rng.randrange(1, 600_000_000))]
        errors = [redact_error(error_of(index, rng, k + 1)) for k in range(2)]
        attempts: list[dict[str, Any]] = [
            {"number": 1, "worker_id": "worker-0", "claimed_at": ends[0] - 2_000_000,
             "ended_at": ends[0], "outcome": "failed", "error": errors[0],
             "fingerprint": error_fingerprint(errors[0])},
            {"number": 2, "worker_id": "worker-0", "claimed_at": ends[1] - 2_000_000,
             "ended_at": ends[1], "outcome": "failed" if failed else "completed",
             "error": errors[1] if failed else None,
             "fingerprint": error_fingerprint(errors[1]) if failed else None}]
        attempts_of.append(attempts)
        job_rows.append({
            "type": job_type, "payload": '{"to":"user@example.com"}', "priority": 10,
            "status": "failed" if failed else "completed", "retry_count": 1,
            "max_retries": 1 if failed else 3, "producer": "producer-0",
            "run_at": ends[0] + 1_000_000, "claimed_at": ends[1] - 2_000_000,
            "worker_id": "worker-0", "lease_token": f"{i:032x}.{i}",
            "result": None if failed else '{"message_id":"0123456789abcdef"}',
            "error": errors[1] if failed else None, "created_at": ends[0] - 3_000_000,
            "updated_at": ends[1]})
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for job, attempts in zip(job_rows, attempts_of, strict=True):
        for attempt in attempts:
            if attempt["fingerprint"] is None:
                continue
            key = (job["type"], attempt["fingerprint"])
            group = groups.setdefault(key, {
                "type": key[0], "fingerprint": key[1], "count": 0, "jobs_failed": 0,
                "first_seen": attempt["ended_at"], "last_seen": 0, "sample": ""})
            group["count"] += 1
            group["first_seen"] = min(group["first_seen"], attempt["ended_at"])
            if attempt["ended_at"] >= group["last_seen"]:
                group["last_seen"] = attempt["ended_at"]
                group["sample"] = attempt["error"][:FAILURE_SAMPLE_CHARS.max]
            if job["status"] == "failed" and attempt["number"] == 2:
                group["jobs_failed"] += 1
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            last = conn.execute(select(jobs.c.id).order_by(jobs.c.id.desc()).limit(1)
                                ).scalar() or 0
            for start in range(0, len(job_rows), 5000):
                conn.execute(insert(jobs), job_rows[start:start + 5000])
            ids = list(conn.execute(select(jobs.c.id).where(jobs.c.id > last)
                                    .order_by(jobs.c.id)).scalars())
            rows = [{**attempt, "job_id": job_id}
                    for job_id, attempts in zip(ids, attempts_of, strict=True)
                    for attempt in attempts]
            for start in range(0, len(rows), 10_000):
                conn.execute(insert(job_attempts), rows[start:start + 10_000])
            conn.execute(insert(failure_groups), list(groups.values()))
        if not url.startswith("sqlite"):
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.exec_driver_sql("VACUUM ANALYZE")
    finally:
        engine.dispose()


def fail_for_real(url: str, count: int, seed: int = 13) -> None:
    """`count` jobs enqueued, claimed and failed (no retries) through JobService."""
    from app import create_app
    from app.core.callers import Role

    rng = random.Random(seed)
    picker = GroupPicker(rng)
    app = create_app({"DATABASE_URL": url, "JOB_TYPES": FAILURE_TYPES})
    services = app.extensions["queuelog"]
    try:
        producer = services.keys.caller_for_token(services.keys.create_key("p", Role.PRODUCER))
        worker = services.keys.caller_for_token(services.keys.create_key("w", Role.WORKER))
        chosen = [picker.pick() for _ in range(count)]
        for start in range(0, count, 500):
            part = chosen[start:start + 500]
            services.jobs.enqueue_many(producer, [
                {"type": template(index)[0], "payload": {"n": n}, "priority": None,
                 "max_retries": 0} for n, index in enumerate(part)])
        errors: dict[str, list[str]] = {}
        for index in chosen:
            errors.setdefault(template(index)[0], []).append(error_of(index, rng, 1))
        for job_type, texts in errors.items():
            for text in texts:
                [claimed] = services.jobs.claim(worker, types=[job_type])
                services.jobs.fail(worker, claimed.job.id, lease_token=claimed.lease_token,
                                   error=text, retry_in_seconds=None)
    finally:
        services.db.engine.dispose()


@contextlib.contextmanager
def built_store(engine: str, directory: str, name: str, completed: int,
                sizes: Sizes) -> Iterator[tuple[str, str]]:
    """(url, admin token) of a store: `completed` completed jobs and the failures."""
    with contextlib.ExitStack() as stack:
        if engine == "PostgreSQL":
            url = stack.enter_context(postgres_database(os.environ[POSTGRES_VARIABLE]))
        else:
            url = migrated_database(directory, f"{name}.sqlite3")
        began = time.monotonic()
        tokens = create_keys(url, {"admin-0": "admin"})
        insert_finished(url, completed, TYPES)
        insert_failures(url, sizes)
        fail_for_real(url, sizes.real_failed)
        print(f"{engine} {name}: store built in {time.monotonic() - began:.1f} s",
              file=sys.stderr, flush=True)
        yield url, tokens["admin-0"]


def stored_groups(url: str) -> tuple[int, int, int, list[tuple[str, str, int]]]:
    """(jobs, failed attempts, groups, [(type, fingerprint, count)] largest first)."""
    from sqlalchemy import create_engine, func, select

    from app.storage.schema import failure_groups, job_attempts, jobs

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            job_count = conn.execute(select(func.count()).select_from(jobs)).scalar_one()
            failed = conn.execute(select(func.count()).select_from(job_attempts).where(
                job_attempts.c.fingerprint.is_not(None))).scalar_one()
            rows = conn.execute(select(failure_groups.c.type, failure_groups.c.fingerprint,
                                       failure_groups.c["count"])
                                .order_by(failure_groups.c["count"].desc())).all()
    finally:
        engine.dispose()
    return job_count, failed, len(rows), [tuple(row) for row in rows]


def queries(groups: list[tuple[str, str, int]]) -> list[tuple[str, str]]:
    """(label, path) of each request timed."""
    from app.core.clock import to_rfc3339

    since = to_rfc3339(time.time_ns() // 1000 - HOUR_US) or ""
    largest, small = groups[0], groups[len(groups) * 3 // 4]
    return [
        ("GET /failures", "/failures"),
        ("GET /failures?type=billing", "/failures?type=billing"),
        ("GET /failures?since=(an hour ago)",
         "/failures?" + urllib.parse.urlencode({"since": since})),
        (f"GET /failures/<type>/<fp>, largest group ({largest[2]:,} failed attempts)",
         f"/failures/{largest[0]}/{largest[1]}"),
        (f"GET /failures/<type>/<fp>, a small group ({small[2]:,})",
         f"/failures/{small[0]}/{small[1]}"),
    ]


LIST_QUERIES = 3  # the first three are GET /failures itself


@dataclass
class Figures:
    p50: dict[tuple[str, int], Spread]  # (store, query index)
    p99: dict[tuple[str, int], Spread]
    labels: list[str]
    stored: dict[str, tuple[int, int, int]]


STORES = ("million", "small")


def measure_engine(engine: str, directory: str, sizes: Sizes, repeats: int) -> Figures:
    with built_store(engine, directory, "million", sizes.completed, sizes) as (url, token), \
            built_store(engine, directory, "small", sizes.small_completed, sizes) as (
                small_url, small_token), \
            queuelog_server(directory, url, QUEUELOG_JOB_TYPES=FAILURE_TYPES) as server, \
            queuelog_server(directory, small_url, QUEUELOG_JOB_TYPES=FAILURE_TYPES) as small:
        jobs_stored, failed, count, groups = stored_groups(url)
        small_stored = stored_groups(small_url)
        timed = queries(groups)
        figures = Figures({}, {}, [label for label, _ in timed],
                          {"million": (jobs_stored, failed, count),
                           "small": small_stored[:3]})
        clients = {"million": Client(server.port, token),
                   "small": Client(small.port, small_token)}
        try:
            for store in STORES:  # each query once, before the clock starts
                for _label, path in timed:
                    clients[store].call("GET", path, expect=(200,))
            for repeat in range(repeats):
                seconds: dict[tuple[str, int], list[float]] = {}
                for turn in range(sizes.requests):
                    order = STORES if (turn + repeat) % 2 == 0 else STORES[::-1]
                    for store in order:  # in turns: the machine's load falls on both
                        for i, (_label, path) in enumerate(timed):
                            began = time.perf_counter()
                            clients[store].call("GET", path, expect=(200,))
                            seconds.setdefault((store, i), []).append(
                                time.perf_counter() - began)
                for key, values in seconds.items():
                    figures.p50.setdefault(key, Spread()).add(ms(percentile(values, 50)))
                    figures.p99.setdefault(key, Spread()).add(ms(percentile(values, 99)))
                print(f"{engine} repeat {repeat + 1}: GET /failures p50 "
                      f"{ms(percentile(seconds[('million', 0)], 50)):.2f} ms (million), "
                      f"{ms(percentile(seconds[('small', 0)], 50)):.2f} ms (small)",
                      file=sys.stderr, flush=True)
        finally:
            for client in clients.values():
                client.close()
    return figures


def measure(options: Any) -> Report:
    sizes = SMOKE if options.smoke else FULL
    engines = chosen_engines(options)
    report = Report("Failure groups: GET /failures with a million stored jobs",
                    "python bench/failures.py", options.smoke, options.repeats)
    load = os.getloadavg()
    with scratch_directory("queuelog-bench-failures-") as directory:
        results = {engine: measure_engine(engine, directory, sizes, options.repeats)
                   for engine in engines}
    for engine, figures in results.items():
        million, small = figures.stored["million"], figures.stored["small"]
        table = Table(
            f"{engine}: one admin client, {sizes.requests} requests per query, store and "
            f"repeat, in turns; million store: {million[0]:,} jobs, {million[1]:,} failed "
            f"attempts in {million[2]} groups; small store (baseline): {small[0]:,} jobs, "
            "the same failures (ms; median [min-max] over repeats)",
            ["request", "million p50", "million p99", "small p50", "small p99",
             "million / small p50"])
        for i, label in enumerate(figures.labels):
            ratio = figures.p50[("million", i)].median / figures.p50[("small", i)].median
            table.add(label, figures.p50[("million", i)].show(2),
                      figures.p99[("million", i)].show(2), figures.p50[("small", i)].show(2),
                      figures.p99[("small", i)].show(2), f"{ratio:.2f}")
        report.tables.append(table)
    for engine, figures in results.items():
        jobs_stored = figures.stored["million"][0]
        plain = figures.p50[("million", 0)]
        report.targets.append(Target(f"{engine}: GET /failures p50, {jobs_stored:,} jobs stored",
                                     f"≤ {TARGET_MS:.0f} ms", plain.show(2, " ms"),
                                     plain.median <= TARGET_MS))
        worst = max(range(1, LIST_QUERIES), key=lambda i: figures.p50[("million", i)].median)
        spread = figures.p50[("million", worst)]
        report.targets.append(Target(
            f"{engine}: GET /failures filtered, p50 of the slower "
            f"({figures.labels[worst].removeprefix('GET /failures')})",
            f"≤ {TARGET_MS:.0f} ms", spread.show(2, " ms"), spread.median <= TARGET_MS))
    report.notes += [
        load_note(load),
        "GET /failures reads failure_groups alone (one row per type and fingerprint, kept "
        "by the failing transactions): its time does not grow with the jobs stored. A "
        "group's page also counts its failed attempts per hour over the last day and finds "
        "its newest jobs, through job_attempts' partial index on (fingerprint, ended_at) "
        "joined to jobs: it grows with the group's attempts, not with the store.",
        "Part of the failures went through the real failing path (JobService.fail, whose "
        "recorder upserts the groups); the rest were inserted by SQL as the recorder writes "
        "them (see the script's docstring).",
    ]
    return report


def main(argv: list[str] | None = None) -> None:
    started = time.monotonic()

    options = parse_options((__doc__ or "").splitlines()[0], argv,
                            add_arguments=engines_option)
    finish(measure(options), options, started)


if __name__ == "__main__":
    main()
