"""Enqueue options: what each field added after migration 0014 costs a single enqueue, beside
a plain one, and what it writes beyond the plain job's row.

Measured at the service level, as bench/heartbeat.py is: JobService in this process, one
thread, no HTTP, so that the figure is the enqueue's transaction (its commit included, SQLite
at synchronous=FULL) and not the server around it. Each body is the one a producer sends
(docs/API.md), loaded through the route's own EnqueueSchema before the clock starts; the
trace context is read from request headers by the route's own function and handed to the
service as the route hands it. Each repeat makes up to `cycles` enqueues of each kind (fewer,
as many of each, once it has run `repeat_seconds`), taking turns every `turn` enqueues (in
rotating order) so that the machine's changing load falls on all kinds alike:

- "plain": type + payload, the baseline;
- "3 tags"; "trace context" (traceparent + tracestate headers);
- "timeout + expiry" (timeout_seconds + expires_in_seconds);
- "depends_on 1 job": one pending job, of the 100 enqueued first (docs/WORKFLOWS.md);
- "reserved": `reserve` with a deadline an hour ahead (docs/JOBS.md), never answered; and
  "reserve + confirm": the same, then POST /jobs/{id}/confirm's service call, two
  transactions timed together;
- "concurrency key" on a type without key settings; "ordered key" and "fair key" on types
  whose `ordering` / `fairness` is "key" (docs/FLOW-CONTROL.md), 100 keys in turn;
- "unique key" (a new key each time: every enqueue stores a job);
- "Idempotency-Key" (a new key each time): part one's extra column, for scale.

After the run, each kind's jobs are read back: the rows they have beside them (job_tags,
job_traces, job_dependencies, job_reservations, job_checkpoints, key_turns, job_events),
the job-row columns they set that a plain job leaves NULL, and their status, printed beside
the list this script states (from app/storage/schema/). Then the SQL statements one enqueue
of each kind sends (counted on the engine's cursor events, apart from the timing). And the
stored width of the run's plain jobs' rows beside that of jobs enqueued then with every option
(SQLite: the records' payload from the dbstat table; PostgreSQL: pg_column_size), each beside
the same row cut to the 25 columns the table had before part three.

No target: the figures are for the issue's note on what each field costs.

    PYTHONPATH=. python bench/enqueue_options.py [--smoke] [--repeats N]
                                                 [--engines sqlite,postgresql]

With QUEUELOG_BENCH_POSTGRES_URL set to a PostgreSQL server URL, it is measured on PostgreSQL
as well, in databases of its own.
"""

from __future__ import annotations

import collections
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/enqueue_options.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import Engine, event, text

from app.core.callers import Role
from bench.data import (
    POSTGRES_VARIABLE,
    chosen_engines,
    engines_option,
    job_body,
    migrated_database,
    postgres_database,
    scratch_directory,
)
from bench.report import Report, Table, finish, load_note, parse_options
from bench.stats import Spread, percentile

# Two more types than bench/data.py's: one ordered by key, one fair by key.
JOB_TYPES = "email,report,ordered,fair"
KINDS = ("plain", "3 tags", "trace context", "timeout + expiry", "depends_on 1 job",
         "reserved", "reserve + confirm", "concurrency key", "ordered key", "fair key",
         "unique key", "Idempotency-Key")
PARENTS = 100  # the pending jobs "depends_on 1 job" names, in turn
TRACEPARENT = "00-{trace:032x}-{parent:016x}-01"
TRACESTATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
# The jobs table's columns before part three (migrations 0001-0014): the rest (fair_round,
# timeout_seconds, expires_at, cancel_requested_at/_by, progress_*) came with 0016 and 0017.
COLUMNS_BEFORE_PART_THREE = 25


@dataclass(frozen=True)
class Sizes:
    cycles: int  # enqueues of each kind per repeat, at most
    turn: int
    # A repeat ends at the first round of turns that finds it past this, each kind having
    # made as many enqueues: a loaded machine keeps the run within its few minutes.
    repeat_seconds: float
    keys: int  # the keys of the keyed kinds, taken in turn
    width_jobs: int  # jobs with every option, enqueued for their width
    warm: int  # enqueues of each kind before the clock starts
    counted: int  # enqueues of each kind whose statements are counted


