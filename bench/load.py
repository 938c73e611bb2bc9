"""The load generator: keep-alive HTTP clients in forked processes running a scenario against
a loopback server, bounded in count and time, with each operation's latency.
"""

from __future__ import annotations

import http.client
import json
import multiprocessing
import os
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.jobs.wake.waiting import POLL_SECONDS
from bench.stats import ms, percentile

LOOPBACK = "127.0.0.1"


class HttpError(RuntimeError):
    pass


class Client:
    """One keep-alive connection, as one producer or worker process would hold."""

    def __init__(self, port: int, token: str | None = None) -> None:
        self.conn = http.client.HTTPConnection(LOOPBACK, port, timeout=60)
        self.headers = {"Content-Type": "application/json"}
        if token is not None:
            self.headers["Authorization"] = f"Bearer {token}"

    def call(self, method: str, path: str, body: Any = None,
             expect: tuple[int, ...] = (200, 201)) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        try:
            self.conn.request(method, path, body=data, headers=self.headers)
            response = self.conn.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException):
            # The server closed an idle keep-alive connection: reconnect once.
            self.conn.close()
            self.conn.request(method, path, body=data, headers=self.headers)
            response = self.conn.getresponse()
            raw = response.read()
        if response.status not in expect:
            raise HttpError(f"{method} {path} answered {response.status}: {raw[:300]!r}")
        return response.status, (json.loads(raw) if raw else None)

    def close(self) -> None:
        self.conn.close()


# A scenario is one unit of work of one client: it makes its requests on the client it is
# given and returns how many jobs they moved. Scenarios are module-level functions, named in
# SCENARIOS, so that client processes can run them after a fork.
Scenario = Callable[[Client, Mapping[str, Any]], int]
SCENARIOS: dict[str, Scenario] = {}


def scenario(function: Scenario) -> Scenario:
    SCENARIOS[function.__name__] = function
    return function


@dataclass
class LoadResult:
    operations: int
    jobs: int
    seconds: float
    latencies: list[float]
    errors: list[str]
    client_cpu_seconds: float

    @property
    def jobs_per_second(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else 0.0

    @property
    def operations_per_second(self) -> float:
        return self.operations / self.seconds if self.seconds > 0 else 0.0

    @property
    def p50_ms(self) -> float:
        return ms(percentile(self.latencies, 50))

    @property
    def p99_ms(self) -> float:
        return ms(percentile(self.latencies, 99))


def _client_process(name: str, ports: list[int], tokens: list[str], params: Mapping[str, Any],
                    threads: int, first_client: int, budget: Any, start: Any, stop_at: Any,
                    ready: Any, results: Any) -> None:
    work = SCENARIOS[name]
    latencies: list[float] = []
    jobs = [0]
    errors: list[str] = []
    lock = threading.Lock()
    clients = [Client(ports[(first_client + i) % len(ports)],
                      tokens[(first_client + i) % len(tokens)]) for i in range(threads)]
    for client in clients:
        client.conn.connect()
    cpu_before = time.process_time()

    def run(client: Client, index: int) -> None:
        context = dict(params, client_index=first_client + index)
        mine: list[float] = []
        moved = 0
        start.wait()
        deadline = stop_at.value
        while time.perf_counter() < deadline:
            with budget.get_lock():
                if budget.value <= 0:
                    break
                budget.value -= 1
            began = time.perf_counter()
            try:
                moved += work(client, context)
            except Exception as exc:  # reported to the caller, which fails the run
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}")
                break
            mine.append(time.perf_counter() - began)
        with lock:
            latencies.extend(mine)
            jobs[0] += moved

    workers = [threading.Thread(target=run, args=(client, i), daemon=True)
               for i, client in enumerate(clients)]
    for worker in workers:
        worker.start()
    ready.put(os.getpid())
    for worker in workers:
        worker.join()
    finished = time.perf_counter()
    for client in clients:
        client.close()
    results.put((latencies, jobs[0], errors, finished, time.process_time() - cpu_before))


def run_load(name: str, port: int | Sequence[int], tokens: Sequence[str], *, clients: int,
             operations: int, max_seconds: float, params: Mapping[str, Any] | None = None,
             processes: int | None = None) -> LoadResult:
    """`clients` concurrent clients, each on its own keep-alive connection, running the
    scenario `name` until `operations` have started or `max_seconds` have passed. Given
    several ports (servers over one database), the clients take them in turn.

    The clients are threads spread over a few forked processes (one per core by default),
    so that one Python process's GIL does not cap the load the clients can offer.
    Latency is per operation: from before its first request to after its last response.
    """
    context = multiprocessing.get_context("fork")
    processes = max(1, min(clients, processes or os.cpu_count() or 1))
    budget = context.Value("q", operations)
    start = context.Event()
    stop_at = context.Value("d", 0.0)
    ready = context.Queue()
    results = context.Queue()
    shares = [clients // processes + (1 if i < clients % processes else 0)
              for i in range(processes)]
    children = []
    first = 0
    ports = [port] if isinstance(port, int) else list(port)
    for share in shares:
        child = context.Process(target=_client_process, daemon=True, args=(
            name, ports, list(tokens), dict(params or {}), share, first, budget, start,
            stop_at, ready, results))
        child.start()
        children.append(child)
        first += share
    try:
        for _ in children:
            ready.get(timeout=60)
        began = time.perf_counter()
        stop_at.value = began + max_seconds
        start.set()
        latencies: list[float] = []
        jobs, errors, last, cpu = 0, [], began, 0.0
        for _ in children:
            part, moved, failed, finished, used = results.get(timeout=max_seconds + 120)
            latencies += part
            jobs += moved
            errors += failed
            last = max(last, finished)
            cpu += used
    finally:
        for child in children:
            child.join(timeout=10)
            if child.is_alive():
                child.kill()
    if errors:
        raise HttpError(f"{len(errors)} client(s) failed; first: {errors[0]}")
    return LoadResult(len(latencies), jobs, last - began, latencies, errors, cpu)


def settle(seconds: float) -> None:
    """Sleep `seconds` and a random part of the waiting requests' peek period. A settle that is
    a multiple of the period lines their peek up with the change that follows it, and hides a
    wake that failed: its sample shows a few ms instead of up to POLL_SECONDS."""
    time.sleep(seconds + random.uniform(0, POLL_SECONDS))
