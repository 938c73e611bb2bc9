"""Waits (docs/WAITS.md): an event resuming many suspended jobs at once, the claim beside a
million suspended jobs, and a suspend + resume cycle against a plain fail + retry.

Three parts, on SQLite and (with QUEUELOG_BENCH_POSTGRES_URL set) on PostgreSQL:

- event resume: WOKEN jobs (10,000) of one producer suspended on the event "go" with key "k",
  then one POST /events of that producer to a real gunicorn server (the shipped
  gunicorn.conf.py); the time from sending the request to its answer, which comes after the
  commit that made every one of them pending (claimable at once). Checked after each repeat:
  the count of pending jobs carrying `resumed`, then every job claimed through
  /jobs/claim-many with `resumed.by` "event" and completed (the drain, shown beside). The
  suspended jobs are written by SQL exactly as POST /jobs/{id}/suspend leaves them (setup,
  not timed). Target: the answer within 1 s (p99 over the repeats).
- claims beside suspended jobs: the latency of a claim (JobRepository.claim_next_jobs in a
  write transaction through Database.run_write, as bench/depth.py times it) with 1,000,000
  suspended jobs stored beside 1,000 claimable ones, against the 1,000 claimable alone, the
  cases taking turns. Target: claims/s (from the p50 latencies) with the suspended jobs at
  least 0.95 of without.
- suspend cycle: 4 clients over HTTP, each on a job type of its own, each job taken through
  claim, suspend (waiting for an event keyed by the job), POST /events, claim, complete,
  against claim, fail (retry_in_seconds 0), claim, complete on the same server in turns;
  jobs/s of each and their ratio, and, with one client, each request of both cycles timed on
  its own. Informational: no target.

    PYTHONPATH=. python bench/waits.py [--smoke] [--repeats N] [--engines sqlite,postgresql]
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/waits.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import Connection, create_engine, text

from app.jobs.sql.repository import JobRepository
from app.storage.engine import Database, make_engine
from bench.data import (
    JOB_TYPES,
    RESULT,
    chosen_engines,
    create_keys,
    engine_database,
    engines_option,
    scratch_directory,
)
from bench.load import Client, HttpError, run_load, scenario
from bench.report import Report, Table, Target, finish, load_note, parse_options
from bench.servers import queuelog_server
from bench.stats import Spread, ms, percentile
from tests.servers import GunicornServer


@dataclass(frozen=True)
class Sizes:
    woken: int  # jobs one event resumes
    suspended: int  # suspended jobs beside the claimable ones
    claimable: int
    claims: int  # per case and repeat
    turn: int  # claims per case before the next case's turn
    cycles: int  # per run of a cycle (all clients together)
    cycle_seconds: float  # bound of a run of a cycle
    probe: int  # jobs of each cycle taken by one client, request by request, per repeat


FULL = Sizes(woken=10_000, suspended=1_000_000, claimable=1_000, claims=400, turn=10,
             cycles=1_200, cycle_seconds=20.0, probe=60)
SMOKE = Sizes(woken=200, suspended=5_000, claimable=100, claims=20, turn=5, cycles=40,
              cycle_seconds=5.0, probe=5)
DEFAULT_REPEATS = 5
RESUME_GOAL_SECONDS = 1.0
CLAIM_GOAL = 0.95
CLIENTS = 4
STREAMS = [f"stream-{i}" for i in range(CLIENTS)]
PRODUCER, WORKER = "producer-0", "worker-0"
KEYS = {PRODUCER: "producer", WORKER: "worker"}
EVENT, KEY = "go", "k"
# A wait's timeout far enough ahead that maintenance never resumes a job during the run.
TIMEOUT_SECONDS = 86_400
LEASE_US = 300 * 1_000_000


# -- suspended jobs, written as a suspend leaves them ---------------------------------------

def _series(dialect: str) -> tuple[str, str]:
    """(WITH clause, FROM clause) giving i = 0 .. :count - 1."""
    if dialect == "postgresql":
        return "", "generate_series(0, CAST(:count AS BIGINT) - 1) AS n(i)"
    return ("WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n "
            "WHERE i + 1 < :count) ", "n")


def insert_suspended(conn: Connection, count: int, job_type: str, *, one_key: bool) -> int:
    """`count` jobs of PRODUCER, each as POST /jobs/{id}/suspend with a wait for EVENT leaves
    it: status suspended, run_at as its enqueue made it (its moment is its wait's), no lease,
    no worker (its last lease token stays, as the suspend leaves it), its first attempt
    ended `suspended`, and its wait in job_waits, until its timeout: key KEY for every job
    (`one_key`) or a key of its own. The jobs'
    timeline (enqueued, claimed, suspended) is not written: nothing reads it on the way
    measured. Returns the first new id."""
    with_clause, from_clause = _series(conn.dialect.name)
    now = time.time_ns() // 1000
    # Enqueued an hour ago, one µs apart, claimed and suspended a minute ago.
    created, suspended = now - 3_600_000_000, now - 60_000_000
    after = conn.execute(text("SELECT COALESCE(MAX(id), 0) FROM jobs")).scalar_one()
    conn.execute(text(  # the clauses are this module's own
        "INSERT INTO jobs (type, payload, priority, status, retry_count, max_retries, "  # noqa: S608
        "producer, run_at, lease_token, created_at, updated_at) "
        f"{with_clause}"
        "SELECT :type, '{\"order\": ' || CAST(i AS TEXT) || '}', 10, 'suspended', 0, 3, "
        ":producer, CAST(:created AS BIGINT) + i, '00000000000000000000000000000000.1', "
        "CAST(:created AS BIGINT) + i, "
        f":suspended FROM {from_clause}"),
        {"type": job_type, "producer": PRODUCER, "count": count, "created": created,
         "suspended": suspended})
    key = ":key" if one_key else "'order-' || CAST(id AS TEXT)"
    conn.execute(text(
        "INSERT INTO job_waits (job_id, kind, producer, event_name, event_key, until_at, "  # noqa: S608
        f"suspended_at) SELECT id, 'event', producer, :name, {key}, :until, updated_at "
        "FROM jobs WHERE id > :after"),
        {"name": EVENT, "key": KEY, "after": after,
         "until": suspended + TIMEOUT_SECONDS * 1_000_000})
    conn.execute(text(
        "INSERT INTO job_attempts (job_id, number, worker_id, claimed_at, ended_at, outcome) "
        "SELECT id, 1, :worker, updated_at - 1000, updated_at, 'suspended' FROM jobs "
        "WHERE id > :after"), {"worker": WORKER, "after": after})
    return int(after) + 1


def insert_pending(conn: Connection, count: int) -> None:
    """`count` pending jobs, due, enqueued after the suspended ones."""
    with_clause, from_clause = _series(conn.dialect.name)
    now = time.time_ns() // 1000
    conn.execute(text(  # the clauses are this module's own
        "INSERT INTO jobs (type, payload, priority, status, retry_count, max_retries, "  # noqa: S608
        "producer, run_at, created_at, updated_at) "
        f"{with_clause}"
        "SELECT 'email', '{\"to\": \"user-' || CAST(i AS TEXT) || '@example.com\"}', "
        "CASE WHEN i % 4 = 0 THEN 20 ELSE 10 END, 'pending', 0, 3, :producer, "
        "CAST(:at AS BIGINT) + i, CAST(:at AS BIGINT) + i, CAST(:at AS BIGINT) + i "
        f"FROM {from_clause}"),
        {"producer": PRODUCER, "count": count, "at": now - 1_000_000_000})


def settle(url: str, tables: str = "jobs, job_waits, job_attempts") -> None:
    """After a bulk change: SQLite's WAL checkpointed; PostgreSQL's tables vacuumed and
    analyzed, as autovacuum would soon after it."""
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                conn.exec_driver_sql(f"VACUUM ANALYZE {tables}")
            else:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        engine.dispose()


# -- part 1: one event resumes many ---------------------------------------------------------

@dataclass
class Resumes:
    seconds: Spread = field(default_factory=Spread)
    drain: Spread = field(default_factory=Spread)
    setup: Spread = field(default_factory=Spread)


class Side:
    """One engine's database and server, with its keys, for the HTTP parts."""

    def __init__(self, engine: str, url: str, server: GunicornServer,
                 tokens: dict[str, str]) -> None:
        self.engine = engine
        self.url = url
        self.server = server
        self.tokens = tokens
        self.db = Database(make_engine(url))  # the app's engine: writes beside the server's

    def client(self, name: str) -> Client:
        return Client(self.server.port, self.tokens[name])

    def close(self) -> None:
        self.db.engine.dispose()


def resume_once(side: Side, count: int, figures: Resumes) -> float:
    """Suspend `count` jobs on EVENT/KEY (SQL), post the event, check and drain them."""
    began = time.monotonic()
    with side.db.write() as conn:
        first = insert_suspended(conn, count, "email", one_key=True)
    if side.db.dialect == "postgresql":
        settle(side.url, "jobs, job_waits")
    figures.setup.add(time.monotonic() - began)
    producer, worker = side.client(PRODUCER), side.client(WORKER)
    try:
        producer.conn.connect()
        began = time.perf_counter()
        _status, answer = producer.call("POST", "/events",
                                        {"name": EVENT, "key": KEY, "data": {"n": 1}},
                                        expect=(200,))
        seconds = time.perf_counter() - began
        if answer["woken"] != count:
            raise RuntimeError(f"{side.engine}: the event woke {answer['woken']}, not {count}")
        with side.db.read() as conn:
            pending = conn.execute(text(
                "SELECT COUNT(*) FROM jobs WHERE id >= :first AND status = 'pending' "
                "AND resumed IS NOT NULL"), {"first": first}).scalar_one()
        if pending != count:
            raise RuntimeError(f"{side.engine}: {pending} of {count} jobs pending after the "
                               "event's answer")
        began = time.perf_counter()
        drained = 0
        while True:
            _status, claimed = worker.call("POST", "/jobs/claim-many",
                                           {"max_jobs": 100, "types": ["email"]},
                                           expect=(200,))
            jobs = claimed["jobs"]
            if not jobs:
                break
            if any((job.get("resumed") or {}).get("by") != "event" for job in jobs):
                raise RuntimeError(f"{side.engine}: a claim carried no resumed by event")
            _status, done = worker.call("POST", "/jobs/complete-many", {"items": [
                {"id": job["id"], "lease_token": job["lease_token"], "result": RESULT}
                for job in jobs]}, expect=(200,))
            if any(result["status"] != 200 for result in done["results"]):
                raise RuntimeError(f"{side.engine}: complete-many refused some jobs")
            drained += len(jobs)
        if drained != count:
            raise RuntimeError(f"{side.engine}: drained {drained} of {count}")
        figures.drain.add(time.perf_counter() - began)
    finally:
        producer.close()
        worker.close()
    figures.seconds.add(seconds)
    return seconds


# -- part 2: claims beside suspended jobs ---------------------------------------------------

@dataclass(frozen=True)
class Store:
    claimable: int
    suspended: int = 0


def build_store(url: str, store: Store) -> float:
    """The store's jobs inserted by SQL (setup, not timed): the suspended ones first (older),
    then the claimable ones. Returns its seconds."""
    began = time.monotonic()
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "sqlite":
                conn.exec_driver_sql("PRAGMA synchronous=OFF")  # a bulk load
                conn.commit()
            with conn.begin():
                if store.suspended:
                    insert_suspended(conn, store.suspended, "report", one_key=False)
                insert_pending(conn, store.claimable)
    finally:
        engine.dispose()
    settle(url)
    seconds = time.monotonic() - began
    print(f"built {store} in {seconds:.1f} s", file=sys.stderr, flush=True)
    return seconds


class Runner:
    """One case's engine (the app's) and its timings, as bench/depth.py's."""

    def __init__(self, engine: str, label: str, url: str) -> None:
        self.engine = engine
        self.label = label
        self.db = Database(make_engine(url))
        self.statement: list[float] = []
        self.transaction: list[float] = []

    def step(self) -> None:
        inside: list[float] = []

        def claim_in(conn: Any) -> Any:
            now = time.time_ns() // 1000
            began = time.perf_counter()
            claimed = JobRepository(conn).claim_next_jobs(
                now_us=now, worker=WORKER, lease_expires_at=now + LEASE_US,
                nonce=secrets.token_hex(16), limit=1, types=None).jobs
            inside.append(time.perf_counter() - began)
            return claimed

        began = time.perf_counter()
        if not self.db.run_write(claim_in):
            raise RuntimeError(f"{self.engine}, {self.label}: nothing was claimable")
        self.transaction.append(time.perf_counter() - began)
        self.statement.extend(inside)

    def put_back(self) -> None:
        """Make the claimed jobs pending again (not timed): each repeat claims from as many."""
        with self.db.write() as conn:
            conn.exec_driver_sql(
                "UPDATE jobs SET status = 'pending', claimed_at = NULL, worker_id = NULL, "
                "lease_expires_at = NULL, lease_token = NULL WHERE status = 'running'")

    def close(self) -> None:
        self.db.engine.dispose()


@dataclass
class Claims:
    figures: dict[tuple[str, str, str], Spread] = field(default_factory=dict)
    ratios: dict[tuple[str, str], Spread] = field(default_factory=dict)
    build: dict[tuple[str, str], float] = field(default_factory=dict)

    def spread(self, engine: str, label: str, figure: str) -> Spread:
        return self.figures.setdefault((engine, label, figure), Spread())


def claim_cases(sizes: Sizes) -> list[tuple[str, Store]]:
    def count(n: int) -> str:
        return f"{n // 1_000_000}M" if n >= 1_000_000 and n % 1_000_000 == 0 else (
            f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n))

    alone = f"{count(sizes.claimable)} claimable"
    beside = f"{count(sizes.suspended)} suspended + {count(sizes.claimable)} claimable"
    return [(alone, Store(sizes.claimable)),
            (beside, Store(sizes.claimable, sizes.suspended))]


