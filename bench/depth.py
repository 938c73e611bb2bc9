"""Depth: the latency of a claim (JobRepository.claim_next_jobs in a write transaction through
Database.run_write) with 1k, 100k and 1M claimable jobs, and with 1M finished jobs stored beside
1k claimable ones. The claim reads a partial index of the pending rows in claim order, so its
cost should not grow with the table.

    PYTHONPATH=. python bench/depth.py [--smoke] [--repeats N]
"""

from __future__ import annotations

import random
import secrets
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/depth.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.db import Database, jobs, make_engine
from app.jobs.repository import JobRepository
from bench import common
from bench.common import Report, Spread, Table, Target

# (label, claimable jobs, finished jobs stored beside them)
FULL_CASES = [("1k claimable", 1_000, 0), ("100k claimable", 100_000, 0),
              ("1M claimable", 1_000_000, 0), ("1M finished + 1k claimable", 1_000, 1_000_000)]
SMOKE_CASES = [("100 claimable", 100, 0), ("1k claimable", 1_000, 0),
               ("5k claimable", 5_000, 0), ("5k finished + 100 claimable", 100, 5_000)]
FULL_CLAIMS, SMOKE_CLAIMS = 200, 20
# The cases take turns every TURN claims, so that the machine's changing load falls on all.
TURN = 10
TARGET_FACTOR = 1.5
COLUMNS = [column.name for column in jobs.c if column.name != "id"]
LEASE_US = 300 * 1_000_000


def rows(count: int, status: str, first_us: int, seed: int) -> Any:
    """`count` jobs as the API would have stored them, oldest first, priorities mixed."""
    rng = random.Random(seed)
    finished = status != "pending"
    for i in range(count):
        at = first_us + i
        yield ("email", f'{{"to":"user-{i}@example.com","template":"welcome-v2"}}',
               rng.choice((0, 10, 10, 10, 20, 30)), status, 0, 3, f"producer-{i % 4}", None,
               None, at, at + 1000 if finished else None, "worker-0" if finished else None,
               None, None, '{"message_id":"0123456789abcdef"}' if finished else None, None,
               at, at + 2000 if finished else at)


def build(directory: str, label: str, claimable: int, finished: int) -> str:
    """A migrated database holding the case's jobs, inserted directly (setup, not timed)."""
    url = common.migrated_database(directory, f"depth-{claimable}-{finished}.sqlite3")
    conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")  # a bulk load; the measured claims use FULL
    placeholders = ", ".join("?" for _ in COLUMNS)
    # Only the schema's own column names are spliced in; the values are bound.
    insert = f"INSERT INTO jobs ({', '.join(COLUMNS)}) VALUES ({placeholders})"  # noqa: S608
    # Every stored job was created in the last day: the finished ones first.
    now = time.time_ns() // 1000
    first = now - 86_400 * 1_000_000
    began = time.monotonic()
    conn.execute("BEGIN")
    if finished:
        conn.executemany(insert, rows(finished, "completed", first, seed=1))
    conn.executemany(insert, rows(claimable, "pending", first + finished + 1, seed=2))
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    print(f"built {label} in {time.monotonic() - began:.1f} s", file=sys.stderr, flush=True)
    return url


class Case:
    def __init__(self, label: str, url: str) -> None:
        self.label = label
        self.db = Database(make_engine(url))  # the app's engine: WAL, synchronous=FULL
        self.statement: list[float] = []
        self.transaction: list[float] = []

    def claim(self) -> None:
        inside: list[float] = []

        def claim_in(conn: Any) -> Any:
            now = time.time_ns() // 1000
            began = time.perf_counter()
            claimed = JobRepository(conn).claim_next_jobs(
                now_us=now, worker="worker-1", lease_expires_at=now + LEASE_US,
                nonce=secrets.token_hex(16), limit=1, types=None)
            inside.append(time.perf_counter() - began)
            return claimed

        began = time.perf_counter()
        if not self.db.run_write(claim_in):
            raise RuntimeError(f"{self.label}: nothing was claimable")
        self.transaction.append(time.perf_counter() - began)
        self.statement.extend(inside)

    def put_back(self) -> None:
        """Make this repeat's claimed jobs pending again (not timed), so every repeat claims
        from the same number of jobs."""
        with self.db.write() as conn:
            conn.exec_driver_sql(
                "UPDATE jobs SET status = 'pending', claimed_at = NULL, worker_id = NULL, "
                "lease_expires_at = NULL, lease_token = NULL WHERE status = 'running'")

    def close(self) -> None:
        self.db.engine.dispose()