FULL = Sizes(cycles=300, turn=10, repeat_seconds=18, keys=100, width_jobs=100, warm=20,
             counted=20)
SMOKE = Sizes(cycles=10, turn=5, repeat_seconds=5, keys=5, width_jobs=5, warm=3, counted=3)


# -- what each kind writes beyond a plain job, as the schema says (checked after the run) ----

@dataclass(frozen=True)
class Writes:
    """Beyond a plain job: rows beside it ({table: per job, or "key": one per key}), job-row
    columns set, statuses; `more` says in words what the check does not count (index
    entries, a second transaction)."""

    rows: Mapping[str, float | str] = field(default_factory=dict)
    columns: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ("pending",)
    more: str = ""

    def facts(self) -> str:
        parts = [f"{table} +{'1 per key' if per == 'key' else f'{per:g} per job'}"
                 for table, per in sorted(self.rows.items())]
        if self.columns:
            parts.append("jobs." + ", ".join(sorted(self.columns)))
        if self.statuses != ("pending",):
            parts.append("status " + "/".join(sorted(self.statuses)))
        return "; ".join(parts) or "nothing"


SIDE_TABLES = ("job_tags", "job_traces", "job_dependencies", "job_reservations",
               "job_checkpoints", "key_turns", "job_events")
LISTED = {
    "plain": Writes(more="its row in jobs (ix_jobs_claim_order, _by_type, ix_jobs_producer_id), "
                         "one job_events row (enqueued), job_stats' minute row (one upsert)"),
    "3 tags": Writes({"job_tags": 3}, more="3 entries in ix_job_tags_tag_job_id"),
    "trace context": Writes({"job_traces": 1}),
    "timeout + expiry": Writes(columns=("timeout_seconds", "expires_at"),
                               more="an ix_jobs_expires_at entry"),
    "depends_on 1 job": Writes({"job_dependencies": 1}, statuses=("waiting",),
                               more="its dependency read first (FOR SHARE on PostgreSQL); "
                                    "ix_jobs_waiting_type instead of the claim-order indexes; "
                                    "an ix_job_dependencies_depends_on_id entry"),
    "reserved": Writes({"job_reservations": 1}, statuses=("reserved",),
                       more="ix_jobs_reserved_type instead of the claim-order indexes; an "
                            "ix_job_reservations_due entry"),
    "reserve + confirm": Writes({"job_reservations": 1, "job_events": 1},
                                more="a second transaction: the job's UPDATE to pending, its "
                                     "reservation's outcome, the confirmed event"),
    "concurrency key": Writes(columns=("concurrency_key",)),
    "ordered key": Writes({"key_turns": "key"}, columns=("concurrency_key",),
                          statuses=("pending", "waiting"),
                          more="a key's first job takes its turn (key_turns); each later one "
                               "is held waiting behind it (an UPDATE, an ix_jobs_waiting_key "
                               "entry)"),
    "fair key": Writes(columns=("concurrency_key", "fair_round", "fair_key_round"),
                       more="its rounds (look-ups of its key's last and its producer's, an "
                            "UPDATE); entries in ix_jobs_fair_order, ix_jobs_fair_key, "
                            "ix_jobs_fair_producer_key and ix_jobs_fair_producer_order"),
    "unique key": Writes(columns=("unique_key", "unique_scope", "unique_while"),
                         more="a uq_jobs_producer_unique_scope entry"),
    "Idempotency-Key": Writes(columns=("idempotency_key", "request_fingerprint"),
                              more="a uq_jobs_producer_idempotency_key entry"),
}


# -- the requests --------------------------------------------------------------------------

@dataclass(frozen=True)
class Request:
    """One enqueue as the route hands it to the service."""

    body: dict[str, Any]
    idempotency_key: str | None = None
    trace: Any = None


