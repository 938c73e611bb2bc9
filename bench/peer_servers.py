"""Peer servers: queuelog over HTTP beside the queues a Python team would pick instead —
procrastinate on the same PostgreSQL and RQ on the local Redis — in the same run, in turns:

1. enqueue, one job per call, 8 client threads (over one process per core, as
   bench/load.py spreads queuelog's clients): queuelog POST /jobs (SQLite and PostgreSQL
   servers), procrastinate `defer` (its psycopg connector), RQ `Queue.enqueue_call`;
2. enqueue, 1,000 jobs per call, 8 client threads: queuelog POST /jobs/batch,
   procrastinate `batch_defer`, RQ `Queue.enqueue_many` (one pipeline);
3. dequeue + ack of N pre-enqueued jobs by one worker process per core: queuelog worker
   processes claiming and completing (one job per request, and claim-many + complete-many
   100 per request), procrastinate's worker (App.run_worker_async, no-op async task,
   wait=False: it ends when the queue is empty), RQ burst workers (SimpleWorker, and the
   forking Worker users get by default), no-op function. The time is from the start signal
   to the last worker's end.

Each figure is jobs per second; each queuelog figure is divided by the peer's of the same
repeat.

    PYTHONPATH=. python bench/peer_servers.py [--smoke] [--repeats N]

procrastinate runs when QUEUELOG_BENCH_POSTGRES_URL names a PostgreSQL server (databases of
its own, dropped after); RQ when Redis answers at QUEUELOG_BENCH_REDIS_URL (default
redis://127.0.0.1:6379/12: that db only is flushed, before and after). Either is skipped,
with a printed line, when its server or package is missing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import logging
import multiprocessing
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/peer_servers.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.data import (
    POSTGRES_VARIABLE,
    create_keys,
    engine_databases,
    fill_queue,
    job_body,
    scratch_directory,
)
from bench.http_batch import claim_complete_many, enqueue_batch  # noqa: F401 (scenarios)
from bench.http_single import claim_complete_one, enqueue_one  # noqa: F401 (scenarios)
from bench.load import run_load
from bench.report import Report, Table, Target, load_note, run_script
from bench.servers import queuelog_server
from bench.stats import Spread
from tests.servers import GunicornServer

REDIS_VARIABLE = "QUEUELOG_BENCH_REDIS_URL"
# A db number of its own on the shared Redis: the script flushes this db, and only it.
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/12"
CLIENTS = 8
WORKERS = os.cpu_count() or 1  # worker processes draining a queue: one per core
BATCH = 1000  # jobs per batch enqueue call, every queue
CLAIM_MANY = 100  # jobs per claim-many and complete-many request
MAX_SECONDS = 60.0
# The task / function every peer runs: it does nothing, so the queue's own cost is measured.
RQ_FUNCTION = "bench.peer_servers.rq_noop"
KEYS = {"producer-0": "producer", "producer-1": "producer", "worker-0": "worker",
        "worker-1": "worker"}


@dataclass(frozen=True)
class Sizes:
    single: int  # jobs per one-at-a-time enqueue run
    batch: int  # jobs per batch enqueue run (a multiple of BATCH)
    drain: int  # jobs per dequeue + ack run, one job at a time
    drain_many: int  # jobs per claim-many + complete-many run (a multiple of CLAIM_MANY)
    forking_drain: int  # jobs per run of RQ's forking Worker (a fork per job)


# Sized for a run of at most 6 minutes (3 repeats) on a 2-core machine others load too (load
# average up to 12): the one-at-a-time drains run at 30-500 jobs/s there, the batch routes
# at thousands.
FULL = Sizes(single=1_500, batch=16_000, drain=1_000, drain_many=4_000, forking_drain=300)
SMOKE = Sizes(single=40, batch=1_000, drain=100, drain_many=200, forking_drain=20)


def payload(n: int) -> dict[str, Any]:
    """The payload every queue carries: queuelog's job_body's."""
    return dict(job_body(n)["payload"])


def rq_noop(**_payload: Any) -> None:
    """RQ's job: nothing (the queue's own cost is what is measured)."""


# -- the peers' clients: one process's producers, opened after the fork -------------------------

class Producer:
    """A peer's producer in one client process: `open` after the fork, then each of the
    process's threads calls `send`, which enqueues one call's jobs and returns their count."""

    def open(self, threads: int) -> None:
        raise NotImplementedError

    def send(self, thread: int) -> int:
        raise NotImplementedError

    def close(self) -> None:
        pass


def procrastinate_app(conninfo: str, pool_size: int) -> Any:
    """A procrastinate App on `conninfo` with its psycopg connector and the no-op task."""
    import procrastinate

    # It warns of an App made in a script's __main__ (a task name that may not resolve in
    # another process); the workers here are forks that resolve "noop" from app.tasks.
    logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(
        conninfo=conninfo, min_size=pool_size, max_size=pool_size))

    @app.task(name="noop", queue="bench")
    async def noop(**_payload: Any) -> None:
        """Nothing: async, so the worker runs it on its event loop without a thread hop."""

    return app


class ProcrastinateDefer(Producer):
    def __init__(self, conninfo: str, batch: int) -> None:
        self.conninfo, self.batch = conninfo, batch

    def open(self, threads: int) -> None:
        # The sync pool (SyncPsycopgConnector, which PsycopgConnector hands sync calls to):
        # a connection per thread, as queuelog's servers give each request thread one.
        self.app = procrastinate_app(self.conninfo, threads).open()
        self.task = self.app.tasks["noop"]

    def send(self, thread: int) -> int:
        if self.batch == 1:
            self.task.defer(**payload(thread))
        else:
            self.task.batch_defer(*[payload(thread) for _ in range(self.batch)])
        return self.batch

    def close(self) -> None:
        self.app.close()


class RqEnqueue(Producer):
    def __init__(self, url: str, queue: str, batch: int) -> None:
        self.url, self.queue_name, self.batch = url, queue, batch

    def open(self, threads: int) -> None:
        from redis import Redis
        from rq import Queue

        # One client per process; redis-py's pool gives each thread a connection.
        self.queue = Queue(self.queue_name, connection=Redis.from_url(self.url))

    def send(self, thread: int) -> int:
        if self.batch == 1:
            self.queue.enqueue_call(RQ_FUNCTION, kwargs=payload(thread))
        else:
            self.queue.enqueue_many([self.queue.prepare_data(RQ_FUNCTION, kwargs=payload(thread))
                                     for _ in range(self.batch)])
        return self.batch

    def close(self) -> None:
        self.queue.connection.close()


def _producer_process(producer: Producer, threads: int, first: int, budget: Any, start: Any,
                      ready: Any, results: Any) -> None:
    jobs, errors = [0], list[str]()
    lock = threading.Lock()
    try:
        producer.open(threads)
    except Exception as exc:  # reported to the parent, which fails the run
        ready.put(os.getpid())
        results.put((0, [f"open: {type(exc).__name__}: {exc}"], time.perf_counter()))
        return

    def run(index: int) -> None:
        moved = 0
        start.wait()
        while True:
            with budget.get_lock():
                if budget.value <= 0:
                    break
                budget.value -= 1
            try:
                moved += producer.send(first + index)
            except Exception as exc:
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}")
                break
        with lock:
            jobs[0] += moved

    workers = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(threads)]
    for worker in workers:
        worker.start()
    ready.put(os.getpid())
    for worker in workers:
        worker.join()
    finished = time.perf_counter()
    producer.close()
    results.put((jobs[0], errors, finished))


def run_producers(producer: Producer, *, clients: int, calls: int) -> float:
    """`clients` threads, spread over one forked process per core as bench/load.py spreads
    queuelog's HTTP clients, making `calls` calls in all; returns jobs/s."""
    context = multiprocessing.get_context("fork")
    processes = max(1, min(clients, WORKERS))
    budget, start = context.Value("q", calls), context.Event()
    ready, results = context.Queue(), context.Queue()
    shares = [clients // processes + (1 if i < clients % processes else 0)
              for i in range(processes)]
    children, first = [], 0
    for share in shares:
        child = context.Process(target=_producer_process, daemon=True,
                                args=(producer, share, first, budget, start, ready, results))
        child.start()
        children.append(child)
        first += share
    try:
        for _ in children:
            ready.get(timeout=60)
        began = time.perf_counter()
        start.set()
        jobs, errors, last = 0, [], began
        for _ in children:
            moved, failed, finished = results.get(timeout=MAX_SECONDS + 120)
            jobs, errors, last = jobs + moved, errors + failed, max(last, finished)
    finally:
        for child in children:
            child.join(timeout=10)
            if child.is_alive():
                child.kill()
    if errors:
        raise RuntimeError(f"{len(errors)} producer thread(s) failed; first: {errors[0]}")
    return jobs / (last - began)


