"""Fair share and ordered keys (docs/FLOW-CONTROL.md): what each costs the claim, beside the
same jobs without it, at 1,000 keys and with one key holding 1,000,000 jobs.

Measured at the service level, as bench/flow.py's claim-transaction row is: JobService in
this process, one thread, no HTTP, so that the figure is the claim's transaction (and the
complete's) and not the server around it. Each scenario gets three databases holding the
same jobs of one type, loaded by bulk SQL (INSERT ... SELECT over a generated series) in
the state the service leaves them, then:

- "plain": neither setting;
- "fairness on": PATCH fairness "key" through TypeService.update_type, which numbers the
  backlog's rounds per key in its transaction (timed: the one-time cost of turning it on);
- "ordering on": PATCH ordering "key" through TypeService.update_type, which gives each key
  its turn and holds the rest of its backlog waiting (timed likewise). Should that fail,
  the failure is printed and the backlog is held by SQL (key_turns and waiting rows as it
  would leave them), then the setting is PATCHed on the held backlog.

Each repeat makes CYCLES claim + complete cycles on each database, taking turns every TURN
cycles (in rotating order) so that the machine's changing load falls on all three. A cycle
is JobService.claim (one job, any type) then JobService.complete of the job claimed; both are
timed, apart. The fairness row compares the claim alone (a fair type's claim reads its
round-order index under flow control; the complete does nothing more). The ordering row
compares whole cycles: with ordering on only a key's turn job is claimable, so a key runs one
job at a time and what ordering costs is in the complete, which passes the key's turn and
releases its next job in the same transaction.

    PYTHONPATH=. python bench/keys.py [--smoke] [--repeats N] [--engines sqlite,postgresql]

With QUEUELOG_BENCH_POSTGRES_URL set to a PostgreSQL server URL, every row is measured on
PostgreSQL as well, in databases of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/keys.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import Connection, create_engine, text

from app.core.callers import Role
from bench.data import (
    JOB_TYPES,
    POSTGRES_VARIABLE,
    migrated_database,
    postgres_database,
    scratch_directory,
)
from bench.report import Report, Table, Target, finish, parse_options
from bench.stats import Spread, percentile

JOB_TYPE = "email"
PRIORITY = 10  # medium, as bench/data.py's job_body
TARGET_RATIO = 0.8
LABELS = ("plain", "fairness on", "ordering on")


@dataclass(frozen=True)
class Segment:
    """`count` jobs enqueued one after the other, job i of the segment with the key
    f"{prefix}{i % keys}"."""

    count: int
    prefix: str
    keys: int


@dataclass(frozen=True)
class Scenario:
    name: str
    segments: tuple[Segment, ...]


@dataclass(frozen=True)
class Sizes:
    scenarios: tuple[Scenario, ...]
    cycles: int  # per database and repeat
    turn: int


def _scenarios(keys: int, per_key: int, big: int, others: int,
               per_other: int) -> tuple[Scenario, ...]:
    return (
        Scenario(f"{keys:,} keys x {per_key} jobs (enqueued key by key in turn)",
                 (Segment(keys * per_key, "customer-", keys),)),
        Scenario(f"one key with {big:,} jobs enqueued first, then {others} keys x "
                 f"{per_other:,}",
                 (Segment(big, "big-", 1), Segment(others * per_other, "small-", others))),
    )


FULL = Sizes(_scenarios(1000, 50, 1_000_000, 9, 1000), cycles=2000, turn=10)
SMOKE = Sizes(_scenarios(10, 5, 200, 3, 20), cycles=20, turn=5)


# -- loading -------------------------------------------------------------------------------

def _series(dialect: str) -> tuple[str, str]:
    """(WITH clause, FROM clause) giving i = 0 .. :count - 1."""
    if dialect == "postgresql":
        return "", "generate_series(0, CAST(:count AS BIGINT) - 1) AS n(i)"
    return ("WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n "
            "WHERE i + 1 < :count) ", "n")


def load_jobs(url: str, scenario: Scenario, now_us: int) -> tuple[int, float]:
    """The scenario's jobs, pending and due, inserted directly (one statement per segment,
    one transaction): returns (jobs, seconds)."""
    engine = create_engine(url)
    try:
        with_clause, from_clause = _series(engine.dialect.name)
        # Columns appended since (uniqueness, schedules, rounds) stay NULL, as an enqueue
        # without them leaves them.
        insert = text(  # the clauses are this module's own
            "INSERT INTO jobs (type, payload, priority, status, retry_count, max_retries, "  # noqa: S608
            "producer, run_at, created_at, updated_at, concurrency_key) "
            f"{with_clause}"
            "SELECT :type, '{\"n\": ' || CAST(:first + i AS TEXT) || '}', :priority, "
            "'pending', 0, 3, 'producer-0', CAST(:at AS BIGINT) + i, "
            "CAST(:at AS BIGINT) + i, CAST(:at AS BIGINT) + i, "
            "CAST(:prefix AS TEXT) || CAST(i % CAST(:keys AS BIGINT) AS TEXT) "
            f"FROM {from_clause}")
        began = time.monotonic()
        total = 0
        # Created a day ago, one µs apart: due, and in the segments' order.
        at = now_us - 86_400_000_000
        with engine.connect() as conn:
            if engine.dialect.name == "sqlite":
                conn.exec_driver_sql("PRAGMA synchronous=OFF")  # a bulk load
                conn.commit()
            with conn.begin():
                for segment in scenario.segments:
                    conn.execute(insert, {"type": JOB_TYPE, "first": total, "at": at + total,
                                          "priority": PRIORITY, "count": segment.count,
                                          "prefix": segment.prefix, "keys": segment.keys})
                    total += segment.count
        seconds = time.monotonic() - began
        settle(url)
        return total, seconds
    finally:
        engine.dispose()


def settle(url: str) -> None:
    """What follows a change of many rows in service: SQLite's WAL checkpointed;
    PostgreSQL's tables vacuumed and analyzed, as autovacuum would within a minute of it.
    Without that, the statistics still say what the rows were before: after ordering is
    turned on, no row is waiting as far as the planner knows, and the complete's look-up of
    a key's next waiting job (a generic plan, once prepared) reads the type's waiting
    index, every waiting job of the type, instead of the key's."""
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                conn.exec_driver_sql("VACUUM ANALYZE jobs, key_turns")
            else:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        engine.dispose()


