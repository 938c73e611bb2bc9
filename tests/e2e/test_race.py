"""Concurrent claims against real gunicorn servers: 1,000 jobs, 16 worker clients claiming and
completing while producers enqueue, until the queue is empty. Every job must be completed
exactly once, no job handed to two workers, and no request answered 5xx."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.e2e.client import QueueClient, server_errors
from tests.servers import LiveServer, create_api_key
from tests.told_history import told_histories

# Each claim races the other 15 workers' for the same head of the queue: more jobs repeat the
# same race, they add no new kind of it (2,000 took twice the CI time).
JOBS = 1000
PRODUCERS = 4
WORKERS = 16
# Enough that no lease runs out while the run lasts: a rescue would be a second claim by
# design, and this test is about claims that race, not about leases.
LEASE_SECONDS = 3600
RUN_TIMEOUT_SECONDS = 300
CLAIM_MANY = 7  # jobs per claim-many: not a divisor of JOBS, so batches end ragged


@dataclass
class Tally:
    """What the clients saw, gathered across threads."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    enqueued: list[int] = field(default_factory=list)
    claims: list[tuple[int, str]] = field(default_factory=list)
    completed: list[tuple[int, str]] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)

    def add(self, name: str, value: Any) -> None:
        with self.lock:
            getattr(self, name).append(value)


def produce(client: QueueClient, tally: Tally, count: int, offset: int) -> None:
    for n in range(count):
        body = {"type": "email", "payload": {"n": offset + n}, "priority": "medium"}
        response = client.enqueue(body)
        if response.status_code == 201:
            tally.add("enqueued", response.json()["id"])
        else:
            tally.add("unexpected", f"enqueue {response.status_code} {response.text[:200]}")


def work(client: QueueClient, name: str, tally: Tally, producers_done: threading.Event
         ) -> None:
    """Claim and complete until the queue is empty and the producers have finished."""
    while True:
        # Read before the claim is sent: an empty answer to a claim sent after every enqueue
        # was answered means the queue is empty (what is left is held by other workers).
        finished = producers_done.is_set()
        response = client.claim(lease_seconds=LEASE_SECONDS)
        if response.status_code == 204:
            if finished:
                return
            time.sleep(0.01)
            continue
        if response.status_code != 200:
            tally.add("unexpected", f"claim {response.status_code} {response.text[:200]}")
            return
        job = response.json()
        tally.add("claims", (job["id"], name))
        done = client.complete(job["id"], lease_token=job["lease_token"],
                               result={"by": name})
        if done.status_code == 200:
            tally.add("completed", (job["id"], name))
        else:
            tally.add("unexpected", f"complete {done.status_code} {done.text[:200]}")


def work_in_batches(client: QueueClient, name: str, tally: Tally,
                    producers_done: threading.Event) -> None:
    """As `work`, through claim-many and complete-many, several jobs per request."""
    while True:
        finished = producers_done.is_set()
        response = client.claim_many(max_jobs=CLAIM_MANY, lease_seconds=LEASE_SECONDS)
        if response.status_code != 200:
            tally.add("unexpected", f"claim-many {response.status_code} {response.text[:200]}")
            return
        jobs = response.json()["jobs"]
        if not jobs:
            if finished:
                return
            time.sleep(0.01)
            continue
        for job in jobs:
            tally.add("claims", (job["id"], name))
        done = client.complete_many([{"id": job["id"], "lease_token": job["lease_token"],
                                      "result": {"by": name}} for job in jobs])
        if done.status_code != 200:
            tally.add("unexpected", f"complete-many {done.status_code} {done.text[:200]}")
            return
        for result in done.json()["results"]:
            if result["status"] == 200:
                tally.add("completed", (result["id"], name))
            else:
                tally.add("unexpected", f"complete-many item {result}")


def run_race(servers: list[LiveServer], database_url: str,
             worker_loop: Callable[..., None] = work) -> tuple[Tally, list[QueueClient]]:
    """Producers and workers spread over `servers`, all on one database."""
    producer_token = create_api_key(database_url, "producer-1", "producer")
    worker_tokens = [create_api_key(database_url, f"worker-{i:02d}", "worker")
                     for i in range(WORKERS)]
    producers = [QueueClient(servers[i % len(servers)], producer_token)
                 for i in range(PRODUCERS)]
    workers = [QueueClient(servers[i % len(servers)], token)
               for i, token in enumerate(worker_tokens)]
    tally, producers_done = Tally(), threading.Event()
    per_producer = JOBS // PRODUCERS

    with ThreadPoolExecutor(max_workers=PRODUCERS + WORKERS) as pool:
        working = [pool.submit(worker_loop, client, f"worker-{i:02d}", tally, producers_done)
                   for i, client in enumerate(workers)]
        producing = [pool.submit(produce, client, tally, per_producer, i * per_producer)
                     for i, client in enumerate(producers)]
        for future in producing:
            future.result(timeout=RUN_TIMEOUT_SECONDS)
        producers_done.set()
        for future in working:
            future.result(timeout=RUN_TIMEOUT_SECONDS)
    return tally, producers + workers


