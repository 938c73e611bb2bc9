"""Flow control under real concurrency (contract section 9): gunicorn with 4 workers over each
engine, and two gunicorn instances over one PostgreSQL database, hammered by 16 claiming
clients. What runs is sampled from outside the servers, straight from the database, while the
clients also record when each of them held a job (from the claim's answer to the sending of
its complete: an interval inside the job's true running interval, so their overlaps can only
undercount what ran at once)."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from tests.conftest import POSTGRES_URL_VARIABLE
from tests.e2e.client import QueueClient, server_errors
from tests.servers import LiveServer, create_api_key

pytestmark = pytest.mark.slow

CLIENTS = 16
HOLD_SECONDS = (0.005, 0.03)
RUN_TIMEOUT_SECONDS = 180

SETUPS = [
    pytest.param(("sqlite", 1), id="sqlite"),
    pytest.param(("postgresql", 1), id="postgresql",
                 marks=pytest.mark.skipif(not os.environ.get(POSTGRES_URL_VARIABLE),
                                          reason="needs PostgreSQL")),
    pytest.param(("postgresql", 2), id="two-instances-one-postgresql",
                 marks=pytest.mark.skipif(not os.environ.get(POSTGRES_URL_VARIABLE),
                                          reason="needs PostgreSQL")),
]


@dataclass
class Cluster:
    """The servers of one setup, and keys to call them with."""

    database_url: str
    servers: list[LiveServer]
    worker_token: str
    producer_token: str
    admin_token: str
    clients: list[QueueClient] = field(default_factory=list)

    def client(self, token: str, index: int = 0) -> QueueClient:
        client = QueueClient(self.servers[index % len(self.servers)], token)
        self.clients.append(client)
        return client

    def admin(self) -> QueueClient:
        return self.client(self.admin_token)

    def workers(self) -> list[QueueClient]:
        return [self.client(self.worker_token, n) for n in range(CLIENTS)]

    def enqueue(self, bodies: list[dict[str, Any]]) -> list[int]:
        producer = self.client(self.producer_token)
        ids: list[int] = []
        for start in range(0, len(bodies), 500):
            response = producer.request("POST", "/jobs/batch",
                                        json={"jobs": bodies[start:start + 500]})
            assert response.status_code == 201, response.text
            ids += [job["id"] for job in response.json()["jobs"]]
        return ids

    def set_type(self, job_type: str, **settings: Any) -> None:
        response = self.admin().request("PATCH", f"/types/{job_type}", json=settings)
        assert response.status_code == 200, response.text


@pytest.fixture(params=SETUPS)
def cluster(request: pytest.FixtureRequest, start_server: Callable[..., LiveServer],
            sqlite_file_url: str) -> Cluster:
    engine, instances = request.param
    url = (sqlite_file_url if engine == "sqlite"
           else request.getfixturevalue("postgres_server").create_database())
    tokens = [create_api_key(url, name, role) for name, role in
              (("worker-1", "worker"), ("producer-1", "producer"), ("admin-1", "admin"))]
    servers = [start_server(url, workers=4, threads=4) for _ in range(instances)]
    return Cluster(url, servers, *tokens)


class Sampler:
    """Reads from the database, as often as it can, what runs; keeps the largest answer."""

    def __init__(self, database_url: str, query: str) -> None:
        self.engine = create_engine(database_url)
        self.query = text(query)
        self.samples = 0
        self.largest = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self.engine.connect() as conn:
                value = conn.execute(self.query).scalar() or 0
            self.samples += 1
            self.largest = max(self.largest, value)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.engine.dispose()


@dataclass
class Held:
    """When each client held a job, by the job's concurrency key (or type)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    intervals: list[tuple[float, float, str | None]] = field(default_factory=list)
    completed: list[int] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)

    def most_at_once(self, key: Any = ...) -> int:
        """The largest number of intervals (of one key, when given) open at one instant."""
        events = sorted((t, delta) for start, end, k in self.intervals
                        if key is ... or k == key for t, delta in ((start, 1), (end, -1)))
        most = now = 0
        for _t, delta in events:
            now += delta
            most = max(most, now)
        return most


def work_until(total: int, clients: list[QueueClient], held: Held, **claim: Any) -> None:
    """Each client claims, holds the job a moment, completes, until `total` are complete."""
    deadline = time.monotonic() + RUN_TIMEOUT_SECONDS

    def run(client: QueueClient) -> None:
        rng = random.Random()
        while time.monotonic() < deadline:
            with held.lock:
                if len(held.completed) >= total or held.unexpected:
                    return
            response = client.claim(lease_seconds=600, **claim)
            if response.status_code == 204:
                time.sleep(0.005)
                continue
            if response.status_code != 200:
                held.unexpected.append(f"claim {response.status_code} {response.text[:200]}")
                return
            started = time.monotonic()
            job = response.json()
            time.sleep(rng.uniform(*HOLD_SECONDS))
            ended = time.monotonic()
            done = client.complete(job["id"], lease_token=job["lease_token"])
            with held.lock:
                held.intervals.append((started, ended, job["concurrency_key"]))
                if done.status_code == 200:
                    held.completed.append(job["id"])
                else:
                    held.unexpected.append(f"complete {done.status_code}")

    with ThreadPoolExecutor(max_workers=len(clients)) as pool:
        list(pool.map(run, clients))