def hold_backlog_in_sql(conn: Connection, now_us: int) -> None:
    """What turning ordering on leaves (app/jobs/sql/key_repository.py, start_ordering, and
    Transition.HOLD): each key's turn is its oldest unfinished job, its other pending jobs
    wait. Only for a backlog update_type failed to hold."""
    conn.execute(text(
        "INSERT INTO key_turns (type, producer, concurrency_key, job_id, blocked, since) "
        "SELECT type, producer, concurrency_key, MIN(id), 0, :now FROM jobs "
        "WHERE type = :type AND concurrency_key IS NOT NULL "
        "AND status IN ('pending', 'running', 'waiting') "
        "GROUP BY type, producer, concurrency_key"),
        {"type": JOB_TYPE, "now": now_us})
    conn.execute(text(
        "UPDATE jobs SET status = 'waiting', updated_at = :now "
        "WHERE type = :type AND status = 'pending' AND concurrency_key IS NOT NULL "
        "AND id NOT IN (SELECT job_id FROM key_turns WHERE type = :type)"),
        {"type": JOB_TYPE, "now": now_us})


# -- one database ---------------------------------------------------------------------------

@dataclass
class Side:
    """One database and its services in this process."""

    label: str
    url: str
    jobs: int = 0
    load_seconds: float = 0.0
    setting_seconds: float | None = None
    setting_note: str = ""
    app: Any = None
    worker: Any = None
    claim_seconds: list[float] = field(default_factory=list)
    complete_seconds: list[float] = field(default_factory=list)
    keys_served: set[str | None] = field(default_factory=set)

    def open(self) -> None:
        from app import create_app

        self.app = create_app({"DATABASE_URL": self.url, "JOB_TYPES": JOB_TYPES})
        found = self.app.extensions["queuelog"]
        self.worker = found.keys.caller_for_token(found.keys.create_key("w", Role.WORKER))

    @property
    def services(self) -> Any:
        return self.app.extensions["queuelog"]

    def turn_on(self) -> None:
        """The side's setting, through the service, timed."""
        if self.label == "fairness on":
            began = time.monotonic()
            self.services.types.update_type(JOB_TYPE, {"fairness": "key"})
            self.setting_seconds = time.monotonic() - began
        elif self.label == "ordering on":
            began = time.monotonic()
            try:
                self.services.types.update_type(JOB_TYPE, {"ordering": "key"})
                self.setting_seconds = time.monotonic() - began
            except Exception as error:  # reported, then held by SQL
                failed_after = time.monotonic() - began
                first_line = str(error).strip().splitlines()[0][:160]
                self.setting_note = (f"update_type failed after {failed_after:.1f} s: "
                                     f"{type(error).__name__}: {first_line}")
                print(f"{self.label}: {self.setting_note}; holding the backlog by SQL",
                      file=sys.stderr, flush=True)
                began = time.monotonic()
                with self.services.db.engine.begin() as conn:
                    hold_backlog_in_sql(conn, self.services.clock.now_us())
                self.services.types.update_type(JOB_TYPE, {"ordering": "key"})
                self.setting_note += (f"; held by SQL instead, then PATCHed, in "
                                      f"{time.monotonic() - began:.1f} s")

    def cycle(self) -> None:
        jobs_service = self.services.jobs
        began = time.perf_counter()
        claimed = jobs_service.claim(self.worker)
        claimed_at = time.perf_counter()
        if not claimed:
            raise RuntimeError(f"{self.label}: nothing to claim")
        job = claimed[0].job
        jobs_service.complete(self.worker, job.id, lease_token=claimed[0].lease_token,
                              result=None)
        done = time.perf_counter()
        self.claim_seconds.append(claimed_at - began)
        self.complete_seconds.append(done - claimed_at)
        self.keys_served.add(job.concurrency_key)

    def check_state(self) -> str:
        """Pending and waiting jobs of the type now (a check that the setting took)."""
        with self.services.db.engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT status, COUNT(*), COUNT(fair_round) FROM jobs WHERE type = :type "
                "AND status IN ('pending', 'waiting') GROUP BY status"),
                {"type": JOB_TYPE}).all()
            turns = conn.execute(text("SELECT COUNT(*) FROM key_turns")).scalar()
        parts = [f"{status} {count:,} ({rounds:,} with a round)"
                 for status, count, rounds in rows]
        return ", ".join(parts) + f"; key_turns {turns:,}"

    def close(self) -> None:
        if self.app is not None:
            self.services.db.engine.dispose()


