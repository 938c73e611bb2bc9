"""Database wakes: what PostgreSQL's LISTEN/NOTIFY (migration 0025) buys and costs.

PostgreSQL only. With notifications on (the default), the database's triggers tell every host
of each change and one process per host listens (app/storage/listener.py), so an idle host
should send the database almost nothing and a claim waiting on one host should wake within
milliseconds of a commit on another; QUEUELOG_NOTIFY=0 is the old behaviour (waiters peek every
50 ms, each process looks for its own work), measured beside it as the baseline. Three parts,
each against real gunicorn under the shipped gunicorn.conf.py on fresh databases:

- idle statements: a freshly migrated database served with 1, 2 and 4 gunicorn workers and no
  request at all; every statement PostgreSQL receives from that database, counted in the
  server's own log (log_statement = 'all' set on that database alone) over a window after a
  warm-up, as statements per second per host;
- cross-host wake latency: two servers ("hosts": each its own TMPDIR, so its own wake directory
  and its own listener) on one database; a claim long-polls on host B, one job of its type is
  enqueued on host A; the figure runs from A's 201 (the commit) to B's claim answer, on an
  otherwise idle pair, while 8 client threads enqueue jobs of another type on A at a steady
  pace (LOAD_PACE each), and while they enqueue as fast as A answers (on 2 cores that
  saturates the machine: the wake then waits for a core);
- enqueue throughput: one server, 8 clients, one job per POST /jobs, notifications on and off
  in alternating turns; the ratio on / off.

    PYTHONPATH=. python bench/wakes.py [--smoke] [--repeats N] [--postgres-log PATH]

Measured only with QUEUELOG_BENCH_POSTGRES_URL set to a PostgreSQL server URL; without it the
script says so and measures nothing. The idle count reads the PostgreSQL server's log, so it
needs the server on this machine and its log readable (the newest /var/log/postgresql/*.log,
or --postgres-log), with a log_line_prefix that names the database (%d).
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import glob
import multiprocessing
import os
import random
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/wakes.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from app.jobs.wake.waiting import POLL_SECONDS
from bench.data import (
    POSTGRES_VARIABLE,
    create_keys,
    job_body,
    postgres_database,
    scratch_directory,
)
from bench.http_single import enqueue_one
from bench.load import Client, HttpError, run_load
from bench.report import Report, Table, Target, finish, load_note, parse_options
from bench.servers import queuelog_server
from bench.stats import Spread, ms, percentile
from tests.servers import GunicornServer

# -- sizes and goals -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Sizes:
    idle_window: float  # seconds of idle statements counted
    idle_warmup: float  # seconds after the last idle server answered, before counting
    wakes: int  # cross-host wakes per condition and repeat
    enqueues: int  # operations per throughput run
    idle_workers: tuple[int, ...]  # the gunicorn worker counts of the idle hosts


FULL = Sizes(idle_window=30.0, idle_warmup=10.0, wakes=200, enqueues=3000,
             idle_workers=(1, 2, 4))
# Every phase and table, on the fewest servers: a smoke run proves the script, not a figure.
SMOKE = Sizes(idle_window=2.0, idle_warmup=2.0, wakes=5, enqueues=40, idle_workers=(1,))

IDLE_GOAL = 2.0  # statements per second per idle host, notifications on
WAKE_GOAL_MS = 20.0  # p99 of a cross-host wake
RATIO_GOAL = 0.95  # enqueue jobs/s, notifications on / off
LOAD_CLIENTS = 8
# Each loading client's jobs/s in the paced condition: 8 clients make 200 jobs/s, about 40 %
# of what one 2-core host's enqueues reach here (bench/http_single.py), so a core is mostly
# free when the wake comes, as on a host that has headroom.
LOAD_PACE = 25.0
MAX_SECONDS = 15.0  # bound of one throughput run
CLAIM_WAIT_SECONDS = 10  # the waiting claim's wait_seconds
# How long after sending the waiting claim the job is enqueued (plus a random part of the peek
# period, so that the baseline's 50 ms peek is not lined up with the enqueue).
SETTLE_SECONDS = 0.15
WAKE_TYPE, LOAD_TYPE = "report", "email"
MODES = {"on": "1", "off": "0"}  # QUEUELOG_NOTIFY
MODE_NAMES = {"on": "notifications on", "off": "QUEUELOG_NOTIFY=0 (peeking)"}
CONDITIONS = {
    "idle": "idle pair",
    "load": f"{LOAD_CLIENTS} clients enqueuing {LOAD_TYPE} on A, {LOAD_PACE:g} jobs/s each",
    "saturating": f"{LOAD_CLIENTS} clients enqueuing {LOAD_TYPE} on A as fast as it answers",
}
# The background enqueues of each loaded condition: jobs/s per client (None: no pause).
LOAD_PACES: dict[str, float | None] = {"load": LOAD_PACE, "saturating": None}
KEYS = {"producer-0": "producer", "producer-1": "producer", "worker-0": "worker"}
# A statement line of the server log, with log_line_prefix '%m [%p] %q%u@%d ': the backend's
# pid, the database, and the statement as log_statement writes it ("statement: ..." for the
# simple protocol, "execute <name>: ..." for the extended one).
STATEMENT = re.compile(r"\[(\d+)\] \S*@(\S+) LOG:  (?:statement|execute [^:]*): (.*)$")
PREFIX_HINT = "log_line_prefix must hold %d (the shipped Debian one, '%m [%p] %q%u@%d ', does)"


# -- hosts: a TMPDIR of their own ----------------------------------------------------------------

@contextlib.contextmanager
def host_directories(count: int) -> Iterator[list[str]]:
    """`count` short temporary directories, one per simulated host: each server's TMPDIR, so
    that each has its own wake directory and listening turn. They are made under /tmp, not
    under TMPDIR: a deep TMPDIR (a test's) leaves no room for a socket's path, and the app
    then falls back to /tmp for every host alike, which would make the two hosts one."""
    paths = [tempfile.mkdtemp(prefix="qlw-", dir="/tmp") for _ in range(count)]
    try:
        yield paths
    finally:
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)


def listening_turn_held(tmpdir: str) -> bool:
    """Whether a process of the host whose TMPDIR is `tmpdir` holds its listening turn (the
    flock beside its wake directory, app/storage/listener.py)."""
    # Named queuelog-listener-*.lock beside the wake directory (earlier: the directory's name
    # plus .listener.lock).
    paths = (glob.glob(os.path.join(tmpdir, "queuelog-listener-*.lock"))
             + glob.glob(os.path.join(tmpdir, "queuelog-wake-*.listener.lock")))
    for path in paths:
        with open(path, "rb") as lock_file:
            try:
                fcntl.flock(lock_file, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(lock_file, fcntl.LOCK_UN)
    return False


def wait_for_listeners(tmpdirs: list[str], timeout: float = 30.0) -> int:
    """How many of these hosts hold their listening turn, once all do or `timeout` passed."""
    deadline = time.monotonic() + timeout
    while True:
        held = sum(listening_turn_held(tmpdir) for tmpdir in tmpdirs)
        if held == len(tmpdirs) or time.monotonic() > deadline:
            return held
        time.sleep(0.2)


# -- 1. idle statements --------------------------------------------------------------------------

def default_postgres_log() -> str | None:
    logs = sorted(glob.glob("/var/log/postgresql/*.log"), key=os.path.getmtime)
    return logs[-1] if logs else None


def log_problem(path: str | None) -> str | None:
    """Why the server log cannot be counted from, or None."""
    if path is None:
        return "no PostgreSQL log found (give --postgres-log)"
    if not os.access(path, os.R_OK):
        return f"{path} is not readable"
    return None


@contextlib.contextmanager
def logged_database(server_url: str) -> Iterator[tuple[str, str]]:
    """A fresh migrated database whose sessions log every statement (log_statement = 'all' on
    this database alone, for the sessions that start after); dropped after, its setting with
    it. Yields (url, name). No stand-in autovacuum here: its statements would be counted, and
    an idle database has nothing to vacuum."""
    with postgres_database(server_url, stand_in=False) as url:
        name = make_url(url).database
        admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(text(f"ALTER DATABASE \"{name}\" SET log_statement = 'all'"))
        finally:
            admin.dispose()
        yield url, name or ""


def normalized(statement: str) -> str:
    text = " ".join(statement.split())
    return text if len(text) <= 90 else text[:87] + "..."


@dataclass
class IdleFigures:
    rates: dict[tuple[int, str], Spread] = field(default_factory=dict)
    listeners: dict[tuple[int, str], Spread] = field(default_factory=dict)
    # The last repeat's statements per second by statement, notifications on: {workers: {..}}
    by_statement: dict[int, dict[str, float]] = field(default_factory=dict)
    # The last repeat's backends (sessions) that sent anything, by configuration.
    sessions: dict[tuple[int, str], int] = field(default_factory=dict)


def measure_idle(server_url: str, log_path: str, sizes: Sizes, repeat: int,
                 figures: IdleFigures) -> None:
    """One repeat: every configuration (workers x notifications on/off) served at once, each
    on a database and TMPDIR of its own, counted over the same window."""
    configurations = [(workers, mode) for workers in sizes.idle_workers for mode in MODES]
    if repeat % 2:
        configurations.reverse()
    with scratch_directory("queuelog-bench-wakes-idle-") as directory, \
            host_directories(len(configurations)) as tmpdirs, contextlib.ExitStack() as stack:
        names = {}
        for (workers, mode), tmpdir in zip(configurations, tmpdirs, strict=True):
            url, name = stack.enter_context(logged_database(server_url))
            names[name] = (workers, mode)
            stack.enter_context(queuelog_server(
                directory, url, TMPDIR=tmpdir, GUNICORN_WORKERS=str(workers),
                QUEUELOG_NOTIFY=MODES[mode]))
        on_hosts = [tmpdir for (_, mode), tmpdir in zip(configurations, tmpdirs, strict=True)
                    if mode == "on"]
        wait_for_listeners(on_hosts)
        time.sleep(sizes.idle_warmup)
        held = {config: listening_turn_held(tmpdir)
                for config, tmpdir in zip(configurations, tmpdirs, strict=True)}
        start = os.path.getsize(log_path)
        began = time.monotonic()
        time.sleep(sizes.idle_window)
        end = os.path.getsize(log_path)
        seconds = time.monotonic() - began
        with open(log_path, "rb") as log:
            log.seek(start)
            lines = log.read(max(end - start, 0)).decode(errors="replace").splitlines()
    counts: collections.Counter[tuple[int, str]] = collections.Counter()
    texts: dict[int, collections.Counter[str]] = {
        w: collections.Counter() for w in sizes.idle_workers}
    backends: dict[tuple[int, str], set[str]] = collections.defaultdict(set)
    for line in lines:
        found = STATEMENT.search(line)
        if found is None or found.group(2) not in names:
            continue
        config = names[found.group(2)]
        counts[config] += 1
        backends[config].add(found.group(1))
        if config[1] == "on":
            texts[config[0]][normalized(found.group(3))] += 1
    for config in configurations:
        figures.rates.setdefault(config, Spread()).add(counts[config] / seconds)
        figures.listeners.setdefault(config, Spread()).add(int(held[config]))
        figures.sessions[config] = len(backends[config])
    figures.by_statement = {workers: {statement: count / seconds
                                      for statement, count in counter.items()}
                            for workers, counter in texts.items()}
    print(f"repeat {repeat + 1}: idle statements/s " + ", ".join(
        f"{workers} worker(s) {mode} {counts[(workers, mode)] / seconds:.2f}"
        for workers, mode in sorted(configurations)), file=sys.stderr, flush=True)


def idle_tables(figures: IdleFigures, sizes: Sizes, report: Report) -> None:
    table = Table(f"Idle host: statements/s PostgreSQL received from the host's database, "
                  f"{sizes.idle_window:.0f} s window after a {sizes.idle_warmup:.0f} s "
                  "warm-up, no request (median [min-max] over repeats)",
                  ["gunicorn workers", "notifications on", "QUEUELOG_NOTIFY=0 (peeking)",
                   "on / off", "listening turn held (on / off)", "sessions heard (on / off)"])
    for workers in sizes.idle_workers:
        on, off = figures.rates[(workers, "on")], figures.rates[(workers, "off")]
        ratio = Spread([a / b if b else float("nan")
                        for a, b in zip(on.values, off.values, strict=True)])
        table.add(workers, on.show(2), off.show(2), ratio.show(2),
                  f"{figures.listeners[(workers, 'on')].median:.0f} / "
                  f"{figures.listeners[(workers, 'off')].median:.0f}",
                  f"{figures.sessions[(workers, 'on')]} / {figures.sessions[(workers, 'off')]}")
        report.targets.append(Target(
            f"idle host, {workers} worker(s), notifications on: statements/s",
            f"≤ {IDLE_GOAL:g}", on.show(2), on.median <= IDLE_GOAL))
    report.tables.append(table)
    totals: collections.Counter[str] = collections.Counter()
    for rates in figures.by_statement.values():
        totals.update(rates)
    breakdown = Table("What an idle host sends with notifications on: statements/s by "
                      "statement (the last repeat; the 8 most frequent)",
                      ["statement", *(f"{workers} worker(s)" for workers in sizes.idle_workers)])
    for statement, _ in totals.most_common(8):
        breakdown.add(f"`{statement.replace('|', '¦')}`",
                      *(f"{figures.by_statement[w].get(statement, 0.0):.2f}"
                        for w in sizes.idle_workers))
    if not totals:
        breakdown.add("(none)", *("0" for _ in sizes.idle_workers))
    report.tables.append(breakdown)


# -- 2. cross-host wake latency ------------------------------------------------------------------

def _enqueue_loop(port: int, tokens: list[str], threads: int, first: int, pace: float | None,
                  stop: Any, done: Any) -> None:
    """A forked client process: `threads` keep-alive clients enqueueing LOAD_TYPE jobs on `port`
    until `stop` is set, each `pace` jobs/s (None: one after another); adds the jobs enqueued
    to `done`. Exits 1 on an error."""
    failed: list[str] = []

    def run(index: int) -> None:
        client = Client(port, tokens[(first + index) % len(tokens)])
        n = 0
        # Spread over the period, so that the clients' enqueues do not come in bursts.
        next_at = time.perf_counter() + (random.uniform(0, 1 / pace) if pace else 0.0)
        try:
            while not stop.is_set():
                if pace is not None:
                    time.sleep(max(0.0, next_at - time.perf_counter()))
                    next_at += 1 / pace
                client.call("POST", "/jobs", job_body(n), expect=(201,))
                n += 1
        except Exception as error:  # the parent reads the exit code
            failed.append(repr(error))
        finally:
            client.close()
            with done.get_lock():
                done.value += n

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if failed:
        print(f"background enqueue failed: {failed[0]}", file=sys.stderr, flush=True)
        os._exit(1)
    os._exit(0)


class BackgroundEnqueues:
    """LOAD_CLIENTS clients enqueueing one job per POST /jobs on a server, in forked processes
    (one per core, as bench/load.py's), from enter to exit, each `pace` jobs/s (None: as fast
    as the server answers); `rate` is their jobs/s."""

    def __init__(self, port: int, tokens: list[str], pace: float | None) -> None:
        self.port, self.tokens, self.pace = port, tokens, pace
        self.context = multiprocessing.get_context("fork")
        self.stop = self.context.Event()
        self.done = self.context.Value("q", 0)
        self.children: list[Any] = []
        self.rate = 0.0
        self.began = 0.0

    def __enter__(self) -> BackgroundEnqueues:
        processes = max(1, min(LOAD_CLIENTS, os.cpu_count() or 1))
        first = 0
        for i in range(processes):
            share = LOAD_CLIENTS // processes + (1 if i < LOAD_CLIENTS % processes else 0)
            child = self.context.Process(target=_enqueue_loop, daemon=True, args=(
                self.port, self.tokens, share, first, self.pace, self.stop, self.done))
            child.start()
            self.children.append(child)
            first += share
        self.began = time.perf_counter()
        time.sleep(1.0)  # the load under way before the first wake
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for child in self.children:
            child.join(timeout=30)
            if child.is_alive():
                child.kill()
        self.rate = self.done.value / (time.perf_counter() - self.began)
        if exc[0] is None and any(child.exitcode != 0 for child in self.children):
            raise HttpError("a background enqueue client failed (see its output above)")


def one_wake(a_port: int, b_port: int, producer: Client, worker_token: str, n: int) -> float:
    """ms from host A's 201 for a WAKE_TYPE job (read by the producer) to the answer of the
    claim waiting for it on host B. Negative when B answered first."""
    waiter = Client(b_port, worker_token)
    waiter.conn.connect()  # a new connection: whichever of B's workers accepts it waits
    answered: dict[str, Any] = {}

    def wait_for_job() -> None:
        try:
            status, job = waiter.call("POST", "/jobs/claim", {
                "types": [WAKE_TYPE], "wait_seconds": CLAIM_WAIT_SECONDS}, expect=(200, 204))
            answered.update(at=time.perf_counter(), status=status, job=job)
        except Exception as error:  # the caller reports it
            answered["error"] = repr(error)

    try:
        waiting = threading.Thread(target=wait_for_job, daemon=True)
        waiting.start()
        time.sleep(SETTLE_SECONDS + random.uniform(0, POLL_SECONDS))
        _, enqueued = producer.call("POST", "/jobs", {"type": WAKE_TYPE, "payload": {"n": n}},
                                    expect=(201,))
        committed = time.perf_counter()
        waiting.join(CLAIM_WAIT_SECONDS + 10)
        if answered.get("status") != 200:
            raise HttpError(f"wake {n}: the claim waiting on host B answered "
                            f"{answered or 'nothing'} for the job enqueued on host A")
        job = answered["job"]
        if job["id"] != enqueued["id"]:
            raise HttpError(f"wake {n}: host B's claim took job {job['id']}, not "
                            f"{enqueued['id']}")
        # Done with, as a worker would be (not timed): no lease left to run out and hand the
        # job to a later wake's claim.
        waiter.call("POST", f"/jobs/{job['id']}/complete",
                    {"lease_token": job["lease_token"], "result": {"ok": True}}, expect=(200,))
    finally:
        waiter.close()
    return ms(answered["at"] - committed)


@dataclass
class Pair:
    """Two hosts on one database, with the keys their clients use."""

    a: GunicornServer
    b: GunicornServer
    tokens: dict[str, str]


@dataclass
class WakeFigures:
    p50: dict[tuple[str, str], Spread] = field(default_factory=dict)
    p99: dict[tuple[str, str], Spread] = field(default_factory=dict)
    worst: dict[tuple[str, str], Spread] = field(default_factory=dict)
    load_rate: dict[tuple[str, str], Spread] = field(default_factory=dict)
    listeners: dict[str, int] = field(default_factory=dict)


def wake_samples(pair: Pair, count: int) -> list[float]:
    producer = Client(pair.a.port, pair.tokens["producer-0"])
    try:
        return [one_wake(pair.a.port, pair.b.port, producer, pair.tokens["worker-0"], n)
                for n in range(count)]
    finally:
        producer.close()


def measure_wakes(pairs: dict[str, Pair], sizes: Sizes, repeat: int,
                  figures: WakeFigures) -> None:
    order = list(MODES) if repeat % 2 == 0 else list(reversed(MODES))
    for condition in CONDITIONS:
        for mode in order:
            pair = pairs[mode]
            with contextlib.ExitStack() as stack:
                load = None
                if condition in LOAD_PACES:
                    load = stack.enter_context(BackgroundEnqueues(
                        pair.a.port, [pair.tokens["producer-0"], pair.tokens["producer-1"]],
                        LOAD_PACES[condition]))
                samples = wake_samples(pair, sizes.wakes)
            key = (condition, mode)
            figures.p50.setdefault(key, Spread()).add(percentile(samples, 50))
            figures.p99.setdefault(key, Spread()).add(percentile(samples, 99))
            figures.worst.setdefault(key, Spread()).add(max(samples))
            if load is not None:
                figures.load_rate.setdefault(key, Spread()).add(load.rate)
            print(f"repeat {repeat + 1}: wake, {CONDITIONS[condition]}, {MODE_NAMES[mode]}: "
                  f"p50 {percentile(samples, 50):.1f} ms, p99 {percentile(samples, 99):.1f} ms"
                  + (f", background {load.rate:,.0f} jobs/s" if load is not None else ""),
                  file=sys.stderr, flush=True)


def wake_tables(figures: WakeFigures, sizes: Sizes, report: Report) -> None:
    table = Table(f"Cross-host wake: ms from host A's 201 (the enqueue's commit) to the answer "
                  f"of the claim waiting on host B, {sizes.wakes} wakes per repeat "
                  "(median [min-max] over repeats)",
                  ["condition", "mode", "p50 ms", "p99 ms", "max ms",
                   "background enqueues on A, jobs/s", "listening turns held"])
    for condition, label in CONDITIONS.items():
        for mode in MODES:
            key = (condition, mode)
            table.add(label, MODE_NAMES[mode], figures.p50[key].show(1),
                      figures.p99[key].show(1), figures.worst[key].show(1),
                      figures.load_rate[key].show() if condition in LOAD_PACES else "-",
                      f"{figures.listeners[mode]} of 2")
    report.tables.append(table)
    for condition, label in CONDITIONS.items():
        p99 = figures.p99[(condition, "on")]
        report.targets.append(Target(f"cross-host wake p99, notifications on, {label}",
                                     f"≤ {WAKE_GOAL_MS:g} ms", p99.show(1, " ms"),
                                     p99.median <= WAKE_GOAL_MS))


# -- 3. enqueue throughput -----------------------------------------------------------------------

@dataclass
class ThroughputFigures:
    rates: dict[str, Spread] = field(default_factory=dict)
    p99: dict[str, Spread] = field(default_factory=dict)
    lock_waits: dict[str, Spread] = field(default_factory=dict)
    ratio: Spread = field(default_factory=Spread)


class LockWaits:
    """While entered, samples every SAMPLE_SECONDS how many sessions of one database wait for a
    lock on a shared object (pg_stat_activity: wait_event_type 'Lock', wait_event 'object').
    The commit of a transaction that sent a NOTIFY takes one such lock, server-wide, and holds
    it until its commit record is flushed (PostgreSQL's async.c, PreCommit_Notify): notifying
    commits go one at a time. `mean` is the mean count over the samples."""

    SAMPLE_SECONDS = 0.05

    def __init__(self, server_url: str, database: str) -> None:
        from sqlalchemy import create_engine

        self.engine = create_engine(server_url, isolation_level="AUTOCOMMIT")
        self.database = database
        self.samples: list[int] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        from sqlalchemy import text

        with self.engine.connect() as conn:
            while not self.stopped.wait(self.SAMPLE_SECONDS):
                self.samples.append(conn.execute(text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = :name"
                    " AND wait_event_type = 'Lock' AND wait_event = 'object'"),
                    {"name": self.database}).scalar_one())

    @property
    def mean(self) -> float:
        return sum(self.samples) / len(self.samples) if self.samples else 0.0

    def __enter__(self) -> LockWaits:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join()
        self.engine.dispose()


def measure_throughput(servers: dict[str, tuple[GunicornServer, list[str], str]],
                       server_url: str, sizes: Sizes, repeat: int,
                       figures: ThroughputFigures) -> None:
    order = list(MODES) if repeat % 2 == 0 else list(reversed(MODES))
    rates = {}
    for mode in order:
        server, tokens, database = servers[mode]
        with LockWaits(server_url, database) as waits:
            result = run_load(enqueue_one.__name__, server.port, tokens, clients=LOAD_CLIENTS,
                              operations=sizes.enqueues, max_seconds=MAX_SECONDS)
        rates[mode] = result.jobs_per_second
        figures.rates.setdefault(mode, Spread()).add(result.jobs_per_second)
        figures.p99.setdefault(mode, Spread()).add(result.p99_ms)
        figures.lock_waits.setdefault(mode, Spread()).add(waits.mean)
    figures.ratio.add(rates["on"] / rates["off"])
    print(f"repeat {repeat + 1}: enqueue at {LOAD_CLIENTS} clients: " + ", ".join(
        f"{MODE_NAMES[mode]} {rates[mode]:,.0f} jobs/s" for mode in order),
        file=sys.stderr, flush=True)


def throughput_tables(figures: ThroughputFigures, sizes: Sizes, report: Report) -> None:
    table = Table(f"Enqueue, one job per POST /jobs, {LOAD_CLIENTS} clients, one server, "
                  f"{sizes.enqueues:,} jobs per run (median [min-max] over repeats)",
                  ["mode", "jobs/s", "p99 ms", "on / off",
                   "sessions waiting for the notify commit lock (mean of samples)"])
    for mode in MODES:
        table.add(MODE_NAMES[mode], figures.rates[mode].show(), figures.p99[mode].show(1),
                  figures.ratio.show(2) if mode == "on" else "1",
                  figures.lock_waits[mode].show(2))
    report.tables.append(table)
    report.targets.append(Target("enqueue jobs/s, notifications on / off", f"≥ {RATIO_GOAL}",
                                 figures.ratio.show(2), figures.ratio.median >= RATIO_GOAL))


# -- the script ----------------------------------------------------------------------------------

def idle_not_measured(report: Report, why: str, sizes: Sizes) -> None:
    """The idle table, saying why it holds no figure."""
    idle = Table("Idle host: statements/s PostgreSQL received from the host's database",
                 ["gunicorn workers", "notifications on", "QUEUELOG_NOTIFY=0 (peeking)"])
    for workers in sizes.idle_workers:
        idle.add(workers, f"not measured: {why}", "-")
    report.tables.append(idle)


def measure_idle_part(options: Any, server_url: str, sizes: Sizes, report: Report) -> None:
    log_path = options.postgres_log or default_postgres_log()
    why = log_problem(log_path)
    idle = IdleFigures()
    if why is None:
        assert log_path is not None
        for repeat in range(options.repeats):
            measure_idle(server_url, log_path, sizes, repeat, idle)
        if not any(spread.median > 0 for spread in idle.rates.values()):
            why = f"no statement of the benchmark's databases found in {log_path}: {PREFIX_HINT}"
    if why is None:
        idle_tables(idle, sizes, report)
    else:
        idle_not_measured(report, why, sizes)


def measure_wake_part(options: Any, server_url: str, directory: str, sizes: Sizes,
                      report: Report) -> None:
    figures = WakeFigures()
    with host_directories(2 * len(MODES)) as tmpdirs, contextlib.ExitStack() as stack:
        spare = iter(tmpdirs)
        pairs = {}
        for mode, notify in MODES.items():
            url = stack.enter_context(postgres_database(server_url))
            tokens = create_keys(url, KEYS)
            hosts = [next(spare), next(spare)]
            a, b = (stack.enter_context(queuelog_server(directory, url, TMPDIR=tmpdir,
                                                        QUEUELOG_NOTIFY=notify))
                    for tmpdir in hosts)
            figures.listeners[mode] = wait_for_listeners(hosts, 30.0 if mode == "on" else 0.0)
            pairs[mode] = Pair(a, b, tokens)
        for repeat in range(options.repeats):
            measure_wakes(pairs, sizes, repeat, figures)
    wake_tables(figures, sizes, report)


def measure_throughput_part(options: Any, server_url: str, directory: str, sizes: Sizes,
                            report: Report) -> None:
    from sqlalchemy.engine import make_url

    figures = ThroughputFigures()
    with host_directories(len(MODES)) as tmpdirs, contextlib.ExitStack() as stack:
        servers = {}
        for (mode, notify), tmpdir in zip(MODES.items(), tmpdirs, strict=True):
            url = stack.enter_context(postgres_database(server_url))
            tokens = create_keys(url, KEYS)
            server = stack.enter_context(queuelog_server(directory, url, TMPDIR=tmpdir,
                                                         QUEUELOG_NOTIFY=notify))
            servers[mode] = (server, [tokens["producer-0"], tokens["producer-1"]],
                             make_url(url).database or "")
        for repeat in range(options.repeats):
            measure_throughput(servers, server_url, sizes, repeat, figures)
    throughput_tables(figures, sizes, report)


def measure(options: Any) -> Report:
    sizes = SMOKE if options.smoke else FULL
    report = Report("Database wakes: idle statements, cross-host wakes, enqueue cost",
                    "python bench/wakes.py", options.smoke, options.repeats)
    load = os.getloadavg()
    server_url = os.environ.get(POSTGRES_VARIABLE)
    if server_url is None:
        print(f"wakes: {POSTGRES_VARIABLE} is not set; PostgreSQL only: nothing measured",
              flush=True)
        why = f"set {POSTGRES_VARIABLE} (PostgreSQL only)"
        idle_not_measured(report, why, sizes)
        others = Table("Cross-host wakes and enqueue cost", ["part", "measured"])
        others.add("cross-host wake latency", f"not measured: {why}")
        others.add("enqueue jobs/s, notifications on / off", f"not measured: {why}")
        report.tables.append(others)
        return report
    measure_idle_part(options, server_url, sizes, report)
    with scratch_directory("queuelog-bench-wakes-") as directory:
        measure_wake_part(options, server_url, directory, sizes, report)
        measure_throughput_part(options, server_url, directory, sizes, report)

    report.notes += [
        load_note(load, "a shared 2-core machine: the servers, the clients and PostgreSQL "
                        "share the 2 cores"),
        "Every server runs the shipped gunicorn.conf.py (workers = cores unless "
        "GUNICORN_WORKERS says otherwise, 16 threads) with a TMPDIR of its own, so that each "
        "is a host of its own: its own wake directory and listening turn (the flock beside "
        "it). 'Listening turn held' reads that flock from outside: 1 where a process of the "
        "host listens, 0 where none does (as it should be with QUEUELOG_NOTIFY=0).",
        "Idle: every configuration (1, 2, 4 workers x notifications on / off) is served at "
        "once, each on a fresh migrated database, counted over the same window; each count "
        "is the lines of that database in the PostgreSQL server's own log with "
        "log_statement = 'all' set on that database alone (ALTER DATABASE ... SET, dropped "
        "with it): every statement any session sends, by either protocol. The only requests "
        "are gunicorn's readiness check (GET /readyz) before the warm-up. 'Sessions heard' "
        "is the number of database sessions that sent anything during the window (the last "
        "repeat).",
        "Wakes: the claim (POST /jobs/claim, types [report], wait_seconds 10, a worker key) "
        f"is sent to host B on a new connection, {SETTLE_SECONDS * 1000:.0f} ms (plus a "
        "random 0-50 ms) before a producer enqueues one report job on host A; the figure "
        "is B's claim answer minus the moment the producer read A's 201; the claimed job is "
        "then completed (not timed). Both pairs (on, "
        "off) run side by side on databases of their own and take turns. Under load, "
        f"{LOAD_CLIENTS} client threads (in forked processes) enqueue email jobs on A, one "
        f"per POST, for the whole run of wakes, {LOAD_PACE:g} jobs/s each (paced) or one "
        "after another (saturating: on 2 cores the servers, PostgreSQL and the clients then "
        "want more CPU than there is, and the wake's processes wait their turn for a core). "
        "With notifications on, those commits notify nobody: no process waits for an email "
        "job (job_waiters), so the triggers send nothing for them. A negative figure is a "
        "claim on B that answered before the producer had read A's 201 (the commit reached "
        "B first; A's answer was slow to come back).",
        "Throughput: bench/http_single.py's enqueue scenario through bench/load.py, one "
        "server per mode, each on a database of its own, in alternating order; the ratio is "
        "the same repeat's on / off. The last column samples, every 50 ms during each "
        "run, the server's sessions of that database waiting for a lock on a shared object: "
        "the lock PostgreSQL's commit of a transaction that sent a NOTIFY takes, "
        "server-wide, until its commit record is flushed (async.c, PreCommit_Notify), so "
        "that notifying commits, their WAL flush included, go one at a time.",
        "A PostgreSQL server running with autovacuum = off gets the bench's stand-in "
        "(bench/data.py) on the wake and throughput databases; not on the idle ones, whose "
        "statements it would add to the count.",
    ]
    return report


def add_arguments(parser: Any) -> None:
    parser.add_argument("--postgres-log", default=None,
                        help="the PostgreSQL server's log, read to count the idle statements "
                             "(default: the newest /var/log/postgresql/*.log)")


def main(argv: list[str] | None = None) -> None:
    started = time.monotonic()
    options = parse_options((__doc__ or "").splitlines()[0], argv, add_arguments=add_arguments)
    finish(measure(options), options, started)


if __name__ == "__main__":
    main()