def raw_body(kind: str, n: int, parents: Sequence[int],
             keys: int) -> tuple[dict[str, Any], str | None, dict[str, str]]:
    """(the JSON body, the Idempotency-Key header, the trace headers) a producer sends."""
    body: dict[str, Any] = {"type": "email", "payload": job_body(n)["payload"]}
    key, headers = None, {}
    key_name = f"customer-{n % keys}"
    if kind == "3 tags":
        body["tags"] = [f"customer-{n % 1000}", "import", "vip"]
    elif kind == "trace context":
        headers = {"traceparent": TRACEPARENT.format(trace=n + 1, parent=n + 1),
                   "tracestate": TRACESTATE}
    elif kind == "timeout + expiry":
        body |= {"timeout_seconds": 300, "expires_in_seconds": 3600}
    elif kind == "depends_on 1 job":
        body["depends_on"] = [parents[n % len(parents)]]
    elif kind in ("reserved", "reserve + confirm"):
        body["reserve"] = {"confirm_within_seconds": 3600}
    elif kind == "concurrency key":
        body["concurrency_key"] = key_name
    elif kind == "ordered key":
        body |= {"type": "ordered", "concurrency_key": key_name}
    elif kind == "fair key":
        body |= {"type": "fair", "concurrency_key": key_name}
    elif kind == "unique key":
        body["unique"] = {"key": f"order-{n}"}
    elif kind == "Idempotency-Key":
        key = f"request-{n}"
    elif kind != "plain":
        raise ValueError(kind)
    return body, key, headers


@dataclass
class Bench:
    """One database, its services and its producer, in this process."""

    url: str
    keys: int
    app: Any = None
    schema: Any = None  # the route's EnqueueSchema
    producer: Any = None
    parents: list[int] = field(default_factory=list)
    serial: int = 0  # numbers every request, so that keys never repeat
    made: dict[int, str] = field(default_factory=dict)  # job id: its kind

    def open(self) -> None:
        from app import create_app
        from app.jobs.web.requests import EnqueueSchema

        self.app = create_app({"DATABASE_URL": self.url, "JOB_TYPES": JOB_TYPES})
        self.schema = EnqueueSchema()
        found = self.services
        self.producer = found.keys.caller_for_token(found.keys.create_key("p", Role.PRODUCER))
        found.types.update_type("ordered", {"ordering": "key"})
        found.types.update_type("fair", {"fairness": "key"})
        self.parents = [outcome.job.id for outcome in found.jobs.enqueue_many(
            self.producer, [self.schema.load({"type": "report", "payload": {"n": n}})
                            for n in range(PARENTS)])]

    @property
    def services(self) -> Any:
        return self.app.extensions["queuelog"]

    def prepare(self, kind: str) -> Request:
        """The next request of `kind`, loaded as the route loads it (not timed)."""
        from app.core.tracecontext import trace_of_headers

        self.serial += 1
        body, key, headers = raw_body(kind, self.serial, self.parents, self.keys)
        return Request(self.schema.load(body), key, trace_of_headers(headers))

    def enqueue(self, kind: str, request: Request) -> int:
        """The timed part: the service calls the routes make; returns the job's id."""
        jobs = self.services.jobs
        outcome = jobs.enqueue(self.producer, request.body, request.idempotency_key,
                               trace=request.trace)
        if kind == "reserve + confirm":
            # ... the producer's own commit happens here ...
            jobs.confirm(self.producer, outcome.job.id)
        job_id: int = outcome.job.id
        return job_id

    def close(self) -> None:
        if self.app is not None:
            self.services.db.engine.dispose()


@contextlib.contextmanager
def fresh_database(engine: str, directory: str, name: str) -> Iterator[str]:
    if engine == "PostgreSQL":
        with postgres_database(os.environ[POSTGRES_VARIABLE]) as url:
            yield url
    else:
        yield migrated_database(directory, name)


# -- the timing ------------------------------------------------------------------------------