@contextlib.contextmanager
def fresh_database(engine: str, directory: str, name: str) -> Iterator[str]:
    if engine == "PostgreSQL":
        with postgres_database(os.environ[POSTGRES_VARIABLE]) as url:
            yield url
    else:
        yield migrated_database(directory, f"{name}.sqlite3")


# -- measuring -----------------------------------------------------------------------------

@dataclass
class Figures:
    """One scenario on one engine, per side: a Spread over repeats of each figure."""

    claims: dict[str, Spread] = field(default_factory=lambda: {k: Spread() for k in LABELS})
    cycles: dict[str, Spread] = field(default_factory=lambda: {k: Spread() for k in LABELS})
    claim_p50: dict[str, Spread] = field(default_factory=lambda: {k: Spread() for k in LABELS})
    claim_p99: dict[str, Spread] = field(default_factory=lambda: {k: Spread() for k in LABELS})
    complete_p50: dict[str, Spread] = field(
        default_factory=lambda: {k: Spread() for k in LABELS})
    keys_served: dict[str, Spread] = field(
        default_factory=lambda: {k: Spread() for k in LABELS})
    fair_claims: Spread = field(default_factory=Spread)
    fair_cycles: Spread = field(default_factory=Spread)
    ordered_claims: Spread = field(default_factory=Spread)
    ordered_cycles: Spread = field(default_factory=Spread)
    setup: list[tuple[str, str]] = field(default_factory=list)


