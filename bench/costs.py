"""What a job costs: the statements and round trips each plain step sends, and the rows a plain
job's lifecycle writes (docs/SCALING.md, "What a job costs").

Counted as tests/test_statement_budget.py counts them (app/storage/statement_count.py: every
statement the app's engine gives its driver, and on PostgreSQL the BEGINs, COMMITs and pings
besides them), here over JOBS plain jobs of each path rather than one, driven through the app
itself (create_app and Flask's test client, one thread, the type settings' thread running as
where the app is served), on a fresh database per engine:

- enqueue, claim and complete, one job at a time;
- enqueue, claim, heartbeat and fail with retries left (the job goes back to pending);
- enqueue, claim and fail with no retry left (failed for good).

On PostgreSQL the rows each path writes are read from the server's own view: n_tup_ins,
n_tup_upd and n_tup_del of pg_stat_user_tables, per table, before and after the path's JOBS
jobs, divided by JOBS. A backend hands its table counts to that view lazily (at most once a
second, when idle, else up to 10 s later); before each read every pooled connection of the
app is told to hand them over at once (pg_stat_force_next_flush(), PostgreSQL 15 and later),
and the view is read again 1.5 s later: that read is the one counted, and the report says
whether anything arrived in between.

Targets: on PostgreSQL every plain step is 1 round trip, and a plain job's lifecycle writes 3
rows, all of them its own (insert, claim, complete); on SQLite each step sends the statements
docs/SCALING.md documents (BEGIN IMMEDIATE counted).

    PYTHONPATH=. python bench/costs.py [--smoke] [--repeats N] [--engines sqlite,postgresql]

With QUEUELOG_BENCH_POSTGRES_URL set to a PostgreSQL server URL, it is measured on PostgreSQL
as well, in a database of its own (dropped after).
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/costs.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.core.callers import Role
from app.storage.statement_count import Sent, counting
from bench.data import (
    JOB_TYPES,
    chosen_engines,
    engine_database,
    engines_option,
    scratch_directory,
)
from bench.report import Report, Table, Target, run_script

JOBS, SMOKE_JOBS = 1000, 50
STEPS = ("enqueue", "claim", "complete", "heartbeat", "fail (retry)", "fail for good")
# docs/SCALING.md, "What a job costs": statements per plain step (SQLite: BEGIN IMMEDIATE
# counted; PostgreSQL: one statement in autocommit, one round trip).
DOCUMENTED = {
    "SQLite": {"enqueue": 2, "claim": 2, "complete": 2, "heartbeat": 2, "fail (retry)": 6,
               "fail for good": 6},
    "PostgreSQL": dict.fromkeys(STEPS, 1),
}
ROUND_TRIPS = 1  # each plain step on PostgreSQL
LIFECYCLE_ROWS = 3  # a plain job's own row: inserted, claimed, completed
PATHS = {"plain": "enqueue, claim, complete",
         "retried": "enqueue, claim, heartbeat, fail (retry)",
         "failed": "enqueue, claim, fail for good"}
LATE_READ_SECONDS = 1.5  # past PostgreSQL's 1 s between a backend's stats reports


@dataclass
class Figures:
    """One engine's counts over every repeat: per step, each step's statements and round
    trips; per path, table and kind, the rows written per job (one value per repeat)."""

    statements: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    round_trips: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    rows: dict[str, dict[str, dict[str, list[float]]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(lambda: defaultdict(list))))
    late: list[str] = field(default_factory=list)


class TableWrites:
    """pg_stat_user_tables of one database, read on a connection of its own once the app's
    pooled connections have handed their counts over."""

    def __init__(self, url: str, app_engine: Any) -> None:
        from sqlalchemy import create_engine

        self.engine = create_engine(url, isolation_level="AUTOCOMMIT")
        self.app_engine = app_engine

    def flush_app(self) -> None:
        """Every pooled connection of the app checked out at once (none is left to a thread
        of the app) and told to report its table counts as it goes idle, which it does
        before it answers."""
        from sqlalchemy import text

        with contextlib.ExitStack() as stack:
            pool = self.app_engine.pool
            held = [stack.enter_context(self.app_engine.connect()) for _ in range(pool.size())]
            assert pool.checkedin() == 0 and pool.overflow() <= 0, pool.status()
            for conn in held:
                conn.execute(text("SELECT pg_stat_force_next_flush()"))
                conn.commit()

    def read(self) -> dict[str, dict[str, int]]:
        from sqlalchemy import text

        with self.engine.connect() as conn:
            conn.execute(text("SELECT pg_stat_clear_snapshot()"))
            rows = conn.execute(text(
                "SELECT relname, n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables"))
            return {name: {"inserted": ins, "updated": upd, "deleted": dele}
                    for name, ins, upd, dele in rows}

    def now(self) -> dict[str, dict[str, int]]:
        self.flush_app()
        return self.read()

    def close(self) -> None:
        self.engine.dispose()


def written(before: dict[str, dict[str, int]],
            after: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """The rows each table gained between two reads, tables without any left out."""
    changed = {}
    for name, counts in after.items():
        delta = {kind: value - before.get(name, {}).get(kind, 0)
                 for kind, value in counts.items()}
        if any(delta.values()):
            changed[name] = delta
    return changed


class Bench:
    """One fresh database, the app on it, a producer and a worker, and the counts taken."""

    def __init__(self, url: str, figures: Figures) -> None:
        from app import create_app
        from app.core.clock import ManualClock

        # The clock stands still: a retried job's backoff never runs out, so each claim takes
        # the job just enqueued, and no once-a-minute note (a key's last use) falls in a step.
        self.app = create_app({"DATABASE_URL": url, "JOB_TYPES": JOB_TYPES,
                               "CLOCK": ManualClock(start_us=1_800_000_000_000_000)})
        self.services = self.app.extensions["queuelog"]
        self.services.type_settings.refresh()
        self.services.type_settings.start()
        self.engine = self.services.db.engine
        self.client = self.app.test_client()
        keys = self.services.keys
        self.producer = keys.create_key("costs-producer", Role.PRODUCER)
        self.worker = keys.create_key("costs-worker", Role.WORKER)
        self.figures = figures
        self.writes = TableWrites(url, self.engine) if self.engine.dialect.name == "postgresql" \
            else None

    def call(self, token: str, path: str, body: Any, counted: str | None = None) -> Any:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.ExitStack() as stack:
            # (the request log's line) and what the step sends, when it is counted
            sent = stack.enter_context(counting(self.engine)) if counted else Sent()
            answer = self.client.post(path, json=body,
                                      headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code in (200, 201), (path, answer.status_code, answer.get_data())
        if counted:
            self.figures.statements[counted].append(len(sent.statements))
            self.figures.round_trips[counted].append(sent.round_trips)
        return answer.get_json()

    def lifecycle(self, path: str, n: int, counted: bool) -> None:
        """One job of `path` (PATHS), its steps counted or not (the warm-up)."""
        def step(name: str) -> str | None:
            return name if counted else None

        retries = {"plain": 3, "retried": 3, "failed": 0}[path]
        job = self.call(self.producer, "/jobs", {"type": "email", "payload": {"n": n},
                                                 "max_retries": retries},
                        step("enqueue") if path == "plain" else None)
        claimed = self.call(self.worker, "/jobs/claim", {},
                            step("claim") if path == "plain" else None)
        assert claimed["id"] == job["id"], (claimed, job)
        lease = {"lease_token": claimed["lease_token"]}
        if path == "plain":
            done = self.call(self.worker, f"/jobs/{job['id']}/complete", lease, step("complete"))
            assert done["status"] == "completed", done
            return
        if path == "retried":
            self.call(self.worker, f"/jobs/{job['id']}/heartbeat", lease, step("heartbeat"))
        failed = self.call(self.worker, f"/jobs/{job['id']}/fail",
                           {**lease, "error": "it broke"},
                           step("fail (retry)" if path == "retried" else "fail for good"))
        assert failed["status"] == ("pending" if path == "retried" else "failed"), failed

    def run(self, jobs: int) -> None:
        for path in PATHS:  # warm: statements compiled, caches filled, the keys noted
            self.lifecycle(path, -1, counted=False)
        for path in PATHS:
            before = self.writes.now() if self.writes else {}
            for n in range(jobs):
                self.lifecycle(path, n, counted=True)
            if self.writes is None:
                continue
            after = self.writes.now()
            time.sleep(LATE_READ_SECONDS)
            later = self.writes.read()
            if later != after:
                self.figures.late.append(f"{path}: {written(after, later)}")
            for table, counts in written(before, later).items():
                for kind, value in counts.items():
                    self.figures.rows[path][table][kind].append(value / jobs)

    def close(self) -> None:
        self.services.type_settings.stop()
        if self.writes is not None:
            self.writes.close()
        self.services.close()


def measure_engine(engine: str, directory: str, jobs: int, repeats: int) -> Figures:
    figures = Figures()
    for repeat in range(repeats):
        # No stand-in autovacuum on PostgreSQL: its statements and rows would be counted.
        with engine_database(engine, directory, f"costs-{repeat}.sqlite3",
                             stand_in=False) as url:
            bench = Bench(url, figures)
            try:
                bench.run(jobs)
            finally:
                bench.close()
    return figures


def shown(values: Sequence[float], digits: int = 2) -> str:
    """The mean, and the range when the values differ."""
    mean = sum(values) / len(values)
    low, high = min(values), max(values)
    text = f"{mean:.{digits}f}"
    return text if low == high else f"{text} [{low:g}-{high:g}]"


def step_rows(report: Report, results: dict[str, Figures], jobs: int) -> None:
    table = Table(f"Statements and round trips per plain step, counted on the app's engine over "
                  f"{jobs:,} steps of each per repeat (mean [min-max] over the steps)",
                  ["database", "step", "statements", "documented", "round trips"])
    for engine, figures in results.items():
        for step in STEPS:
            trips = shown(figures.round_trips[step]) if engine == "PostgreSQL" else "-"
            table.add(engine, step, shown(figures.statements[step]),
                      DOCUMENTED[engine][step], trips)
    report.tables.append(table)
    for engine, figures in results.items():
        for step in STEPS:
            if engine == "PostgreSQL":
                counted = figures.round_trips[step]
                report.targets.append(Target(
                    f"PostgreSQL: round trips per plain {step}", f"= {ROUND_TRIPS}",
                    shown(counted), set(counted) == {ROUND_TRIPS}))
            else:
                sent = figures.statements[step]
                documented = DOCUMENTED[engine][step]
                report.targets.append(Target(
                    f"{engine}: statements per plain {step}",
                    f"= {documented} (docs/SCALING.md)", shown(sent), set(sent) == {documented}))


def row_rows(report: Report, figures: Figures, jobs: int) -> None:
    table = Table(f"Rows written per job on PostgreSQL, by table (pg_stat_user_tables, "
                  f"{jobs:,} jobs of each path per repeat, divided by their number; median "
                  f"[min-max] over repeats)",
                  ["path", "table", "inserted", "updated", "deleted", "rows written"])
    for path, steps in PATHS.items():
        tables = figures.rows.get(path, {})
        if not tables:
            table.add(f"{path}: {steps}", "(none)", "0", "0", "0", "0")
        for name, kinds in sorted(tables.items()):
            total = [sum(values) for values in zip(*kinds.values(), strict=True)]
            table.add(f"{path}: {steps}", name,
                      *(shown(kinds[kind]) if kind in kinds else "0"
                        for kind in ("inserted", "updated", "deleted")), shown(total))
    report.tables.append(table)
    plain = figures.rows.get("plain", {})
    own = [sum(values) for values in zip(*plain["jobs"].values(), strict=True)] \
        if "jobs" in plain else [0.0]
    others = sorted(name for name in plain if name != "jobs")
    report.targets.append(Target(
        "PostgreSQL: rows written per plain job's lifecycle (enqueue, claim, complete)",
        f"= {LIFECYCLE_ROWS}, all in jobs",
        shown(own) + (f"; also {', '.join(others)}" if others else ", jobs only"),
        set(own) == {LIFECYCLE_ROWS} and not others))


def measure(options: Any) -> Report:
    jobs = SMOKE_JOBS if options.smoke else JOBS
    engines = chosen_engines(options)
    report = Report("What a job costs: statements, round trips and rows written per plain step",
                    "python bench/costs.py", options.smoke, options.repeats)
    with scratch_directory("queuelog-bench-costs-") as directory:
        results = {engine: measure_engine(engine, directory, jobs, options.repeats)
                   for engine in engines}
    step_rows(report, results, jobs)
    if "PostgreSQL" in results:
        row_rows(report, results["PostgreSQL"], jobs)
        late = results["PostgreSQL"].late
        report.notes.append(
            "pg_stat_user_tables was read as soon as the app's connections had handed their "
            f"counts over, and again {LATE_READ_SECONDS} s later (the rows shown are the later "
            "read's): " + ("the same every time." if not late
                           else f"more had arrived in between: {'; '.join(late)}."))
    report.notes.append(
        "Through create_app and Flask's test client in this process, one thread, the app's "
        "clock standing still (so no once-a-minute note of a key's use falls in the counted "
        "steps: a step that carries one sends a statement more, once a minute per key). "
        "Statements are what the app's engine gives its driver (BEGIN IMMEDIATE included on "
        "SQLite); round trips on PostgreSQL add the BEGIN, COMMIT and pings psycopg sends "
        "besides them (app/storage/statement_count.py, as tests/test_statement_budget.py "
        "counts). A failure writes its attempt, its events and its failure group: rows of "
        "history the plain complete does not write (its events and attempt are told from the "
        "job's row).")
    return report


def main(argv: list[str] | None = None) -> None:
    run_script(measure, __doc__, argv, add_arguments=engines_option)


if __name__ == "__main__":
    main()