@dataclass
class Figures:
    rate: dict[str, Spread] = field(default_factory=lambda: {k: Spread() for k in KINDS})
    p50: dict[str, Spread] = field(default_factory=lambda: {k: Spread() for k in KINDS})
    p99: dict[str, Spread] = field(default_factory=lambda: {k: Spread() for k in KINDS})
    slowdown: dict[str, Spread] = field(default_factory=lambda: {k: Spread() for k in KINDS})
    enqueues: list[int] = field(default_factory=list)  # of each kind, per repeat
    statements: dict[str, float] = field(default_factory=dict)
    found: dict[str, Writes] = field(default_factory=dict)
    width: dict[str, Width] | None = None  # None: no dbstat in this SQLite


def time_kinds(bench: Bench, sizes: Sizes, repeats: int, figures: Figures) -> None:
    def one(kind: str) -> float:
        request = bench.prepare(kind)
        began = time.perf_counter()
        job_id = bench.enqueue(kind, request)
        seconds = time.perf_counter() - began
        bench.made[job_id] = kind
        return seconds

    for kind in KINDS:  # warm: statements compiled, pages cached, type settings read
        for _ in range(sizes.warm):
            one(kind)
    for _repeat in range(repeats):
        seconds: dict[str, list[float]] = {kind: [] for kind in KINDS}
        order = list(KINDS)
        began = time.monotonic()
        for _start in range(0, sizes.cycles, sizes.turn):
            if time.monotonic() - began > sizes.repeat_seconds:
                break
            order = order[1:] + order[:1]
            for kind in order:
                seconds[kind] += [one(kind) for _ in range(sizes.turn)]
        figures.enqueues.append(len(seconds["plain"]))
        for kind in KINDS:
            figures.rate[kind].add(len(seconds[kind]) / sum(seconds[kind]))
            figures.p50[kind].add(statistics.median(seconds[kind]) * 1e6)
            figures.p99[kind].add(percentile(seconds[kind], 99) * 1e6)
        plain = sum(seconds["plain"])
        for kind in KINDS:
            figures.slowdown[kind].add(sum(seconds[kind]) / plain)


def count_statements(bench: Bench, counted: int) -> dict[str, float]:
    """The SQL statements one enqueue of each kind sends, BEGIN aside (SQLite's is sent by the
    engine's hook, PostgreSQL's by the driver; neither sends COMMIT as a statement). Listening
    turns the driver path of app/storage/statements.py off: the same statements, through
    Core, which is why this is apart from the timing."""
    engine: Engine = bench.services.db.engine
    sent = [0]

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if not statement.lstrip().upper().startswith("BEGIN"):
            sent[0] += 1

    event.listen(engine, "before_cursor_execute", count)
    try:
        per_kind = {}
        for kind in KINDS:
            before = sent[0]
            for _ in range(counted):
                bench.made[bench.enqueue(kind, bench.prepare(kind))] = kind
            per_kind[kind] = (sent[0] - before) / counted
        return per_kind
    finally:
        event.remove(engine, "before_cursor_execute", count)


# -- what the run wrote -----------------------------------------------------------------------

def nullable_columns() -> list[str]:
    from app.storage.schema import jobs

    return [column.name for column in jobs.columns if column.nullable]


def found_writes(bench: Bench) -> dict[str, Writes]:
    """Each kind's writes beyond plain's, read back from the tables after the run."""
    made = bench.made
    jobs_of = collections.Counter(made.values())
    rows: dict[str, collections.Counter[str]] = {}
    set_columns: dict[str, set[str]] = collections.defaultdict(set)
    statuses: dict[str, set[str]] = collections.defaultdict(set)
    keys_of: dict[str, set[str]] = collections.defaultdict(set)
    columns = nullable_columns()
    with bench.services.db.engine.connect() as conn:
        for job_id, status, key, *values in conn.execute(text(
                f"SELECT id, status, concurrency_key, {', '.join(columns)} FROM jobs")):  # noqa: S608
            kind = made.get(job_id)
            if kind is None:  # the parents
                continue
            statuses[kind].add(status)
            if key is not None:
                keys_of[kind].add(key)
            set_columns[kind].update(name for name, value in zip(columns, values, strict=True)
                                     if value is not None)
        for table in SIDE_TABLES:
            rows[table] = collections.Counter(
                made[job_id] for (job_id,) in conn.execute(text(f"SELECT job_id FROM {table}"))  # noqa: S608
                if job_id in made)
    found = {}
    for kind in KINDS:
        extra: dict[str, float | str] = {}
        for table in SIDE_TABLES:
            beyond = (rows[table][kind] / jobs_of[kind]
                      - rows[table]["plain"] / jobs_of["plain"])
            if abs(beyond) < 0.005:
                continue
            if table == "key_turns" and rows[table][kind] == len(keys_of[kind]):
                extra[table] = "key"
            else:
                extra[table] = round(beyond, 2)
        found[kind] = Writes(extra, tuple(sorted(set_columns[kind] - set_columns["plain"])),
                             tuple(sorted(statuses[kind])))
    return found