# -- the peers' workers: one process per core, draining a pre-filled queue ----------------------

def _procrastinate_worker(conninfo: str, announce: Callable[[], None], start: Any) -> float:
    app = procrastinate_app(conninfo, 2)

    async def drain() -> float:
        async with app.open_async():
            announce()
            await asyncio.get_running_loop().run_in_executor(None, start.wait)
            # wait=False: ends once a fetch finds the queue empty. No LISTEN: the queue is
            # full before the start, so a notification could not wake it sooner.
            await app.run_worker_async(queues=["bench"], wait=False, concurrency=1,
                                       listen_notify=False, install_signal_handlers=False)
            return time.perf_counter()

    return float(asyncio.run(drain()))


def _rq_worker(url: str, queue: str, forking: bool, announce: Callable[[], None],
               start: Any) -> float:
    from redis import Redis
    from rq import Queue, SimpleWorker, Worker

    # The job's module, imported once here: the forking Worker's work horses inherit it
    # instead of importing it for every job.
    importlib.import_module(RQ_FUNCTION.rpartition(".")[0])
    connection = Redis.from_url(url)
    base = Worker if forking else SimpleWorker

    class PromptWorker(base):
        """RQ's worker, whose command channel's listener polls each 0.2 s rather than 60 s.
        RQ unsubscribes at its teardown and then stops the listener; redis-py 8's stop()
        waits for the listener's thread, which may have gone back to waiting up to its poll
        time for a subscription, so a burst worker otherwise ended up to 60 s after its last
        job (seen: 2 jobs/s drained for 100 jobs). The channel is still listened to."""

        def subscribe(self) -> None:
            self.pubsub = self.connection.pubsub()
            self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
            self.pubsub_thread = self.pubsub.run_in_thread(
                sleep_time=0.2, daemon=True,
                exception_handler=self._pubsub_exception_handler)

    worker = PromptWorker([Queue(queue, connection=connection)], connection=connection)
    announce()
    start.wait()
    # WARNING: RQ's default INFO writes two lines per job to the terminal.
    worker.work(burst=True, logging_level="WARNING")
    return time.perf_counter()


