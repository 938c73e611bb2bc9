"""Long transaction: the claim rate while a transaction holds a snapshot open for minutes.

PostgreSQL only. A REPEATABLE READ transaction, idle with its snapshot, holds the
xmin horizon back: no row version that claims and completes leave behind can be removed or
marked dead in the indexes while it stays open, so each claim's scan of the pending jobs
steps over every job claimed since it began. Published measurements of SKIP LOCKED queues
put the cost at a third of their rate. Here, against real gunicorn (the shipped
gunicorn.conf.py) over a fresh database prefilled with a backlog, 4 clients claim and complete
one job at a time (POST /jobs/claim + /jobs/{id}/complete) in successive windows:

- before: one window with nothing held;
- during: the transaction opened, then HOLD_WINDOWS windows (10 minutes at full size); the
  first and the last are shown, with queuelog_database_oldest_transaction_seconds and the
  jobs table's dead row versions (pg_stat_user_tables) at the end of the hold;
- after: the transaction ended, two windows: while the dead versions the hold kept are
  vacuumed away, and once the queue has had a window to recover.

Claims + completes per second of each, and each / before: the median of the repeats, each
repeat on a database of its own. Goals (docs/SCALING.md, "A held snapshot"): the last minute
of the hold at least LAST_DURING_GOAL of the rate before, and the rate back to at least
AFTER_GOAL within a minute after the hold ends (the second window after).

    PYTHONPATH=. python bench/long_transaction.py [--smoke] [--repeats N]

Measured only with QUEUELOG_BENCH_POSTGRES_URL set to a PostgreSQL server URL (the held
transaction is in the benchmark's own database); without it the script says so and
measures nothing.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/long_transaction.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.data import (
    POSTGRES_VARIABLE,
    RESULT,
    chosen_engines,
    create_keys,
    engines_option,
    fill_queue,
    postgres_database,
    scratch_directory,
)
from bench.load import Client, run_load, scenario
from bench.report import Report, Table, Target, finish, load_note, parse_options
from bench.servers import queuelog_server
from bench.stats import Spread

CLIENTS = 4
KEYS = {"producer-0": "producer", "worker-0": "worker", "worker-1": "worker",
        "admin-0": "admin"}
GAUGE = "queuelog_database_oldest_transaction_seconds"


@dataclass(frozen=True)
class Sizes:
    prefill: int  # pending jobs before the first window: more than the windows can claim
    window: float  # seconds per window
    hold_windows: int  # windows while the transaction is held


FULL = Sizes(prefill=300_000, window=60.0, hold_windows=10)
LAST_DURING_GOAL = 0.85
AFTER_GOAL = 0.95
BEFORE = "before"
LAST_DURING = "during, last window"
AFTER = "after, second window"
SMOKE = Sizes(prefill=2_500, window=1.0, hold_windows=2)


@scenario
def claim_complete_held(client: Client, _context: Mapping[str, Any]) -> int:
    status, job = client.call("POST", "/jobs/claim", {}, expect=(200, 204))
    if status == 204:
        return 0
    client.call("POST", f"/jobs/{job['id']}/complete",
                {"lease_token": job["lease_token"], "result": RESULT}, expect=(200,))
    return 1


@contextlib.contextmanager
def held_snapshot(url: str) -> Iterator[None]:
    """A REPEATABLE READ transaction in the database at `url`, its snapshot taken, idle for
    as long as the block runs (as tests/faults/inject.py's PrivatePostgres.hold_xmin)."""
    import psycopg
    from sqlalchemy.engine import make_url

    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    conn = psycopg.connect(dsn, autocommit=True)
    try:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT count(*) FROM jobs")  # the first statement takes the snapshot
        yield
    finally:
        with contextlib.suppress(Exception):
            conn.execute("ROLLBACK")
        conn.close()


def dead_rows(url: str) -> tuple[int, int]:
    """(dead row versions of the jobs table, pending jobs left), from the server's stats."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            dead = conn.execute(text("SELECT n_dead_tup FROM pg_stat_user_tables "
                                     "WHERE relname = 'jobs'")).scalar_one()
            left = conn.execute(text("SELECT count(*) FROM jobs WHERE status = 'pending'"
                                     )).scalar_one()
    finally:
        engine.dispose()
    return int(dead), int(left)


def gauge(port: int, token: str) -> float | None:
    client = Client(port, token)
    try:
        client.conn.request("GET", "/metrics", headers=client.headers)
        text = client.conn.getresponse().read().decode()
    finally:
        client.close()
    for line in text.splitlines():
        if line.startswith(GAUGE + " "):
            return float(line.split()[1])
    return None


@dataclass
class Figures:
    rates: dict[str, Spread] = field(default_factory=dict)  # by phase
    ratios: dict[str, Spread] = field(default_factory=dict)  # by phase, / before
    gauge: Spread = field(default_factory=Spread)
    dead: Spread = field(default_factory=Spread)
    notes: list[str] = field(default_factory=list)

    def add(self, phase: str, rate: float, before: float) -> None:
        self.rates.setdefault(phase, Spread()).add(rate)
        if phase != BEFORE:
            self.ratios.setdefault(phase, Spread()).add(rate / before)


def window(port: int, tokens: list[str], seconds: float) -> float:
    result = run_load("claim_complete_held", port, tokens, clients=CLIENTS,
                      operations=10**9, max_seconds=seconds)
    return result.jobs_per_second


def measure_once(server_url: str, directory: str, sizes: Sizes, repeat: int,
                 figures: Figures) -> None:
    with postgres_database(server_url) as url:
        tokens = create_keys(url, KEYS)
        workers = [tokens["worker-0"], tokens["worker-1"]]
        with queuelog_server(directory, url) as server:
            fill_queue(server.port, tokens["producer-0"], sizes.prefill)
            rates = {BEFORE: window(server.port, workers, sizes.window)}
            with held_snapshot(url):
                during = [window(server.port, workers, sizes.window)
                          for _ in range(sizes.hold_windows)]
                held_for = gauge(server.port, tokens["admin-0"])
                dead, _left = dead_rows(url)
            rates |= {"during, first window": during[0], LAST_DURING: during[-1],
                      "after, first window": window(server.port, workers, sizes.window),
                      AFTER: window(server.port, workers, sizes.window)}
            _dead, left = dead_rows(url)
    for phase, rate in rates.items():
        figures.add(phase, rate, rates[BEFORE])
    if held_for is not None:
        figures.gauge.add(held_for)
    figures.dead.add(dead)
    if left == 0:
        figures.notes.append(f"repeat {repeat + 1}: the backlog ran dry (the last window's "
                             "rate is a floor)")
    print(f"repeat {repeat + 1}: " + ", ".join(f"{phase} {rate:,.0f}/s"
                                               for phase, rate in rates.items())
          + f"; {dead:,} dead row versions at the end of the hold", file=sys.stderr,
          flush=True)


def measure(options: Any) -> Report:
    sizes = SMOKE if options.smoke else FULL
    report = Report("Long transaction: the claim rate while a snapshot is held open",
                    "python bench/long_transaction.py", options.smoke, options.repeats)
    load = os.getloadavg()
    server_url = os.environ.get(POSTGRES_VARIABLE)
    measured = server_url is not None and "PostgreSQL" in chosen_engines(options)
    figures = Figures()
    if measured:
        assert server_url is not None
        with scratch_directory("queuelog-bench-long-transaction-") as directory:
            for repeat in range(options.repeats):
                measure_once(server_url, directory, sizes, repeat, figures)
    held = sizes.window * sizes.hold_windows
    table = Table(f"PostgreSQL, {CLIENTS} clients claiming + completing one job at a time, "
                  f"{sizes.window:.0f} s windows; the transaction held {held:.0f} s "
                  "(median [min-max] over repeats)",
                  ["phase", "claims + completes /s", "/ before", "goal"])
    if not measured:
        table.add("not measured: set QUEUELOG_BENCH_POSTGRES_URL", "-", "-", "-")
    else:
        goals = {LAST_DURING: LAST_DURING_GOAL, AFTER: AFTER_GOAL}
        for phase, rates in figures.rates.items():
            ratio = figures.ratios.get(phase)
            shown = ratio.show(2) if ratio is not None else ""
            if phase not in goals or ratio is None:
                table.add(phase, rates.show(), shown, "")
                continue
            goal = goals[phase]
            met = ratio.median >= goal
            table.add(phase, rates.show(), shown,
                      f">= {goal} ({'met' if met else '**NOT met**'})")
            report.targets.append(Target(
                f"claim rate with a snapshot held {held:.0f} s, {phase} / before, PostgreSQL",
                f"≥ {goal}", ratio.show(2), met))
    report.tables.append(table)
    if measured:
        operator = Table("What the operator saw at the end of the hold",
                         [GAUGE, "dead row versions in jobs (n_dead_tup)"])
        operator.add(figures.gauge.show(0, " s"), figures.dead.show())
        report.tables.append(operator)
    report.notes += [
        load_note(load, "a shared 2-core machine: the server, the clients and PostgreSQL "
                        "share the 2 cores"),
        f"Each repeat: a fresh database, {sizes.prefill:,} pending jobs enqueued through "
        "/jobs/batch before the first window, the shipped gunicorn settings (2 workers, 16 "
        "threads). The held transaction is a REPEATABLE READ snapshot in the same database, "
        "idle (as a forgotten BEGIN in psql, or a long report, would be).",
        "The same effect without a held transaction: a replica with hot_standby_feedback "
        "running a long query, or a prepared transaction left behind.",
        *figures.notes,
    ]
    return report


def main(argv: list[str] | None = None) -> None:
    started = time.monotonic()
    options = parse_options((__doc__ or "").splitlines()[0], argv,
                            add_arguments=engines_option)
    finish(measure(options), options, started)


if __name__ == "__main__":
    main()