# -- the row's width ---------------------------------------------------------------------------

@dataclass
class Width:
    row: float  # bytes: the stored row, all of its columns
    before: float  # bytes: the same row, its columns from before part three alone
    beside: float  # bytes per job in the tables beside it


EVERY_OPTION = "every option"
# The tables beside a job's row that an enqueue may write (job_events aside: every job has
# its enqueued event, plain ones too).
BESIDE = ("job_tags", "job_traces", "job_dependencies", "job_reservations", "key_turns")


def every_option_body(n: int, parent: int,
                      keys: int) -> tuple[dict[str, Any], str, dict[str, str]]:
    """Every field an enqueue takes at once, but `reserve` (which refuses unique and
    depends_on): a fair type's key, 3 tags, timeout and expiry, a unique key, a dependency
    (finished: the job is born pending and takes a round), an Idempotency-Key, a trace."""
    body = {"type": "fair", "payload": job_body(n)["payload"],
            "concurrency_key": f"customer-{n % keys}", "tags": ["customer-42", "import", "vip"],
            "timeout_seconds": 300, "expires_in_seconds": 3600,
            "unique": {"key": f"every-option-{n}"}, "depends_on": [parent]}
    headers = {"traceparent": TRACEPARENT.format(trace=n + 1, parent=n + 1),
               "tracestate": TRACESTATE}
    return body, f"every-option-{n}", headers


def measure_width(bench: Bench, engine: str, jobs: int) -> dict[str, Width]:
    """The plain jobs' rows beside `jobs` new ones with every option (after the run, in its
    database: measured by id, so the other kinds' rows do not count)."""
    from app.core.tracecontext import trace_of_headers

    found = bench.services
    worker = found.keys.caller_for_token(found.keys.create_key("w", Role.WORKER))
    [claimed] = found.jobs.claim(worker, types=["report"], lease_seconds=600, limit=1)
    found.jobs.complete(worker, claimed.job.id, lease_token=claimed.lease_token,
                        result={"ok": True})
    ids: dict[str, list[int]] = {
        "plain": sorted(job_id for job_id, kind in bench.made.items() if kind == "plain"),
        EVERY_OPTION: []}
    for n in range(jobs):
        body, key, headers = every_option_body(n, claimed.job.id, bench.keys)
        ids[EVERY_OPTION].append(found.jobs.enqueue(
            bench.producer, bench.schema.load(body), key, trace=trace_of_headers(headers)).job.id)
    with found.db.engine.connect() as conn:
        if engine == "PostgreSQL":
            return {shape: postgres_width(conn, shape_ids) for shape, shape_ids in ids.items()}
        return {shape: sqlite_width(conn, shape, shape_ids) for shape, shape_ids in ids.items()}


def postgres_width(conn: Any, ids: list[int]) -> Width:
    from app.storage.schema import jobs

    before = ", ".join(column.name for column in jobs.columns[:COLUMNS_BEFORE_PART_THREE])
    row, cut = conn.execute(text(
        f"SELECT avg(pg_column_size(jobs.*)), avg(pg_column_size(ROW({before}))) "  # noqa: S608
        "FROM jobs WHERE id = ANY(:ids)"), {"ids": ids}).one()
    beside = sum(conn.execute(text(
        f"SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM {table} t "  # noqa: S608
        "WHERE job_id = ANY(:ids)"), {"ids": ids}).scalar_one() for table in BESIDE)
    return Width(float(row), float(cut), float(beside) / len(ids))