def _worker_process(body: Callable[..., float], args: tuple[Any, ...], ready: Any, start: Any,
                    results: Any) -> None:
    """Run one worker `body(*args, announce, start)`; its end time, or its error, goes to
    `results` (and `ready` hears from it even when it fails before announcing itself)."""
    announced = []

    def announce() -> None:
        ready.put(os.getpid())
        announced.append(True)

    try:
        results.put((body(*args, announce, start), None))
    except BaseException as exc:  # reported to the parent, which fails the run
        if not announced:
            ready.put(os.getpid())
        results.put((0.0, f"{type(exc).__name__}: {exc}"))


def run_workers(body: Callable[..., float], *args: Any) -> float:
    """WORKERS processes each running `body(*args, announce, start)` from one start signal;
    returns the seconds until the last one ended."""
    context = multiprocessing.get_context("fork")
    ready, start, results = context.Queue(), context.Event(), context.Queue()
    children = [context.Process(target=_worker_process, daemon=True,
                                args=(body, args, ready, start, results))
                for _ in range(WORKERS)]
    for child in children:
        child.start()
    try:
        for _ in children:
            ready.get(timeout=60)
        began = time.perf_counter()
        start.set()
        ends = [results.get(timeout=MAX_SECONDS * 5) for _ in children]
    finally:
        for child in children:
            child.join(timeout=10)
            if child.is_alive():
                child.kill()
    errors = [error for _, error in ends if error is not None]
    if errors:
        raise RuntimeError(f"{len(errors)} worker(s) failed; first: {errors[0]}")
    return max(ended for ended, _ in ends) - began