def test_max_running_is_never_exceeded_and_every_job_finishes(cluster: Cluster) -> None:
    cluster.set_type("pdf", max_running=3)
    ids = cluster.enqueue([{"type": "pdf", "payload": {"n": n}} for n in range(150)])
    held = Held()

    with Sampler(cluster.database_url, "SELECT count(*) FROM jobs WHERE type = 'pdf' "
                                       "AND status = 'running'") as sampler:
        work_until(len(ids), cluster.workers(), held)

    assert held.unexpected == []
    assert sorted(held.completed) == sorted(ids)  # every job finished, each once
    assert sampler.largest <= 3, sampler.largest
    assert held.most_at_once() <= 3
    assert sampler.samples > 100 and sampler.largest == 3  # the cap was reached, and held
    print(f"\nmax_running=3: {sampler.samples} samples, most running at once "
          f"{sampler.largest}; clients held at most {held.most_at_once()} at once")
    assert server_errors(cluster.clients) == {}


def test_max_running_per_key_holds_each_key_to_one_and_passes_to_other_keys(
        cluster: Cluster) -> None:
    cluster.set_type("sync", max_running_per_key=1)
    # A key at its cap does not hold back the next key's job behind it in claim order.
    first_a = cluster.enqueue([{"type": "sync", "concurrency_key": "key-a"}] * 3
                              + [{"type": "sync", "concurrency_key": "key-b"}])
    worker = cluster.client(cluster.worker_token)
    assert worker.claim().json()["id"] == first_a[0]
    assert worker.claim().json()["id"] == first_a[3]  # key-b, behind two more of key-a
    assert worker.claim().status_code == 204
    for job in cluster.admin().list_all(status="running"):
        worker.complete(job["id"])

    keys = [f"key-{n}" for n in range(6)]
    ids = cluster.enqueue([{"type": "sync", "concurrency_key": keys[n % 6]}
                           for n in range(120)])
    held = Held()
    with Sampler(cluster.database_url,
                 "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM jobs "
                 "WHERE type = 'sync' AND status = 'running' GROUP BY concurrency_key) "
                 "AS per_key") as sampler:
        work_until(len(ids) + 2, cluster.workers(), held)

    assert held.unexpected == []
    assert len(held.completed) == len(ids) + 2  # the two first key-a jobs left, and the rest
    assert sampler.largest == 1, sampler.largest
    assert max(held.most_at_once(key) for key in [*keys, "key-a"]) == 1
    assert held.most_at_once() > 1  # several keys ran at once
    print(f"\nmax_running_per_key=1: {sampler.samples} samples, most of one key at once "
          f"{sampler.largest}; most jobs at once across keys {held.most_at_once()}")
    assert server_errors(cluster.clients) == {}


def test_the_rate_bounds_claims_by_burst_plus_rate_times_elapsed(cluster: Cluster) -> None:
    rate, burst, seconds = 5.0, 5, 4.0
    cluster.set_type("email", rate_per_second=rate, burst=burst)
    cluster.enqueue([{"type": "email"} for _ in range(200)])
    answered: list[float] = []
    lock = threading.Lock()
    started = time.monotonic()

    def hammer(client: QueueClient) -> None:
        while time.monotonic() - started < seconds:
            response = client.claim(types=["email"])
            assert response.status_code in (200, 204), response.text
            if response.status_code == 200:
                with lock:
                    answered.append(time.monotonic())

    with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        list(pool.map(hammer, cluster.workers()))
    elapsed = time.monotonic() - started

    # By any instant t, the claims answered are at most burst + rate * (t - start).
    for count, at in enumerate(sorted(answered), start=1):
        assert count <= burst + rate * (at - started), (count, at - started)
    assert len(answered) <= burst + rate * elapsed
    assert len(answered) >= burst + rate * seconds * 0.5  # it did let claims through
    print(f"\nrate 5/s burst 5: {len(answered)} claims in {elapsed:.2f} s "
          f"(bound {burst + rate * elapsed:.1f})")
    assert server_errors(cluster.clients) == {}


def test_a_paused_type_accepts_enqueues_is_never_claimed_and_resumes(cluster: Cluster
                                                                     ) -> None:
    cluster.set_type("email", paused=True)
    email_ids = cluster.enqueue([{"type": "email", "priority": "medium"} for _ in range(30)])
    pdf_ids = cluster.enqueue([{"type": "pdf", "priority": "low"} for _ in range(60)])
    held = Held()
    worker = cluster.client(cluster.worker_token)

    work_until(len(pdf_ids), cluster.workers(), held)  # email comes first in claim order

    assert held.unexpected == [] and sorted(held.completed) == sorted(pdf_ids)
    assert worker.claim(types=["email"]).status_code == 204
    assert worker.claim(wait_seconds=0.5).status_code == 204
    cluster.set_type("email", paused=False)
    resumed = Held()
    work_until(len(email_ids), cluster.workers(), resumed)
    assert sorted(resumed.completed) == sorted(email_ids)
    assert server_errors(cluster.clients) == {}