def sqlite_width(conn: Any, shape: str, ids: list[int]) -> Width:
    """The shape's rows, and their rows beside, copied to tables of their own whose records'
    payload dbstat reports (a record's encoding depends on its values alone)."""
    from app.storage.schema import jobs, metadata

    names = [column.name for column in jobs.columns]
    prefix = f"width_{shape.replace(' ', '_')}"
    row = copy_payload(conn, f"{prefix}_all", "jobs", names, "id", ids)
    before = copy_payload(conn, f"{prefix}_before", "jobs", names[:COLUMNS_BEFORE_PART_THREE],
                          "id", ids)
    beside = sum(copy_payload(conn, f"{prefix}_{name}", name,
                              [column.name for column in metadata.tables[name].columns],
                              "job_id", ids) for name in BESIDE)
    return Width(row / len(ids), before / len(ids), beside / len(ids))


def copy_payload(conn: Any, copy: str, table: str, columns: list[str], by: str,
                 ids: list[int]) -> float:
    """The bytes of the records of `table`'s rows whose `by` is in `ids`, copied to `copy`
    (untyped columns: no affinity, each value stored as the original stores it)."""
    from app.storage.schema import metadata

    key = list(metadata.tables[table].primary_key.columns)
    # A lone integer key is the rowid, kept out of the record as in the original.
    rowid = key[0].name if len(key) == 1 and key[0].name in columns else None
    defined = [f"{name} INTEGER PRIMARY KEY" if name == rowid else name for name in columns]
    conn.exec_driver_sql(f"CREATE TABLE {copy} ({', '.join(defined)})")
    conn.exec_driver_sql(f"INSERT INTO {copy} SELECT {', '.join(columns)} FROM {table} "  # noqa: S608
                         f"WHERE {by} IN ({', '.join(str(job_id) for job_id in ids)})")
    conn.commit()
    payload = conn.exec_driver_sql(
        "SELECT coalesce(sum(payload), 0) FROM dbstat WHERE name = ? "
        "AND pagetype IN ('leaf', 'overflow')", (copy,)).scalar_one()
    return float(payload)


def dbstat_available(conn: Any) -> bool:
    from sqlalchemy.exc import OperationalError

    try:
        conn.exec_driver_sql("SELECT count(*) FROM dbstat").scalar_one()
    except OperationalError:
        return False
    return True


# -- the report --------------------------------------------------------------------------------

def measure_engine(engine: str, directory: str, sizes: Sizes, repeats: int) -> Figures:
    figures = Figures()
    with fresh_database(engine, directory, "enqueue-options.sqlite3") as url:
        bench = Bench(url, sizes.keys)
        try:
            bench.open()
            time_kinds(bench, sizes, repeats, figures)
            figures.statements = count_statements(bench, sizes.counted)
            figures.found = found_writes(bench)
            usable = engine == "PostgreSQL"
            if not usable:
                with bench.services.db.engine.connect() as conn:
                    usable = dbstat_available(conn)
            if usable:
                figures.width = measure_width(bench, engine, sizes.width_jobs)
        finally:
            bench.close()
    return figures