# -- the stores ---------------------------------------------------------------------------------

def redis_url() -> str:
    return os.environ.get(REDIS_VARIABLE, DEFAULT_REDIS_URL)


def missing_package(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return True
    return False


def redis_reason() -> str | None:
    """Why RQ cannot be measured here, or None."""
    if missing_package("rq"):
        return "rq is not installed (pip install '.[bench]')"
    from redis import Redis
    from redis.exceptions import RedisError

    try:
        Redis.from_url(redis_url(), socket_connect_timeout=2).ping()
    except RedisError as exc:
        return f"Redis does not answer at {redis_url()} ({type(exc).__name__})"
    return None


def procrastinate_reason() -> str | None:
    if missing_package("procrastinate"):
        return "procrastinate is not installed (pip install '.[bench]')"
    if not os.environ.get(POSTGRES_VARIABLE):
        return f"{POSTGRES_VARIABLE} is not set"
    return None


@contextlib.contextmanager
def procrastinate_database(server_url: str) -> Iterator[str]:
    """A fresh database with procrastinate's schema on the server at `server_url` (a
    SQLAlchemy URL, as the other benchmarks take), dropped after; yields its conninfo."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"procrastinate_bench_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    conninfo = (make_url(server_url).set(drivername="postgresql", database=name)
                .render_as_string(hide_password=False))
    try:
        app = procrastinate_app(conninfo, 1).open()
        try:
            app.schema_manager.apply_schema()
        finally:
            app.close()
        yield conninfo
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def procrastinate_sql(conninfo: str, statement: str, autocommit: bool = False) -> list[Any]:
    import psycopg

    with psycopg.connect(conninfo, autocommit=autocommit) as conn:
        cursor = conn.execute(statement)
        return cursor.fetchall() if cursor.description else []


def fill_procrastinate(conninfo: str, count: int) -> None:
    """`count` jobs of the no-op task, through batch_defer (set-up, not measured)."""
    app = procrastinate_app(conninfo, 1).open()
    try:
        for start in range(0, count, BATCH):
            app.tasks["noop"].batch_defer(*[payload(n)
                                             for n in range(start, min(count, start + BATCH))])
    finally:
        app.close()
    # The server runs without autovacuum (queuelog's databases get bench/data.py's
    # stand-in); the peer's table gets the same care by hand, before each drain.
    procrastinate_sql(conninfo, "VACUUM ANALYZE procrastinate_jobs", autocommit=True)


def procrastinate_todo(conninfo: str) -> int:
    return int(procrastinate_sql(
        conninfo, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo'")[0][0])


def fill_rq(url: str, queue: str, count: int) -> Any:
    from redis import Redis
    from rq import Queue

    rq_queue = Queue(queue, connection=Redis.from_url(url))
    for start in range(0, count, BATCH):
        rq_queue.enqueue_many([rq_queue.prepare_data(RQ_FUNCTION, kwargs=payload(n))
                               for n in range(start, min(count, start + BATCH))])
    return rq_queue


def start_servers(directory: str, urls: list[str],
                  stack: contextlib.ExitStack) -> list[GunicornServer]:
    """A queuelog server on each of `urls`, launched at once (each launch mostly waits for
    its workers to answer), every one that started stopped when `stack` closes."""
    with concurrent.futures.ThreadPoolExecutor(len(urls)) as pool:
        futures = [pool.submit(queuelog_server, directory, url) for url in urls]
    for future in futures:
        if future.exception() is None:
            stack.enter_context(future.result())
    for future in futures:
        if (error := future.exception()) is not None:
            raise error
    return [future.result() for future in futures]


# -- the contestants -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Contestant:
    key: str
    label: str  # the queue and how it is driven
    store: str
    short: str  # its name in the ratio rows


ENQUEUE_ONE = "enqueue, one job per call"
ENQUEUE_BATCH = f"enqueue, {BATCH:,} jobs per call"
DRAIN = f"dequeue + ack, {WORKERS} worker process(es)"
PHASES = (ENQUEUE_ONE, ENQUEUE_BATCH, DRAIN)


def contestants(engines: list[str], procrastinate: bool,
                redis: bool) -> dict[str, list[Contestant]]:
    by_phase: dict[str, list[Contestant]] = {phase: [] for phase in PHASES}
    for engine in engines:
        by_phase[ENQUEUE_ONE].append(Contestant(
            f"queuelog-{engine}", "queuelog POST /jobs", engine,
            f"queuelog enqueue, {engine}"))
        by_phase[ENQUEUE_BATCH].append(Contestant(
            f"queuelog-{engine}", "queuelog POST /jobs/batch", engine,
            f"queuelog batch enqueue, {engine}"))
        by_phase[DRAIN] += [
            Contestant(f"queuelog-{engine}", "queuelog claim + complete, 1 per request",
                       engine, f"queuelog claim + complete, {engine}"),
            Contestant(f"queuelog-many-{engine}",
                       f"queuelog claim-many + complete-many, {CLAIM_MANY} per request",
                       engine, f"queuelog claim-many + complete-many, {engine}")]
    if procrastinate:
        by_phase[ENQUEUE_ONE].append(Contestant(
            "procrastinate", "procrastinate defer", "PostgreSQL", "procrastinate defer"))
        by_phase[ENQUEUE_BATCH].append(Contestant(
            "procrastinate", "procrastinate batch_defer", "PostgreSQL",
            "procrastinate batch defer"))
        by_phase[DRAIN].append(Contestant(
            "procrastinate", "procrastinate worker (async no-op task)", "PostgreSQL",
            "procrastinate worker"))
    if redis:
        by_phase[ENQUEUE_ONE].append(Contestant(
            "rq", "RQ Queue.enqueue_call", "Redis", "RQ enqueue"))
        by_phase[ENQUEUE_BATCH].append(Contestant(
            "rq", "RQ Queue.enqueue_many (one pipeline)", "Redis", "RQ enqueue_many"))
        by_phase[DRAIN] += [
            Contestant("rq", "RQ SimpleWorker, burst (no fork)", "Redis",
                       "RQ SimpleWorker"),
            Contestant("rq-forking", "RQ Worker, burst (the default: a fork per job)",
                       "Redis", "RQ Worker (forking, the default)")]
    return by_phase


# (queuelog contestant, peer contestant, phase, goal): the ratios reported. Rows whose goal
# is "> 1" are the targets: ahead of procrastinate on both engines' batch routes.
def ratio_rows(engines: list[str]) -> list[tuple[str, str, str, str]]:
    rows = []
    for engine in engines:
        rows += [
            (f"queuelog-{engine}", "procrastinate", ENQUEUE_ONE, "none (for information)"),
            (f"queuelog-{engine}", "procrastinate", ENQUEUE_BATCH, "> 1"),
            (f"queuelog-{engine}", "procrastinate", DRAIN, "none (for information)"),
            (f"queuelog-many-{engine}", "procrastinate", DRAIN, "> 1"),
        ]
    for engine in engines:
        rows += [
            (f"queuelog-{engine}", "rq", ENQUEUE_ONE, "none: says where Redis is ahead"),
            (f"queuelog-{engine}", "rq", ENQUEUE_BATCH, "none: says where Redis is ahead"),
            (f"queuelog-{engine}", "rq", DRAIN, "none: says where Redis is ahead"),
            (f"queuelog-many-{engine}", "rq", DRAIN, "none: says where Redis is ahead"),
            (f"queuelog-{engine}", "rq-forking", DRAIN, "none: says where Redis is ahead"),
            (f"queuelog-many-{engine}", "rq-forking", DRAIN,
             "none: says where Redis is ahead"),
        ]
    return rows


def measure(options: Any) -> Report:
    sizes = SMOKE if options.smoke else FULL
    report = Report("Peer servers: queuelog over HTTP beside procrastinate and RQ",
                    "python bench/peer_servers.py", options.smoke, options.repeats)
    load = os.getloadavg()
    skipped = {"procrastinate": procrastinate_reason(), "RQ": redis_reason()}
    for peer, reason in skipped.items():
        if reason is not None:
            print(f"{peer}: skipped ({reason})", flush=True)
    rates: dict[tuple[str, str], Spread] = {}
    ratios: dict[tuple[str, str, str], Spread] = {}
    rq_url = redis_url()
    with scratch_directory("queuelog-bench-peer-servers-") as directory, \
            contextlib.ExitStack() as stack:
        # Two servers per engine: one only enqueued to, one only drained, so that the jobs
        # each enqueue run leaves pending never reach a drain (the peers' stores likewise).
        urls = engine_databases(directory, stack, "enqueue.sqlite3")
        drain_urls = engine_databases(directory, stack, "drain.sqlite3")
        engines = list(urls)
        tokens = {engine: create_keys(url, KEYS) for engine, url in urls.items()}
        drain_tokens = {engine: create_keys(url, KEYS) for engine, url in drain_urls.items()}
        started = start_servers(directory, [*urls.values(), *drain_urls.values()], stack)
        servers = dict(zip(engines, started[:len(engines)], strict=True))
        drain_servers = dict(zip(engines, started[len(engines):], strict=True))
        pg_enqueue = pg_drain = ""
        if skipped["procrastinate"] is None:
            server_url = os.environ[POSTGRES_VARIABLE]
            pg_enqueue = stack.enter_context(procrastinate_database(server_url))
            pg_drain = stack.enter_context(procrastinate_database(server_url))
        rq_run = uuid.uuid4().hex[:8]
        if skipped["RQ"] is None:
            from redis import Redis

            redis = Redis.from_url(rq_url)
            redis.flushdb()  # this db only: the script's own (REDIS_VARIABLE)
            stack.callback(redis.flushdb)
        by_phase = contestants(engines, skipped["procrastinate"] is None,
                               skipped["RQ"] is None)

        def producers(engine: str) -> list[str]:
            return [tokens[engine]["producer-0"], tokens[engine]["producer-1"]]

        def run(phase: str, contestant: Contestant) -> float:
            key, engine = contestant.key, contestant.store
            if phase == ENQUEUE_ONE:
                if key.startswith("queuelog"):
                    return run_load("enqueue_one", servers[engine].port, producers(engine),
                                    clients=CLIENTS, operations=sizes.single,
                                    max_seconds=MAX_SECONDS).jobs_per_second
                producer: Producer = (ProcrastinateDefer(pg_enqueue, 1) if key == "procrastinate"
                                      else RqEnqueue(rq_url, f"enqueue-{rq_run}", 1))
                return run_producers(producer, clients=CLIENTS, calls=sizes.single)
            if phase == ENQUEUE_BATCH:
                calls = sizes.batch // BATCH
                if key.startswith("queuelog"):
                    return run_load("enqueue_batch", servers[engine].port, producers(engine),
                                    clients=CLIENTS, operations=calls, max_seconds=MAX_SECONDS,
                                    params={"size": BATCH}).jobs_per_second
                producer = (ProcrastinateDefer(pg_enqueue, BATCH) if key == "procrastinate"
                            else RqEnqueue(rq_url, f"enqueue-{rq_run}", BATCH))
                return run_producers(producer, clients=CLIENTS, calls=calls)
            return drain(contestant)

        def drain(contestant: Contestant) -> float:
            key, engine = contestant.key, contestant.store
            many = key.startswith("queuelog-many")
            count = (sizes.forking_drain if key == "rq-forking"
                     else sizes.drain_many if many else sizes.drain)
            if key.startswith("queuelog"):
                port = drain_servers[engine].port
                fill_queue(port, drain_tokens[engine]["producer-0"], count)
                result = run_load(
                    "claim_complete_many" if many else "claim_complete_one", port,
                    [drain_tokens[engine]["worker-0"], drain_tokens[engine]["worker-1"]],
                    clients=WORKERS, processes=WORKERS,
                    operations=count // CLAIM_MANY if many else count,
                    max_seconds=MAX_SECONDS, params={"size": CLAIM_MANY})
                if result.jobs != count:
                    raise RuntimeError(f"{contestant.label}: {result.jobs} of {count} jobs")
                return result.jobs_per_second
            if key == "procrastinate":
                fill_procrastinate(pg_drain, count)
                seconds = run_workers(_procrastinate_worker, pg_drain)
                left = procrastinate_todo(pg_drain)
            else:
                queue = f"drain-{rq_run}-{key}"
                rq_queue = fill_rq(rq_url, queue, count)
                seconds = run_workers(_rq_worker, rq_url, queue, key == "rq-forking")
                left = rq_queue.count + rq_queue.failed_job_registry.count
                rq_queue.connection.close()
            if left:
                raise RuntimeError(f"{contestant.label}: {left} jobs not done")
            return count / seconds

        for repeat in range(options.repeats):
            done: dict[tuple[str, str], float] = {}
            for phase in PHASES:
                order = by_phase[phase]
                shift = repeat % len(order)
                for contestant in order[shift:] + order[:shift]:
                    rate = done[(contestant.key, phase)] = run(phase, contestant)
                    rates.setdefault((contestant.key, phase), Spread()).add(rate)
                    print(f"repeat {repeat + 1}: {phase}: {contestant.label} "
                          f"({contestant.store}) {rate:,.0f} jobs/s", file=sys.stderr,
                          flush=True)
                if skipped["RQ"] is None and phase != DRAIN:
                    from redis import Redis
                    from rq import Queue

                    Queue(f"enqueue-{rq_run}", connection=Redis.from_url(rq_url)).empty()
            for ours, peer, phase, _ in ratio_rows(engines):
                if (ours, phase) in done and (peer, phase) in done:
                    ratios.setdefault((ours, peer, phase), Spread()).add(
                        done[(ours, phase)] / done[(peer, phase)])

    table = Table("Jobs/s (median [min-max] over repeats)",
                  ["operation", "queue, as driven", "store", "jobs/s"])
    for phase in PHASES:
        for contestant in by_phase[phase]:
            table.add(phase, contestant.label, contestant.store,
                      rates[(contestant.key, phase)].show())
    report.tables.append(table)
    labels = {(c.key, phase): c.short for phase in PHASES for c in by_phase[phase]}
    ratio_table = Table("queuelog / peer, each repeat's pair (median [min-max])",
                        ["row", "queuelog / peer", "goal"])
    for ours, peer, phase, goal in ratio_rows(engines):
        if (ours, peer, phase) not in ratios:
            continue
        spread = ratios[(ours, peer, phase)]
        name = f"{labels[(ours, phase)]} / {labels[(peer, phase)]}"
        ratio_table.add(name, spread.show(2), goal)
        if goal == "> 1":
            report.targets.append(Target(name, "> 1", spread.show(2), spread.median > 1))
    if not ratio_table.rows:
        ratio_table.add("(no peer measured here: see the notes)", "-", "-")
    report.tables.append(ratio_table)
    ahead = [f"{labels[(peer, phase)]} beside {labels[(ours, phase)]} "
             f"(queuelog at {ratios[(ours, peer, phase)].median:.2f}x of it)"
             for ours, peer, phase, goal in ratio_rows(engines)
             if peer.startswith("rq") and (ours, peer, phase) in ratios
             and ratios[(ours, peer, phase)].median < 1]
    if skipped["RQ"] is None:
        report.notes.append("Where Redis (RQ) is ahead: " + ("; ".join(ahead) if ahead
                                                             else "nowhere in this run") + ".")
    report.notes += [
        f"Enqueue: {CLIENTS} client threads over {min(CLIENTS, WORKERS)} forked processes for "
        "every queue (bench/load.py's spread for queuelog's HTTP clients; the same for the "
        "peers' library calls). queuelog's servers are real gunicorn with the shipped "
        "gunicorn.conf.py, on loopback; procrastinate talks to PostgreSQL through a pool of a "
        "connection per thread (PsycopgConnector, sync calls going to its "
        "SyncPsycopgConnector); RQ through redis-py's pool. Payload: job_body's (~90 bytes "
        "of JSON; RQ pickles it).",
        f"Dequeue + ack: N jobs enqueued first (not timed; {sizes.drain:,} per run, "
        f"{sizes.drain_many:,} for claim-many, {sizes.forking_drain:,} for RQ's forking "
        f"Worker), then {WORKERS} worker "
        "processes (one per core) started by one signal; the time runs to the last "
        "worker's end. queuelog: each worker process one keep-alive HTTP client claiming "
        "and completing (with a result); procrastinate: App.run_worker_async(wait=False, "
        "concurrency=1, listen_notify=False) per process, an async no-op task, jobs kept "
        "as 'succeeded' (delete_jobs='never', its default; queuelog keeps its completed "
        "jobs too); RQ: burst workers, a no-op function, logging at WARNING (its default "
        "INFO prints two lines per job), results kept for result_ttl (500 s, its default). "
        "Every drain is checked: nothing left to do, nothing failed.",
        "Acknowledgement differs: queuelog's claim holds a lease and the complete is a "
        "second committed write (synchronous=FULL on SQLite); procrastinate's fetch and "
        "finish are two transactions on PostgreSQL (synchronous_commit as the server sets "
        "it); RQ moves the job id between Redis lists and registries in memory, written to "
        "disk as the Redis server's persistence settings say (not fsynced per job by "
        "default): the Redis rows compare an in-memory store with durable ones.",
        "Each queue has stores of its own for enqueueing and for draining (queuelog: two "
        "servers per engine; procrastinate: two databases on the same PostgreSQL server as "
        "queuelog's; RQ: separate queues in one Redis db), so the jobs an enqueue run "
        "leaves never reach a drain. The PostgreSQL server runs without autovacuum: "
        "queuelog's databases get bench/data.py's stand-in, procrastinate's table a "
        "VACUUM ANALYZE before each drain.",
        "The contestants of each phase take turns in an order that rotates every repeat; "
        "each ratio divides two figures of the same repeat.",
        load_note(load),
    ]
    for peer, reason in skipped.items():
        if reason is not None:
            report.notes.append(f"{peer} not measured: {reason}.")
    return report


def main(argv: list[str] | None = None) -> None:
    run_script(measure, __doc__, argv)


if __name__ == "__main__":
    main()
