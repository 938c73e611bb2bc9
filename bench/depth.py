"""Depth: the latency of a claim (JobRepository.claim_next_jobs in a write transaction through
Database.run_write) with 1k, 100k, 1M and 10M claimable jobs, and with 1M finished jobs stored
beside 1k claimable ones; the targets compare 10M with 1k, as stored and with the stored types
aging (docs/FLOW-CONTROL.md, "Priority aging": the claim then also reads each level of those
types as a range of their claim-order index). The claim reads a partial index of the pending
rows in claim order, so its cost should not grow with the table. Informational rows
show what the index does not cover: a claim restricted to one type (`types`) among many pending
jobs of another, and the peek a long-polling claim repeats every 50 ms.

    PYTHONPATH=. python bench/depth.py [--smoke] [--repeats N]
"""

from __future__ import annotations

import random
import secrets
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/depth.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.jobs.sql.repository import JobRepository
from app.storage.engine import Database, make_engine
from app.storage.schema import jobs
from bench.data import migrated_database, scratch_directory
from bench.report import Report, Table, Target, run_script
from bench.stats import Spread, percentile


@dataclass(frozen=True)
class Store:
    """What a database holds: pending jobs (every `every`-th of type 'report', the rest
    'email'; every=0: none of type 'report') and finished jobs stored beside them."""

    pending: int
    finished: int = 0
    every: int = 0


@dataclass(frozen=True)
class Case:
    label: str
    store: Store
    types: tuple[str, ...] | None = None  # the claim's `types`; None: any type
    peek: bool = False  # time has_claimable_work (a long poll's peek) instead of a claim
    versus: str | None = None  # the row this one's ratio is taken against
    target: str = ""  # the target this row is one of two of (the 1k and the 10M rows)
    aging: bool = False  # the stored type ages (docs/FLOW-CONTROL.md, "Priority aging")