def measure_claims(engines: list[str], directory: str, sizes: Sizes,
                   repeats: int) -> Claims:
    result = Claims()
    cases = claim_cases(sizes)
    with contextlib.ExitStack() as stack:
        runners: list[Runner] = []
        for engine in engines:
            for label, store in cases:
                url = stack.enter_context(engine_database(
                    engine, directory, f"claims-{store.suspended}.sqlite3"))
                result.build[(engine, label)] = build_store(url, store)
                runner = Runner(engine, label, url)
                stack.callback(runner.close)
                runners.append(runner)
        for runner in runners:  # warm each engine and cache alike
            for _ in range(sizes.turn):
                runner.step()
            runner.put_back()
        for repeat in range(repeats):
            for runner in runners:
                runner.statement.clear()
                runner.transaction.clear()
            for turn in range(0, sizes.claims, sizes.turn):
                shift = (repeat + turn // sizes.turn) % len(runners)
                for runner in runners[shift:] + runners[:shift]:
                    for _ in range(min(sizes.turn, sizes.claims - turn)):
                        runner.step()
            for runner in runners:
                for figure, values in (("statement", runner.statement),
                                       ("transaction", runner.transaction)):
                    result.spread(runner.engine, runner.label, figure).add(
                        percentile(values, 50) * 1e6)
                    result.spread(runner.engine, runner.label, figure + "_p99").add(
                        percentile(values, 99) * 1e6)
                runner.put_back()
            (alone, _), (beside, _) = cases
            for engine in engines:
                for figure in ("statement", "transaction"):
                    # claims/s beside the suspended jobs over claims/s alone, from the p50s
                    result.ratios.setdefault((engine, figure), Spread()).add(
                        result.figures[(engine, alone, figure)].values[-1]
                        / result.figures[(engine, beside, figure)].values[-1])
            print(f"repeat {repeat + 1}: claim transaction p50 " + ", ".join(
                f"{r.engine} {r.label} "
                f"{result.figures[(r.engine, r.label, 'transaction')].values[-1]:,.0f} µs"
                for r in runners), file=sys.stderr, flush=True)
    return result


# -- part 3: the suspend cycle against fail + retry -----------------------------------------

_PRODUCERS = threading.local()


def _producer(context: Mapping[str, Any]) -> Client:
    """This client thread's producer connection (a worker's key cannot post events)."""
    client = getattr(_PRODUCERS, "client", None)
    if client is None:
        client = _PRODUCERS.client = Client(context["port"], context["producer"])
    return client


def _claim_own(client: Client, stream: str) -> Any:
    status, job = client.call("POST", "/jobs/claim", {"types": [stream]}, expect=(200, 204))
    return None if status == 204 else job


def _claim_again(client: Client, stream: str, job: Any, by: str) -> Any:
    again = _claim_own(client, stream)
    if again is None or again["id"] != job["id"]:
        raise HttpError(f"the second claim of {stream} took "
                        f"{None if again is None else again['id']}, not job {job['id']}")
    if by == "event" and (again.get("resumed") or {}).get("by") != "event":
        raise HttpError(f"job {job['id']}: its claim after the event carries no resumed")
    if by == "retry" and again["retry_count"] != 1:
        raise HttpError(f"job {job['id']}: retry_count {again['retry_count']} after a fail")
    return again


@scenario
def suspend_cycle(client: Client, context: Mapping[str, Any]) -> int:
    stream = STREAMS[context["client_index"]]
    job = _claim_own(client, stream)
    if job is None:
        return 0
    key = f"job-{job['id']}"
    client.call("POST", f"/jobs/{job['id']}/suspend", {
        "lease_token": job["lease_token"],
        "wait_for": {"event": EVENT, "key": key, "timeout_seconds": TIMEOUT_SECONDS}},
        expect=(200,))
    _status, posted = _producer(context).call(
        "POST", "/events", {"name": EVENT, "key": key, "data": {"paid": True}}, expect=(200,))
    if posted["woken"] != 1:
        raise HttpError(f"the event for job {job['id']} woke {posted['woken']}")
    again = _claim_again(client, stream, job, "event")
    client.call("POST", f"/jobs/{job['id']}/complete",
                {"lease_token": again["lease_token"], "result": RESULT}, expect=(200,))
    return 1


@scenario
def fail_cycle(client: Client, context: Mapping[str, Any]) -> int:
    stream = STREAMS[context["client_index"]]
    job = _claim_own(client, stream)
    if job is None:
        return 0
    client.call("POST", f"/jobs/{job['id']}/fail", {
        "lease_token": job["lease_token"], "error": "partner API timed out",
        "retry_in_seconds": 0}, expect=(200,))
    again = _claim_again(client, stream, job, "retry")
    client.call("POST", f"/jobs/{job['id']}/complete",
                {"lease_token": again["lease_token"], "result": RESULT}, expect=(200,))
    return 1


# Each cycle: what its requests are, and how many.
CYCLES = {"suspend_cycle": ("claim, suspend, POST /events, claim, complete", 5),
          "fail_cycle": ("claim, fail (retry_in_seconds 0), claim, complete", 4)}
SHORT = {"suspend_cycle": "suspend + event", "fail_cycle": "fail + retry"}


def fill_streams(side: Side, per_stream: int, streams: list[str] = STREAMS) -> None:
    """`per_stream` fresh jobs on each of these clients' own types (setup, not timed)."""
    producer = side.client(PRODUCER)
    try:
        for stream in streams:
            left = per_stream
            while left:
                size = min(left, 1000)
                producer.call("POST", "/jobs/batch", {"jobs": [
                    {"type": stream, "priority": "medium",
                     "payload": {"order": i, "stream": stream}} for i in range(size)]},
                    expect=(201,))
                left -= size
    finally:
        producer.close()


@dataclass
class Cycles:
    jobs: dict[tuple[str, str], Spread] = field(default_factory=dict)
    p50: dict[tuple[str, str], Spread] = field(default_factory=dict)
    p99: dict[tuple[str, str], Spread] = field(default_factory=dict)
    ratio: dict[str, Spread] = field(default_factory=dict)
    # (engine, cycle, request): the p50 ms of that request with one client
    requests: dict[tuple[str, str, str], Spread] = field(default_factory=dict)


# The columns of the one-client probe: each cycle's requests in order.
PROBED = ("claim", "suspend / fail", "POST /events", "claim again", "complete")


def probe_requests(side: Side, count: int, figures: Cycles) -> None:
    """One client, `count` jobs of each cycle on the first client's type, every request
    timed on its own: where the cycles' time goes, without the other clients' load."""
    fill_streams(side, count, STREAMS[:1])
    worker, producer = side.client(WORKER), side.client(PRODUCER)
    stream = STREAMS[0]
    seconds: dict[tuple[str, str], list[float]] = {}

    def timed(cycle: str, request: str, client: Client, *call: Any) -> Any:
        began = time.perf_counter()
        _status, answer = client.call(*call, expect=(200,))
        seconds.setdefault((cycle, request), []).append(time.perf_counter() - began)
        return answer

    try:
        for _ in range(count):
            for cycle in CYCLES:  # in turns
                claims = {"types": [stream]}
                job = timed(cycle, "claim", worker, "POST", "/jobs/claim", claims)
                if cycle == "suspend_cycle":
                    key = f"job-{job['id']}"
                    timed(cycle, "suspend / fail", worker, "POST", f"/jobs/{job['id']}/suspend", {
                        "lease_token": job["lease_token"], "wait_for": {
                            "event": EVENT, "key": key, "timeout_seconds": TIMEOUT_SECONDS}})
                    timed(cycle, "POST /events", producer, "POST", "/events",
                          {"name": EVENT, "key": key, "data": {"paid": True}})
                else:
                    timed(cycle, "suspend / fail", worker, "POST", f"/jobs/{job['id']}/fail", {
                        "lease_token": job["lease_token"], "error": "partner API timed out",
                        "retry_in_seconds": 0})
                again = timed(cycle, "claim again", worker, "POST", "/jobs/claim", claims)
                if again["id"] != job["id"]:
                    raise RuntimeError(f"{side.engine}: the probe's second claim took "
                                       f"{again['id']}, not {job['id']}")
                timed(cycle, "complete", worker, "POST", f"/jobs/{job['id']}/complete",
                      {"lease_token": again["lease_token"], "result": RESULT})
    finally:
        worker.close()
        producer.close()
    for (cycle, request), values in seconds.items():
        figures.requests.setdefault((side.engine, cycle, request), Spread()).add(
            ms(percentile(values, 50)))


def cycle_once(side: Side, sizes: Sizes, repeat: int, figures: Cycles) -> None:
    order = list(CYCLES) if repeat % 2 == 0 else list(reversed(CYCLES))
    rates = {}
    for name in order:
        # Enough for all the run's cycles if the clients share them unevenly.
        fill_streams(side, sizes.cycles // CLIENTS * 3 // 2 + 5)
        result = run_load(name, side.server.port, [side.tokens[WORKER]], clients=CLIENTS,
                          operations=sizes.cycles, max_seconds=sizes.cycle_seconds,
                          params={"port": side.server.port,
                                  "producer": side.tokens[PRODUCER]})
        rates[name] = result.jobs_per_second
        figures.jobs.setdefault((side.engine, name), Spread()).add(result.jobs_per_second)
        figures.p50.setdefault((side.engine, name), Spread()).add(result.p50_ms)
        figures.p99.setdefault((side.engine, name), Spread()).add(result.p99_ms)
    figures.ratio.setdefault(side.engine, Spread()).add(
        rates["suspend_cycle"] / rates["fail_cycle"])
    print(f"repeat {repeat + 1}: {side.engine} cycles: " + ", ".join(
        f"{name} {rate:,.0f} jobs/s" for name, rate in rates.items()),
        file=sys.stderr, flush=True)


@contextlib.contextmanager
def sides(engines: list[str], directory: str) -> Iterator[list[Side]]:
    with contextlib.ExitStack() as stack:
        found = []
        for engine in engines:
            url = stack.enter_context(engine_database(engine, directory, "http.sqlite3"))
            tokens = create_keys(url, KEYS)
            server = stack.enter_context(queuelog_server(
                directory, url, QUEUELOG_JOB_TYPES=",".join([JOB_TYPES, *STREAMS])))
            side = Side(engine, url, server, tokens)
            stack.callback(side.close)
            found.append(side)
        yield found


# -- the report -----------------------------------------------------------------------------

def measure(options: Any) -> Report:
    sizes = SMOKE if options.smoke else FULL
    engines = chosen_engines(options)
    report = Report("Waits: one event resuming many, claims beside suspended jobs, the "
                    "suspend cycle", "python bench/waits.py", options.smoke, options.repeats)
    load = os.getloadavg()
    resumes = {engine: Resumes() for engine in engines}
    cycles = Cycles()
    with scratch_directory("queuelog-bench-waits-") as directory:
        claims = measure_claims(engines, directory, sizes, options.repeats)
        with sides(engines, directory) as served:
            for side in served:  # warm each server: one small event, a short run of each cycle
                resume_once(side, min(100, sizes.woken), Resumes())
                cycle_once(side, replace(sizes, cycles=min(40, sizes.cycles)), 0, Cycles())
            for repeat in range(options.repeats):
                shift = repeat % len(served)
                for side in served[shift:] + served[:shift]:
                    seconds = resume_once(side, sizes.woken, resumes[side.engine])
                    print(f"repeat {repeat + 1}: {side.engine}: {sizes.woken:,} resumed in "
                          f"{ms(seconds):,.0f} ms", file=sys.stderr, flush=True)
                for side in served[shift:] + served[:shift]:
                    cycle_once(side, sizes, repeat, cycles)
                    probe_requests(side, sizes.probe, cycles)

    resume_table = Table(
        f"One POST /events resuming {sizes.woken:,} suspended jobs: ms from sending it to its "
        "answer (after the commit); median [min-max] and p99 over repeats",
        ["database", "jobs woken", "ms, median", "ms, p99", "drain: claim-many + "
         "complete-many, s", "setup by SQL, s"])
    for engine, figures in resumes.items():
        p99 = percentile(figures.seconds.values, 99)
        shown = Spread([ms(seconds) for seconds in figures.seconds.values])
        resume_table.add(engine, f"{sizes.woken:,}", shown.show(0), f"{ms(p99):,.0f}",
                         figures.drain.show(1), figures.setup.show(1))
        report.targets.append(Target(
            f"{engine}: {sizes.woken:,} jobs suspended on one event pending after POST "
            "/events, p99 over repeats", f"≤ {RESUME_GOAL_SECONDS:g} s",
            f"{p99:.3f} s (median {figures.seconds.median:.3f} s)",
            p99 <= RESUME_GOAL_SECONDS))
    report.tables.append(resume_table)

    claim_table = Table(
        f"Claim latency beside suspended jobs, µs ({sizes.claims} claims per case and "
        "repeat, in turns; median [min-max] over repeats). Claims/s ratio: the p50 alone / "
        "the p50 beside the suspended jobs, per repeat",
        ["database", "jobs stored", "statement p50", "statement p99", "claims/s ratio",
         "transaction p50", "transaction p99", "claims/s ratio", "build s"])
    cases = claim_cases(sizes)
    (alone, _), (beside, _) = cases
    for engine in engines:
        for label, _store in cases:
            def get(figure: str, engine: str = engine, label: str = label) -> str:
                return claims.figures[(engine, label, figure)].show()

            def ratio(figure: str, engine: str = engine, label: str = label) -> str:
                return "1" if label == alone else claims.ratios[(engine, figure)].show(2)

            claim_table.add(engine, label, get("statement"), get("statement_p99"),
                            ratio("statement"), get("transaction"), get("transaction_p99"),
                            ratio("transaction"), f"{claims.build[(engine, label)]:.0f}")
    report.tables.append(claim_table)
    for engine in engines:
        for figure, what in (("transaction", "claim transaction"),
                             ("statement", "claim statement (no commit)")):
            spread = claims.ratios[(engine, figure)]
            report.targets.append(Target(
                f"{engine}: claims/s from the {what} p50, {beside} / {alone}",
                f"≥ {CLAIM_GOAL}", spread.show(2), spread.median >= CLAIM_GOAL))

    cycle_table = Table(
        f"Suspend + resume cycle against fail + retry over HTTP: {CLIENTS} clients, each on "
        f"a job type of its own, up to {sizes.cycles:,} jobs per run (median [min-max] over "
        "repeats)",
        ["database", "cycle", "requests per job", "jobs/s", "p50 ms per job",
         "p99 ms per job", "suspend / fail jobs/s"])
    for engine in engines:
        for name, (label, requests) in CYCLES.items():
            cycle_table.add(engine, f"{SHORT[name]}: {label}", requests,
                            cycles.jobs[(engine, name)].show(),
                            cycles.p50[(engine, name)].show(1),
                            cycles.p99[(engine, name)].show(1),
                            cycles.ratio[engine].show(2) if name == "suspend_cycle" else "1")
    report.tables.append(cycle_table)
    request_table = Table(
        f"The cycles request by request: one client, {sizes.probe} jobs of each cycle per "
        "repeat in turns, p50 ms of each request (median [min-max] over repeats)",
        ["database", "cycle", *PROBED, "sum of p50s"])
    for engine in engines:
        for name in CYCLES:
            taken = [cycles.requests.get((engine, name, request)) for request in PROBED]
            total = sum(spread.median for spread in taken if spread is not None)
            request_table.add(engine, SHORT[name],
                              *["-" if spread is None else spread.show(1) for spread in taken],
                              f"{total:.1f}")
    report.tables.append(request_table)

    report.notes += [
        load_note(load, "a shared 2-core machine: the servers, the clients and PostgreSQL "
                        "share the 2 cores"),
        "Servers: the shipped gunicorn.conf.py over a fresh database per engine (SQLite with "
        "its defaults: WAL, synchronous=FULL, group commit; PostgreSQL on the same machine, "
        "the server's own settings), both up for the whole run; the engines take turns in "
        "each repeat.",
        f"Event resume: before each repeat {sizes.woken:,} jobs of {PRODUCER} are written "
        "by SQL as a suspend leaves them (status suspended, run_at as enqueued, no lease or "
        "worker, the attempt ended 'suspended', a job_waits row of kind event for "
        f"'{EVENT}' / '{KEY}' until its timeout a day ahead; their timeline events are left "
        "out), in one "
        "transaction through the app's engine beside the running server; PostgreSQL's "
        "tables are then analyzed (setup, not timed). The figure is one POST /events of "
        f"{PRODUCER}: the resume of every waiter (one UPDATE from suspended to pending, "
        "their waits resolved, their 'resumed' events and metrics) commits before the "
        "answer. Checked after it: the count of those jobs pending with `resumed`; then "
        "every one is claimed through /jobs/claim-many (100 a request, each carrying "
        "resumed.by 'event') and completed through /jobs/complete-many (the drain column).",
        f"Claims: the suspended jobs (each waiting for an event key of its own, its "
        "job_waits row and attempt beside it) are inserted by SQL before the claimable "
        "ones, in one statement each (SQLite at synchronous=OFF for the load only); "
        "PostgreSQL's tables are vacuumed and analyzed after. The claims then run through "
        "the app's engine and Database.run_write, one job per claim, as a lone POST "
        "/jobs/claim would; the cases (of both engines) take turns every "
        f"{sizes.turn} claims, and the claimed jobs are made pending again after each "
        "repeat. A suspended job is in no claim index (the claim's indexes are partial on "
        "status 'pending').",
        "Cycles: each client (a thread in forked processes, bench/load.py) claims only its "
        "own type (types [stream-N]), prefilled through /jobs/batch before each run; the "
        "second claim of each job must hand back the same job (with resumed.by 'event', or "
        "retry_count 1). The suspend cycle's extra request is the producer's POST /events "
        "(on a second keep-alive connection of the client: a worker's key posts no "
        "events); its suspend stands where the other's fail does. Both cycles run on the "
        "same server, in alternating order. No target: the figures say what a wait costs "
        "beside a retry.",
    ]
    return report


def main(argv: list[str] | None = None) -> None:
    started = time.monotonic()
    options = parse_options((__doc__ or "").splitlines()[0], argv,
                            default_repeats=DEFAULT_REPEATS, add_arguments=engines_option)
    finish(measure(options), options, started)


if __name__ == "__main__":
    main()