def measure(options: Any) -> Report:
    sizes = SMOKE if options.smoke else FULL
    engines = chosen_engines(options)
    load = os.getloadavg()
    report = Report("Enqueue options: what each field costs a single enqueue",
                    "python bench/enqueue_options.py", options.smoke, options.repeats)
    with scratch_directory("queuelog-bench-enqueue-options-") as directory:
        results = {engine: measure_engine(engine, directory, sizes, options.repeats)
                   for engine in engines}
    report.tables += [timing_table(results, sizes), writes_table(results),
                      width_table(results, sizes)]
    report.notes += [
        "Beyond plain (the static list above, from app/storage/schema/; the found columns "
        "read the run's jobs back): " + "; ".join(
            f"{kind}: {LISTED[kind].more}" for kind in KINDS if LISTED[kind].more) + ".",
        "Statements: counted on the engine's cursor events over "
        f"{sizes.counted} enqueues of each kind after the timing, BEGIN aside; reserve + confirm "
        "counts both transactions. Of plain's, two came with part three and are sent by every "
        "enqueue, with options or without: the read of the types' key modes in job_types "
        "(docs/FLOW-CONTROL.md) and the job_stats upsert (GET /stats's counts, QUEUELOG_STATS on, "
        "the default; "
        "bench/over_time.py measures it on and off).",
        f"Every option: type fair with a concurrency key, 3 tags, trace context, timeout + "
        "expiry, a unique key, an Idempotency-Key and depends_on one completed job (born "
        "pending, so it takes a fair round); not reserve, which refuses unique and depends_on. "
        f"Before part three: the row's first {COLUMNS_BEFORE_PART_THREE} columns (to "
        "scheduled_for); part three appended 9 (fair_round, timeout_seconds, expires_at, "
        "cancel_requested_at/_by, progress_done/_total/_message/_at). Bytes beside the row: "
        "its rows in job_tags, job_traces, job_dependencies, job_reservations and key_turns "
        "(on PostgreSQL each with its tuple header); indexes not counted.",
        load_note(load),
    ]
    return report


def timing_table(results: Mapping[str, Figures], sizes: Sizes) -> Table:
    done = ", ".join(f"{engine} {'/'.join(str(n) for n in figures.enqueues)}"
                     for engine, figures in results.items())
    table = Table(f"JobService.enqueue, one thread, up to {sizes.cycles:,} enqueues of each kind "
                  f"per repeat or {sizes.repeat_seconds:g} s (made: {done}), taking turns every "
                  f"{sizes.turn} (median [min-max] over repeats)",
                  ["database", "enqueue", "enqueues/s", "p50 µs", "p99 µs", "time / plain's",
                   "statements"])
    for engine, figures in results.items():
        for kind in KINDS:
            table.add(engine, kind, figures.rate[kind].show(), figures.p50[kind].show(),
                      figures.p99[kind].show(), figures.slowdown[kind].show(2),
                      f"{figures.statements[kind]:g}")
    return table


def writes_table(results: Mapping[str, Figures]) -> Table:
    engines = list(results)
    table = Table("What each kind writes beyond a plain job: as listed, and as found after the "
                  "run (rows beside the job per job, job-row columns set, status)",
                  ["enqueue", "listed", *[f"found, {engine}" for engine in engines],
                   "as listed"])
    for kind in KINDS:
        listed = LISTED[kind].facts()
        found = [results[engine].found[kind].facts() for engine in engines]
        table.add(kind, listed, *found,
                  "yes" if all(facts == listed for facts in found) else "NO")
    return table


def width_table(results: Mapping[str, Figures], sizes: Sizes) -> Table:
    table = Table(f"The job row's stored width, averaged over the run's plain jobs and "
                  f"{sizes.width_jobs} jobs with every option (SQLite: record payload from "
                  "dbstat; PostgreSQL: pg_column_size)",
                  ["database", "job", "row bytes", "its columns from before part three",
                   "part three's columns cost", "bytes beside the row"])
    for engine, figures in results.items():
        shapes = figures.width
        if shapes is None:
            table.add(engine, "(dbstat not compiled into this SQLite: skipped)", "", "", "", "")
            continue
        for shape, width in shapes.items():
            table.add(engine, shape, f"{width.row:.1f}", f"{width.before:.1f}",
                      f"{width.row - width.before:+.1f}", f"{width.beside:.1f}")
    return table


def main(argv: list[str] | None = None) -> None:
    started = time.monotonic()
    options = parse_options((__doc__ or "").splitlines()[0], argv,
                            add_arguments=engines_option)
    finish(measure(options), options, started)


if __name__ == "__main__":
    main()