def cases(smoke: bool) -> list[Case]:
    small, large = (100, 5_000) if smoke else (1_000, 1_000_000)
    middle = 1_000 if smoke else 100_000
    # The target's deep store: 10M claimable jobs.
    deepest = 20_000 if smoke else 10_000_000
    name = {100: "100", 1_000: "1k", 5_000: "5k", 20_000: "20k", 100_000: "100k",
            1_000_000: "1M", 10_000_000: "10M"}
    base = f"{name[small]} claimable"
    typed_base = f"{name[small]} claimable, all 'report'; claim types=[report]"
    peek_base = f"{name[small]} claimable, none 'report'; peek types=[report]"
    aged_base = f"{base}, aging on"
    return [
        Case(base, Store(small), versus=base, target=PLAIN),
        Case(f"{name[middle]} claimable", Store(middle), versus=base),
        Case(f"{name[large]} claimable", Store(large), versus=base),
        Case(f"{name[deepest]} claimable", Store(deepest), versus=base, target=PLAIN),
        # The same stores, their type aging (one level a minute: every job long risen).
        Case(aged_base, Store(small), versus=aged_base, target=AGING, aging=True),
        Case(f"{name[deepest]} claimable, aging on", Store(deepest), versus=aged_base,
             target=AGING, aging=True),
        Case(f"{name[large]} finished + {name[small]} claimable", Store(small, large),
             versus=base),
        Case(typed_base, Store(small, every=1), types=("report",), versus=typed_base),
        # As many 'report' jobs among the large store as the small one holds.
        Case(f"{name[large]} claimable, 1 in {large // small:,} 'report'; claim "
             "types=[report]", Store(large, every=large // small), types=("report",),
             versus=typed_base),
        Case(peek_base, Store(small), types=("report",), peek=True, versus=peek_base),
        Case(f"{name[large]} claimable, none 'report'; peek types=[report]", Store(large),
             types=("report",), peek=True, versus=peek_base),
    ]


PLAIN, AGING = "claim", "claim with aging on"
AGING_US = {"email": 60 * 1_000_000, "report": 60 * 1_000_000}
FULL_CLAIMS, SMOKE_CLAIMS = 200, 20
# The cases take turns every TURN claims, so that the machine's changing load falls on all.
TURN = 10
TARGET_FACTOR = 1.5
COLUMNS = [column.name for column in jobs.c if column.name != "id"]
LEASE_US = 300 * 1_000_000


def rows(count: int, status: str, first_us: int, seed: int, every: int = 0) -> Any:
    """`count` jobs as the API would have stored them, oldest first, priorities mixed."""
    rng = random.Random(seed)
    finished = status != "pending"
    for i in range(count):
        at = first_us + i
        job_type = "report" if every and i % every == 0 else "email"
        yield (job_type, f'{{"to":"user-{i}@example.com","template":"welcome-v2"}}',
               rng.choice((0, 10, 10, 10, 20, 30)), status, 0, 3, f"producer-{i % 4}", None,
               None, at, at + 1000 if finished else None, "worker-0" if finished else None,
               None, None, '{"message_id":"0123456789abcdef"}' if finished else None, None,
               at, at + 2000 if finished else at,
               # Columns appended since (unique jobs' and any later ones) are NULL here.
               *[None] * (len(COLUMNS) - 18))


def build(directory: str, store: Store) -> str:
    """A migrated database holding the store's jobs, inserted directly (setup, not timed)."""
    url = migrated_database(
        directory, f"depth-{store.pending}-{store.finished}-{store.every}.sqlite3")
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
    if store.finished:
        conn.executemany(insert, rows(store.finished, "completed", first, seed=1))
    conn.executemany(insert, rows(store.pending, "pending", first + store.finished + 1,
                                  seed=2, every=store.every))
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    print(f"built {store} in {time.monotonic() - began:.1f} s", file=sys.stderr, flush=True)
    return url


class Runner:
    """One case's engine (the app's: WAL, synchronous=FULL) and its timings."""

    def __init__(self, case: Case, url: str) -> None:
        self.case = case
        self.db = Database(make_engine(url))
        self.statement: list[float] = []
        self.transaction: list[float] = []

    def step(self) -> None:
        if self.case.peek:
            self._peek()
        else:
            self._claim()

    def _claim(self) -> None:
        inside: list[float] = []

        def claim_in(conn: Any) -> Any:
            now = time.time_ns() // 1000
            began = time.perf_counter()
            claimed = JobRepository(conn).claim_next_jobs(
                now_us=now, worker="worker-1", lease_expires_at=now + LEASE_US,
                nonce=secrets.token_hex(16), limit=1, types=self.case.types,
                aging_us=AGING_US if self.case.aging else None).jobs
            inside.append(time.perf_counter() - began)
            return claimed

        began = time.perf_counter()
        if not self.db.run_write(claim_in):
            raise RuntimeError(f"{self.case.label}: nothing was claimable")
        self.transaction.append(time.perf_counter() - began)
        self.statement.extend(inside)

    def _peek(self) -> None:
        began = time.perf_counter()
        with self.db.read() as conn:
            inner = time.perf_counter()
            found = JobRepository(conn).has_claimable_work(time.time_ns() // 1000,
                                                           self.case.types)
            self.statement.append(time.perf_counter() - inner)
        self.transaction.append(time.perf_counter() - began)
        if found:
            raise RuntimeError(f"{self.case.label}: the peek found work it should not")

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
    chosen = cases(options.smoke)
    claims = SMOKE_CLAIMS if options.smoke else FULL_CLAIMS
    report = Report("Depth: claim latency against the number of stored jobs",
                    "python bench/depth.py", options.smoke, options.repeats)
    figures = {(case.label, figure): Spread() for case in chosen
               for figure in ("statement", "statement_p99", "transaction", "transaction_p99")}
    build_seconds: dict[Store, float] = {}
    with scratch_directory("queuelog-bench-depth-") as directory:
        urls: dict[Store, str] = {}
        for case in chosen:
            if case.store not in urls:
                began = time.monotonic()
                urls[case.store] = build(directory, case.store)
                build_seconds[case.store] = time.monotonic() - began
        runners = [Runner(case, urls[case.store]) for case in chosen]
        try:
            for runner in runners:  # warm each engine and page cache alike
                runner.step()
                runner.put_back()
            for repeat in range(options.repeats):
                for runner in runners:
                    runner.statement.clear()
                    runner.transaction.clear()
                for turn in range(0, claims, TURN):
                    shift = (repeat + turn // TURN) % len(runners)
                    for runner in runners[shift:] + runners[:shift]:
                        for _ in range(min(TURN, claims - turn)):
                            runner.step()
                for runner in runners:
                    label = runner.case.label
                    figures[(label, "statement")].add(
                        percentile(runner.statement, 50) * 1e6)
                    figures[(label, "statement_p99")].add(
                        percentile(runner.statement, 99) * 1e6)
                    figures[(label, "transaction")].add(
                        percentile(runner.transaction, 50) * 1e6)
                    figures[(label, "transaction_p99")].add(
                        percentile(runner.transaction, 99) * 1e6)
                    runner.put_back()
                print(f"repeat {repeat + 1}: statement p50 " + ", ".join(
                    f"{r.case.label} {figures[(r.case.label, 'statement')].values[-1]:,.0f} µs"
                    for r in runners), file=sys.stderr, flush=True)
        finally:
            for runner in runners:
                runner.close()

    def ratio(case: Case, figure: str) -> float:
        return (figures[(case.label, figure)].median
                / figures[(case.versus or case.label, figure)].median)

    table = Table(f"Claim latency, µs ({claims} per case and repeat; median [min-max] over "
                  "repeats; ratios against the first row of the same kind)",
                  ["jobs stored; what is timed", "statement p50", "statement p99", "ratio",
                   "transaction p50", "transaction p99", "ratio", "build s"])
    for case in chosen:
        table.add(case.label if case.types or case.peek else f"{case.label}; claim (any type)",
                  figures[(case.label, "statement")].show(),
                  figures[(case.label, "statement_p99")].show(),
                  f"{ratio(case, 'statement'):.2f}", figures[(case.label, "transaction")].show(),
                  figures[(case.label, "transaction_p99")].show(),
                  f"{ratio(case, 'transaction'):.2f}", f"{build_seconds[case.store]:.0f}")
    report.tables.append(table)
    for target in (PLAIN, AGING):
        small, large = [case for case in chosen if case.target == target]
        for figure, what in (("transaction", f"{target}: transaction p50"),
                             ("statement", f"{target}: statement p50 (no commit)")):
            factor = ratio(large, figure)
            report.targets.append(Target(
                f"{what}, {large.label} / {small.label}", f"≤ {TARGET_FACTOR}x",
                f"{factor:.2f}x ({figures[(large.label, figure)].median:,.0f} / "
                f"{figures[(small.label, figure)].median:,.0f} µs)", factor <= TARGET_FACTOR))
    plain_deep, aged_deep = [case for case in chosen if case.target and case.store.pending ==
                             max(c.store.pending for c in chosen)]
    on_off = (figures[(aged_deep.label, "transaction")].median
              / figures[(plain_deep.label, "transaction")].median)
    report.notes.append(
        f"Aging on / off at {plain_deep.label}: claim transaction p50 {on_off:.2f} "
        f"({figures[(aged_deep.label, 'transaction')].median:,.0f} / "
        f"{figures[(plain_deep.label, 'transaction')].median:,.0f} µs): the aged claim reads "
        "each level of the aging types as a range of the claim-order index beside its usual "
        "candidates, and sorts the few it found.")
    report.notes += [
        "The jobs are inserted directly into the migrated schema with sqlite3's executemany "
        "(synchronous=OFF for the bulk load only), priorities mixed low…critical, oldest "
        "first; the claims then run through the app's engine (WAL, synchronous=FULL) and "
        "Database.run_write, one job per claim, as a lone POST /jobs/claim would.",
        "statement: JobRepository.claim_next_jobs alone, inside the transaction. "
        "transaction: BEGIN IMMEDIATE, the claim and the COMMIT (its fsync included). For "
        "the peek rows: JobRepository.has_claimable_work, and its read transaction.",
        "Typed rows (informational, no target): the claim asks for types=['report'], and "
        "reads that type's part of the per-type claim-order index, so neither a claim for a "
        "rare type nor a long-polling claim's peek for a type with nothing pending walks "
        "past the other types' pending jobs.",
        f"The cases take turns every {TURN} claims; after each repeat the claimed jobs are "
        "made pending again (not timed), so each repeat starts from the same count.",
        "Only the repository's claim is timed: the service's expired-lease rescue, which "
        "reads a partial index of the running rows, is not part of these figures.",
    ]
    return report


def main(argv: list[str] | None = None) -> None:
    run_script(measure, __doc__, argv)


if __name__ == "__main__":
    main()
