"""kill -9 of the whole gunicorn process group in the middle of a burst of enqueues from 8
clients, at several points: every job answered 201 must be on disk and intact after restart,
the SQLite file must pass `PRAGMA integrity_check`, and a producer retrying a request the
crash cut off (same Idempotency-Key) must get one job, never two."""

from __future__ import annotations

import random
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest
import requests

from tests.e2e.client import QueueClient
from tests.servers import LiveServer, create_api_key, sqlite_path

CLIENTS = 8
# How many 201s each round sees before the kill: early, mid-burst, late.
KILL_POINTS = (15, 250, 800)
WAIT_FOR_KILL_POINT_SECONDS = 120
INTACT_FIELDS = ("type", "payload", "priority", "max_retries", "idempotency_key", "run_at",
                 "created_at", "status")


@dataclass
class Burst:
    """8 producers enqueueing as fast as they can until the server dies under them."""

    clients: list[QueueClient]
    round_no: int
    kill_after: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    acknowledged: dict[int, dict[str, Any]] = field(default_factory=dict)
    # Requests the crash cut off: (client index, body, idempotency key).
    cut_off: list[tuple[int, dict[str, Any], str]] = field(default_factory=list)
    other_answers: list[str] = field(default_factory=list)
    kill_point_reached: threading.Event = field(default_factory=threading.Event)

    def run_client(self, index: int) -> None:
        client, rng = self.clients[index], random.Random(f"{self.round_no}-{index}")
        for seq in range(1_000_000):
            key = f"r{self.round_no}-c{index}-n{seq}"
            body = {"type": rng.choice(["email", "pdf", "sync"]),
                    "priority": rng.choice(["low", "medium"]),
                    "max_retries": rng.randint(0, 5),
                    # Sizes from a few bytes to tens of KiB: WAL frames of many shapes.
                    "payload": {"client": index, "seq": seq,
                                "blob": "x" * rng.choice([0, 10, 3000, 40_000])}}
            try:
                response = client.enqueue(body, idempotency_key=key)
            except requests.RequestException:
                with self.lock:
                    self.cut_off.append((index, body, key))
                return
            with self.lock:
                if response.status_code == 201:
                    self.acknowledged[response.json()["id"]] = response.json()
                    if len(self.acknowledged) >= self.kill_after:
                        self.kill_point_reached.set()
                else:
                    self.other_answers.append(f"{response.status_code} {response.text[:200]}")


def integrity_check(path: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute("PRAGMA integrity_check").fetchall()


def stored_jobs(path: str) -> dict[int, dict[str, Any]]:
    """The rows as they are on disk, read without the service."""
    with sqlite3.connect(path) as conn:
        conn.row_factory = sqlite3.Row
        return {row["id"]: dict(row) for row in conn.execute("SELECT * FROM jobs")}


def assert_intact(answered: dict[str, Any], shown: dict[str, Any]) -> None:
    assert {name: shown[name] for name in INTACT_FIELDS} == \
        {name: answered[name] for name in INTACT_FIELDS}, answered["id"]


@pytest.mark.slow
def test_every_job_answered_201_survives_kill_9_of_the_whole_server(
        live_server: LiveServer) -> None:
    server, url = live_server, live_server.database_url
    path = sqlite_path(url)
    tokens = [create_api_key(url, f"producer-{i}", "producer") for i in range(CLIENTS)]
    admin = QueueClient(server, create_api_key(url, "admin-1", "admin"))
    every_acknowledged: dict[int, dict[str, Any]] = {}

    for round_no, kill_after in enumerate(KILL_POINTS):
        clients = [QueueClient(server, token) for token in tokens]
        burst = Burst(clients, round_no, kill_after)
        with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
            running = [pool.submit(burst.run_client, i) for i in range(CLIENTS)]
            assert burst.kill_point_reached.wait(WAIT_FOR_KILL_POINT_SECONDS), server.log_tail()
            server.kill()
            for future in running:
                future.result(timeout=60)

        assert burst.other_answers == [], "only 201s until the kill"
        assert len(burst.cut_off) == CLIENTS, "the kill cut off every client mid-burst"
        assert integrity_check(path) == [("ok",)]
        on_disk = stored_jobs(path)
        for job_id, answered in burst.acknowledged.items():
            row = on_disk[job_id]
            assert (row["type"], row["idempotency_key"], row["status"]) == \
                (answered["type"], answered["idempotency_key"], "pending")
        every_acknowledged.update(burst.acknowledged)

        server.start()
        for index, body, key in burst.cut_off:
            retried = clients[index].enqueue(body, idempotency_key=key)
            # Stored before the crash (a replay) or not at all (created now): one job either way.
            assert retried.status_code in (200, 201), retried.text
            every_acknowledged[retried.json()["id"]] = retried.json()
        shown = {job["id"]: job for job in admin.list_all()}
        for job_id, answered in every_acknowledged.items():
            assert_intact(answered, shown[job_id])
        keys = [job["idempotency_key"] for job in shown.values()]
        assert len(keys) == len(set(keys)), "a retried request made a second job"
        for client in clients:
            client.close()

    server.stop()
    assert integrity_check(path) == [("ok",)]