def measure_scenario(engine: str, directory: str, scenario: Scenario, number: int,
                     sizes: Sizes, repeats: int) -> Figures:
    figures = Figures()
    with contextlib.ExitStack() as stack:
        sides = []
        for label in LABELS:
            url = stack.enter_context(fresh_database(
                engine, directory, f"s{number}-{label.replace(' ', '-')}"))
            side = Side(label, url)
            stack.callback(side.close)
            side.jobs, side.load_seconds = load_jobs(url, scenario, time.time_ns() // 1000)
            print(f"{engine}, {scenario.name}, {label}: loaded {side.jobs:,} jobs in "
                  f"{side.load_seconds:.1f} s", file=sys.stderr, flush=True)
            side.open()
            side.turn_on()
            settle(url)
            state = side.check_state()
            print(f"{engine}, {scenario.name}, {label}: "
                  + (f"setting on in {side.setting_seconds:.1f} s; "
                     if side.setting_seconds is not None else "")
                  + state, file=sys.stderr, flush=True)
            sides.append(side)
        total = sides[0].jobs
        figures.setup.append((f"bulk load of {total:,} jobs (SQL, per database)",
                              Spread([s.load_seconds for s in sides]).show(1, " s")))
        for side in sides[1:]:
            what = ("PATCH fairness on: update_type numbers the backlog's rounds"
                    if side.label == "fairness on" else
                    "PATCH ordering on: update_type gives each key its turn, holds the rest")
            figures.setup.append((what, side.setting_note or f"{side.setting_seconds:.1f} s"))
            figures.setup.append((f"{side.label}: the type's jobs after it",
                                  side.check_state()))

        for repeat in range(repeats):
            for side in sides:
                side.claim_seconds, side.complete_seconds = [], []
                side.keys_served = set()
            for turn in range(0, sizes.cycles, sizes.turn):
                shift = (turn // sizes.turn) % len(sides)
                for side in sides[shift:] + sides[:shift]:
                    for _ in range(min(sizes.turn, sizes.cycles - turn)):
                        side.cycle()
            claims, cycles = {}, {}
            for side in sides:
                claims[side.label] = len(side.claim_seconds) / sum(side.claim_seconds)
                cycles[side.label] = len(side.claim_seconds) / (
                    sum(side.claim_seconds) + sum(side.complete_seconds))
                figures.claims[side.label].add(claims[side.label])
                figures.cycles[side.label].add(cycles[side.label])
                figures.claim_p50[side.label].add(percentile(side.claim_seconds, 50) * 1e6)
                figures.claim_p99[side.label].add(percentile(side.claim_seconds, 99) * 1e6)
                figures.complete_p50[side.label].add(
                    percentile(side.complete_seconds, 50) * 1e6)
                figures.keys_served[side.label].add(len(side.keys_served))
            figures.fair_claims.add(claims["fairness on"] / claims["plain"])
            figures.fair_cycles.add(cycles["fairness on"] / cycles["plain"])
            figures.ordered_claims.add(claims["ordering on"] / claims["plain"])
            figures.ordered_cycles.add(cycles["ordering on"] / cycles["plain"])
            print(f"{engine}, {scenario.name}, repeat {repeat + 1}: " + ", ".join(
                f"{label} {claims[label]:,.0f} claims/s, {cycles[label]:,.0f} cycles/s"
                for label in LABELS), file=sys.stderr, flush=True)
    return figures


def measure(options: Any) -> Report:
    sizes = SMOKE if options.smoke else FULL
    engines = ["SQLite"] + (["PostgreSQL"] if os.environ.get(POSTGRES_VARIABLE) else [])
    if options.engines:
        engines = [e for e in engines if e.lower() in options.engines.lower().split(",")]
    report = Report("Fair share and ordered keys: claim cost", "python bench/keys.py",
                    options.smoke, options.repeats)
    load_before = os.getloadavg()
    results: dict[tuple[str, int], Figures] = {}
    with scratch_directory("queuelog-bench-keys-") as directory:
        for engine in engines:
            for number, scenario in enumerate(sizes.scenarios):
                results[(engine, number)] = measure_scenario(
                    engine, directory, scenario, number, sizes, options.repeats)
    load_after = os.getloadavg()

    for engine in engines:
        table = Table(
            f"Claim + complete one job at a time (JobService, one thread), {engine}, "
            f"{sizes.cycles:,} cycles per database and repeat, taking turns every "
            f"{sizes.turn} (median [min-max] over repeats)",
            ["jobs stored", "database", "claims/s", "claim p50 µs", "claim p99 µs",
             "complete p50 µs", "claim + complete cycles/s", "keys served per repeat"])
        for number, scenario in enumerate(sizes.scenarios):
            figures = results[(engine, number)]
            for label in LABELS:
                table.add(scenario.name, label, figures.claims[label].show(),
                          figures.claim_p50[label].show(), figures.claim_p99[label].show(),
                          figures.complete_p50[label].show(), figures.cycles[label].show(),
                          figures.keys_served[label].show())
        report.tables.append(table)

    ratios = Table("On / off, each against plain measured beside it in the same repeat "
                   "(median [min-max] over repeats)",
                   ["database", "jobs stored", "fairness on / off, claims",
                    "fairness on / off, cycles", "ordering on / off, claims",
                    "ordering on / off, cycles"])
    for (engine, number), figures in results.items():
        ratios.add(engine, sizes.scenarios[number].name, figures.fair_claims.show(2),
                   figures.fair_cycles.show(2), figures.ordered_claims.show(2),
                   figures.ordered_cycles.show(2))
    report.tables.append(ratios)

    setup = Table("Set-up, once per database (not part of the rates above)",
                  ["database", "jobs stored", "what", "figure"])
    for (engine, number), figures in results.items():
        for what, figure in figures.setup:
            setup.add(engine, sizes.scenarios[number].name, what, figure)
    report.tables.append(setup)

    for (engine, number), figures in results.items():
        name = sizes.scenarios[number].name
        report.targets.append(Target(
            f"claim rate, fairness on / off, {name}, {engine}", f"≥ {TARGET_RATIO}",
            figures.fair_claims.show(2), figures.fair_claims.median >= TARGET_RATIO))
        report.targets.append(Target(
            f"claim + complete cycle rate, ordering on / off, {name}, {engine}",
            f"≥ {TARGET_RATIO}", figures.ordered_cycles.show(2),
            figures.ordered_cycles.median >= TARGET_RATIO))

    report.notes += [
        f"Machine: {os.cpu_count()} cores; load average (1, 5, 15 min) at the start "
        + ", ".join(f"{x:.2f}" for x in load_before) + ", at the end "
        + ", ".join(f"{x:.2f}" for x in load_after) + " (a shared machine).",
        "Every job is of one type ('email', medium priority, a concurrency key each); the "
        "worker's claim names no type, as a worker's key without a type list claims. On "
        "'plain' the claim is the plain claim statement over the claim-order index; with "
        "fairness on, flow control reads the type's settings and the claim reads each "
        "configured type's candidates, the fair type's from its round-order index, then "
        "claims the chosen job; with ordering on the claim is the plain one and the "
        "complete takes the key's turn row, finds the key's oldest waiting job, passes the "
        "turn and releases that job (recording its ready event).",
        "Keys served per repeat: how many keys the repeat's claims took jobs of. With one "
        "key's backlog enqueued first, plain claims take only that key's jobs, fair claims "
        "take every key's in turn; with ordering on, the big key's next job is released "
        "with its old created_at, so claims keep taking the big key's jobs one at a time.",
        "SQLite files are fresh, migrated, then loaded and checkpointed (no ANALYZE: the "
        "service runs none); PostgreSQL databases are fresh, loaded, then VACUUM ANALYZEd "
        "as autovacuum would after the load, and again once the setting is on (it changed "
        "every pending row: rounds, or waiting). Before that second ANALYZE, an ordered "
        "key's complete on PostgreSQL reads every waiting job of the type (see settle()).",
    ]
    return report


def main(argv: list[str] | None = None) -> None:
    def own(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--engines", default="",
                            help="comma-separated subset of sqlite,postgresql")

    options = parse_options((__doc__ or "").splitlines()[0], argv, add_arguments=own)
    started = time.monotonic()
    finish(measure(options), options, started)


if __name__ == "__main__":
    main()
