"""Heartbeats with progress (docs/JOBS.md): what reporting progress costs a
heartbeat, beside the same heartbeat without it.

Measured at the service level, as bench/keys.py is: JobService in this process, one thread,
no HTTP, so that the figure is the heartbeat's transaction (its commit included, SQLite at
synchronous=FULL) and not the server around it. One database holds JOBS running jobs, all
held by one worker under long leases; each repeat sends CYCLES heartbeats of each kind,
taking turns every TURN heartbeats (in rotating order) so that the machine's changing load
falls on all kinds alike:

- "plain": a heartbeat that extends the lease, nothing more;
- "progress": the same with progress {done, total} and a message (redacted as errors are),
  which it writes in the same UPDATE, to columns of the job's row the claim never reads;
- "progress + checkpoint": the same with a small checkpoint too, saved to job_checkpoints
  beside the row (for scale: not a target).

The target: a heartbeat with progress costs at most 20 % more than one without,
that is plain / progress heartbeats per second >= 1 / 1.2.

    PYTHONPATH=. python bench/heartbeat.py [--smoke] [--repeats N] [--engines sqlite,postgresql]

With QUEUELOG_BENCH_POSTGRES_URL set to a PostgreSQL server URL, it is measured on PostgreSQL
as well, in a database of its own.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/heartbeat.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.core.callers import Role
from bench.data import (
    JOB_TYPES,
    POSTGRES_VARIABLE,
    chosen_engines,
    engines_option,
    migrated_database,
    postgres_database,
    scratch_directory,
)
from bench.report import Report, Table, Target, finish, parse_options
from bench.stats import Spread, percentile

KINDS = ("plain", "progress", "progress + checkpoint")
TARGET_SLOWDOWN = 1.2  # a heartbeat with progress costs at most 20 % more


@dataclass(frozen=True)
class Sizes:
    jobs: int
    cycles: int  # heartbeats of each kind per repeat
    turn: int


FULL = Sizes(jobs=1000, cycles=3000, turn=100)
SMOKE = Sizes(jobs=50, cycles=150, turn=25)


@dataclass
class Bench:
    """One database, its services and its running jobs, in this process."""

    url: str
    app: Any = None
    worker: Any = None
    held: list[tuple[int, str]] = field(default_factory=list)  # (job id, lease token)
    clock: Any = None

    def open(self, jobs: int) -> None:
        from app import create_app
        from app.core.clock import ManualClock

        # A job takes one heartbeat a second (docs/JOBS.md, Heartbeat pace), and the bench
        # beats each job far more often than that: its clock moves a second before every
        # heartbeat, so that each one is taken and writes what a paced one writes.
        self.clock = ManualClock()
        self.app = create_app({"DATABASE_URL": self.url, "JOB_TYPES": JOB_TYPES,
                               "CLOCK": self.clock})
        found = self.app.extensions["queuelog"]
        self.worker = found.keys.caller_for_token(found.keys.create_key("w", Role.WORKER))
        producer = found.keys.caller_for_token(found.keys.create_key("p", Role.PRODUCER))
        for start in range(0, jobs, 1000):
            found.jobs.enqueue_many(producer, [
                {"type": "email", "payload": {"n": n}, "priority": None, "max_retries": 3}
                for n in range(start, min(jobs, start + 1000))])
        while len(self.held) < jobs:
            claimed = found.jobs.claim(self.worker, lease_seconds=3600, limit=100)
            self.held += [(c.job.id, c.lease_token) for c in claimed]

    def beater(self, kind: str) -> Callable[[int], None]:
        from app.jobs.usecases.reports import Progress

        jobs = self.app.extensions["queuelog"].jobs
        total = 1_000_000

        def beat(n: int) -> None:
            job_id, token = self.held[n % len(self.held)]
            self.clock.advance(1.0)
            progress = None
            if kind == "progress":
                progress = Progress((n, total), "importing rows")
            elif kind == "progress + checkpoint":
                progress = Progress((n, total), "importing rows", {"next_row": n})
            jobs.heartbeat(self.worker, job_id, lease_token=token, lease_seconds=3600,
                           progress=progress)

        return beat

    def close(self) -> None:
        if self.app is not None:
            self.app.extensions["queuelog"].db.engine.dispose()


@contextlib.contextmanager
def fresh_database(engine: str, directory: str) -> Iterator[str]:
    if engine == "PostgreSQL":
        with postgres_database(os.environ[POSTGRES_VARIABLE]) as url:
            yield url
    else:
        yield migrated_database(directory, "heartbeat.sqlite3")


@dataclass
class Figures:
    rate: dict[str, Spread] = field(default_factory=lambda: {k: Spread() for k in KINDS})
    p50: dict[str, Spread] = field(default_factory=lambda: {k: Spread() for k in KINDS})
    p99: dict[str, Spread] = field(default_factory=lambda: {k: Spread() for k in KINDS})
    slowdown: dict[str, Spread] = field(default_factory=lambda: {k: Spread() for k in KINDS})


def measure_engine(engine: str, directory: str, sizes: Sizes, repeats: int) -> Figures:
    figures = Figures()
    with fresh_database(engine, directory) as url:
        bench = Bench(url)
        try:
            bench.open(sizes.jobs)
            beaters = {kind: bench.beater(kind) for kind in KINDS}
            for kind in KINDS:  # warm: statements compiled, pages cached
                for n in range(20):
                    beaters[kind](n)
            for repeat in range(repeats):
                seconds: dict[str, list[float]] = {kind: [] for kind in KINDS}
                order = list(KINDS)
                for start in range(0, sizes.cycles, sizes.turn):
                    order = order[1:] + order[:1]
                    for kind in order:
                        for n in range(start, start + sizes.turn):
                            began = time.perf_counter()
                            beaters[kind](n + repeat * sizes.cycles)
                            seconds[kind].append(time.perf_counter() - began)
                for kind in KINDS:
                    figures.rate[kind].add(len(seconds[kind]) / sum(seconds[kind]))
                    figures.p50[kind].add(statistics.median(seconds[kind]) * 1e6)
                    figures.p99[kind].add(percentile(seconds[kind], 99) * 1e6)
                plain = sum(seconds["plain"])
                for kind in KINDS:
                    figures.slowdown[kind].add(sum(seconds[kind]) / plain)
        finally:
            bench.close()
    return figures


def measure(options: Any) -> Report:
    sizes = SMOKE if options.smoke else FULL
    engines = chosen_engines(options)
    report = Report("Heartbeats with progress: cost beside a plain heartbeat",
                    "python bench/heartbeat.py", options.smoke, options.repeats)
    with scratch_directory("queuelog-bench-heartbeat-") as directory:
        results = {engine: measure_engine(engine, directory, sizes, options.repeats)
                   for engine in engines}
    table = Table(f"JobService.heartbeat, one thread, {sizes.jobs:,} running jobs, "
                  f"{sizes.cycles:,} heartbeats of each kind per repeat, taking turns every "
                  f"{sizes.turn} (median [min-max] over repeats)",
                  ["database", "heartbeat", "heartbeats/s", "p50 µs", "p99 µs",
                   "time / plain's"])
    for engine, figures in results.items():
        for kind in KINDS:
            table.add(engine, kind, figures.rate[kind].show(), figures.p50[kind].show(),
                      figures.p99[kind].show(), figures.slowdown[kind].show(2))
    report.tables.append(table)
    for engine, figures in results.items():
        slowdown = figures.slowdown["progress"]
        report.targets.append(Target(
            f"{engine}: a heartbeat with progress / one without (time)",
            f"<= {TARGET_SLOWDOWN}", slowdown.show(2),
            slowdown.median <= TARGET_SLOWDOWN))
    report.notes.append("Progress rides on the heartbeat's own UPDATE of the job row (columns "
                        "the claim never reads): no statement, no page, no event more. A "
                        "checkpoint is one upsert into job_checkpoints beside it.")
    return report


def main(argv: list[str] | None = None) -> None:
    started = time.monotonic()

    options = parse_options((__doc__ or "").splitlines()[0], argv,
                            add_arguments=engines_option)
    finish(measure(options), options, started)


if __name__ == "__main__":
    main()