def measure(options: Any) -> Report:
    cases = SMOKE_CASES if options.smoke else FULL_CASES
    claims = SMOKE_CLAIMS if options.smoke else FULL_CLAIMS
    report = Report("Depth: claim latency against the number of stored jobs",
                    "python bench/depth.py", options.smoke, options.repeats)
    statement = {label: Spread() for label, _, _ in cases}
    transaction = {label: Spread() for label, _, _ in cases}
    statement_p99 = {label: Spread() for label, _, _ in cases}
    transaction_p99 = {label: Spread() for label, _, _ in cases}
    build_seconds = {}
    with common.scratch_directory("queuelog-bench-depth-") as directory:
        opened = []
        try:
            for label, claimable, finished in cases:
                began = time.monotonic()
                opened.append(Case(label, build(directory, label, claimable, finished)))
                build_seconds[label] = time.monotonic() - began
            for case in opened:  # warm each engine and page cache alike
                case.claim()
                case.put_back()
            for repeat in range(options.repeats):
                for case in opened:
                    case.statement.clear()
                    case.transaction.clear()
                for turn in range(0, claims, TURN):
                    shift = (repeat + turn // TURN) % len(opened)
                    for case in opened[shift:] + opened[:shift]:
                        for _ in range(min(TURN, claims - turn)):
                            case.claim()
                for case in opened:
                    statement[case.label].add(common.percentile(case.statement, 50) * 1e6)
                    statement_p99[case.label].add(common.percentile(case.statement, 99) * 1e6)
                    transaction[case.label].add(common.percentile(case.transaction, 50) * 1e6)
                    transaction_p99[case.label].add(
                        common.percentile(case.transaction, 99) * 1e6)
                    case.put_back()
                print(f"repeat {repeat + 1}: claim statement p50 "
                      + ", ".join(f"{c.label} {statement[c.label].values[-1]:,.0f} µs"
                                  for c in opened), file=sys.stderr, flush=True)
        finally:
            for case in opened:
                case.close()

    smallest = cases[0][0]
    largest = cases[2][0]
    table = Table(f"Claim latency, µs ({claims} claims per case and repeat; median [min-max] "
                  "over repeats)",
                  ["jobs stored", "statement p50", "statement p99", f"p50 / {smallest}",
                   "transaction p50", "transaction p99", f"p50 / {smallest}", "build s"])
    for label, _, _ in cases:
        table.add(label, statement[label].show(), statement_p99[label].show(),
                  f"{statement[label].median / statement[smallest].median:.2f}",
                  transaction[label].show(), transaction_p99[label].show(),
                  f"{transaction[label].median / transaction[smallest].median:.2f}",
                  f"{build_seconds[label]:.0f}")
    report.tables.append(table)
    statement_factor = statement[largest].median / statement[smallest].median
    transaction_factor = transaction[largest].median / transaction[smallest].median
    report.targets += [
        Target(f"claim transaction p50, {largest} / {smallest}", f"≤ {TARGET_FACTOR}x",
               f"{transaction_factor:.2f}x ({transaction[largest].median:,.0f} / "
               f"{transaction[smallest].median:,.0f} µs)", transaction_factor <= TARGET_FACTOR),
        Target(f"claim statement p50 (no commit), {largest} / {smallest}",
               f"≤ {TARGET_FACTOR}x",
               f"{statement_factor:.2f}x ({statement[largest].median:,.0f} / "
               f"{statement[smallest].median:,.0f} µs)", statement_factor <= TARGET_FACTOR),
    ]
    report.notes += [
        "The jobs are inserted directly into the migrated schema with sqlite3's executemany "
        "(synchronous=OFF for the bulk load only), priorities mixed low…critical; the claims "
        "then run through the app's engine (WAL, synchronous=FULL) and Database.run_write, "
        "one job per claim, as a lone POST /jobs/claim would.",
        "statement: JobRepository.claim_next_jobs alone, inside the transaction. "
        "transaction: BEGIN IMMEDIATE, the claim and the COMMIT (its fsync included).",
        f"The cases take turns every {TURN} claims; after each repeat the claimed jobs are "
        "made pending again (not timed), so each repeat starts from the same count.",
        "Only the repository's claim is timed: the service's expired-lease rescue, which "
        "reads a partial index of the running rows, is not part of these figures.",
    ]
    return report


def main(argv: list[str] | None = None) -> None:
    options = common.parse_options(__doc__.splitlines()[0], argv)
    started = time.monotonic()
    common.finish(measure(options), options, started)


if __name__ == "__main__":
    main()