def assert_every_job_completed_exactly_once(tally: Tally, clients: list[QueueClient],
                                            admin: QueueClient) -> None:
    assert tally.unexpected == []
    assert server_errors([*clients, admin]) == {}
    assert len(tally.enqueued) == JOBS == len(set(tally.enqueued))

    claimed = Counter(job_id for job_id, _ in tally.claims)
    double_claims = {job_id: n for job_id, n in claimed.items() if n > 1}
    assert double_claims == {}
    assert set(claimed) == set(tally.enqueued)
    assert sorted(tally.completed) == sorted(tally.claims)

    # What the service stored: every job completed, by the worker whose claim it answered.
    stored = {job["id"]: job for job in admin.list_all()}
    assert set(stored) == set(tally.enqueued)
    claimed_by = dict(tally.claims)
    for job_id, job in stored.items():
        assert (job["status"], job["retry_count"]) == ("completed", 0), job
        assert job["worker_id"] == claimed_by[job_id] == job["result"]["by"]
    # The workers' spread shows they really raced (not one client draining the queue).
    assert len({name for _, name in tally.claims}) > 1


def assert_history_agrees(database_url: str, tally: Tally) -> None:
    """Each job's history is told as its claim and its complete made it: one attempt,
    completed by its claimer, and the events enqueued, claimed, completed."""
    claimed_by = dict(tally.claims)
    told = told_histories(database_url)
    attempts = [(job_id, attempt.number, attempt.worker_id, attempt.outcome)
                for job_id, (tried, _events) in told.items() for attempt in tried]
    events = {job_id: [(event.event, event.actor) for event in shown]
              for job_id, (_tried, shown) in told.items()}
    assert sorted(attempts) == sorted((job_id, 1, worker, "completed")
                                      for job_id, worker in claimed_by.items())
    assert events == {job_id: [("enqueued", "producer-1"), ("claimed", worker),
                               ("completed", worker)]
                      for job_id, worker in claimed_by.items()}


@pytest.mark.slow
def test_1000_jobs_16_workers_every_job_completed_exactly_once(
        start_server: Callable[..., LiveServer], server_database_url: str) -> None:
    server = start_server(server_database_url)
    tally, clients = run_race([server], server_database_url)

    admin = QueueClient(server, create_api_key(server_database_url, "admin-1", "admin"))
    assert_every_job_completed_exactly_once(tally, clients, admin)
    assert_history_agrees(server_database_url, tally)


@pytest.mark.slow
def test_claim_many_workers_never_share_a_job_and_complete_every_one(
        start_server: Callable[..., LiveServer], server_database_url: str) -> None:
    server = start_server(server_database_url)
    tally, clients = run_race([server], server_database_url, worker_loop=work_in_batches)

    admin = QueueClient(server, create_api_key(server_database_url, "admin-1", "admin"))
    assert_every_job_completed_exactly_once(tally, clients, admin)
    assert_history_agrees(server_database_url, tally)


@pytest.mark.slow
def test_two_servers_sharing_one_postgresql_complete_every_job_exactly_once(
        start_server: Callable[..., LiveServer], postgres_server: Any) -> None:
    """Two gunicorn instances on different ports stand for two hosts on one database."""
    database_url = postgres_server.create_database()
    servers = [start_server(database_url), start_server(database_url)]
    assert servers[0].port != servers[1].port

    tally, clients = run_race(servers, database_url)

    admin = QueueClient(servers[1], create_api_key(database_url, "admin-1", "admin"))
    assert_every_job_completed_exactly_once(tally, clients, admin)
    assert_history_agrees(database_url, tally)
    # Both hosts served claims.
    served = Counter(client.server.port for client in clients[PRODUCERS:]
                     if client.statuses[200])
    assert set(served) == {servers[0].port, servers[1].port}
