"""A worker process killed with SIGKILL while it holds jobs: once their short leases expire,
the other workers, busy with a queue that producers keep filling, complete each of them
exactly once, and the dead worker's lease tokens are refused."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.e2e.client import QueueClient, server_errors
from tests.servers import REPO_ROOT, LiveServer, create_api_key

INITIAL_JOBS = 100
EXTRA_JOBS = 300
TOTAL_JOBS = INITIAL_JOBS + EXTRA_JOBS
VICTIM_JOBS = 20
# Long enough that the victim's first leases outlive its twentieth claim on a loaded CI
# machine: a lease that ran out mid-claiming is rescued by the victim's own next claim,
# which may hand the same job back to it.
VICTIM_LEASE_SECONDS = 10
WORKERS = 8
PRODUCERS = 2
LIVE_LEASE_SECONDS = 600
RUN_TIMEOUT_SECONDS = 180


def start_victim(server: LiveServer, token: str) -> tuple[subprocess.Popen[str], queue.Queue]:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.worker_process", server.url, token,
         str(VICTIM_JOBS), str(VICTIM_LEASE_SECONDS)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True)
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(json.loads(line))

    threading.Thread(target=read, daemon=True).start()
    return process, lines


def held_by_victim(lines: queue.Queue) -> list[dict[str, Any]]:
    """The jobs the victim claimed, once it says it holds them all."""
    held = []
    deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
    while True:
        line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        if "holding" in line:
            return held
        held.append(line)


@pytest.mark.slow
def test_jobs_held_by_a_killed_worker_process_are_completed_once_by_the_others(
        start_server: Callable[..., LiveServer], server_database_url: str) -> None:
    url = server_database_url
    server = start_server(url)
    producer_token = create_api_key(url, "producer-1", "producer")
    producers = [QueueClient(server, producer_token) for _ in range(PRODUCERS)]
    workers = [QueueClient(server, create_api_key(url, f"worker-{i}", "worker"))
               for i in range(WORKERS)]
    admin = QueueClient(server, create_api_key(url, "admin-1", "admin"))
    victim_token = create_api_key(url, "victim", "worker")
    for n in range(INITIAL_JOBS):
        assert producers[0].enqueue({"type": "email", "payload": {"n": n}}).status_code == 201

    lock = threading.Lock()
    live_claims: Counter[int] = Counter()
    completions: Counter[int] = Counter()
    unexpected: list[str] = []

    def produce(client: QueueClient, first: int) -> None:
        for n in range(first, first + EXTRA_JOBS // PRODUCERS):
            response = client.enqueue({"type": "email", "payload": {"n": n}})
            if response.status_code != 201:
                with lock:
                    unexpected.append(f"enqueue {response.status_code}")

    def work(client: QueueClient) -> None:
        deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            with lock:
                if len(completions) >= TOTAL_JOBS:
                    return
            # Each claim also rescues the leases that ran out, the victim's among them.
            response = client.claim(lease_seconds=LIVE_LEASE_SECONDS)
            if response.status_code == 204:
                time.sleep(0.05)
                continue
            if response.status_code != 200:
                with lock:
                    unexpected.append(f"claim {response.status_code} {response.text[:200]}")
                return
            job = response.json()
            with lock:
                live_claims[job["id"]] += 1
            done = client.complete(job["id"], lease_token=job["lease_token"])
            with lock:
                if done.status_code == 200:
                    completions[job["id"]] += 1
                else:
                    unexpected.append(f"complete {done.status_code} {done.text[:200]}")
        with lock:
            unexpected.append("a worker gave up waiting for the queue to drain")

    victim, lines = start_victim(server, victim_token)
    try:
        with ThreadPoolExecutor(max_workers=WORKERS + PRODUCERS) as pool:
            working = [pool.submit(work, client) for client in workers]
            producing = [pool.submit(produce, client, INITIAL_JOBS + i * EXTRA_JOBS // PRODUCERS)
                         for i, client in enumerate(producers)]
            held = held_by_victim(lines)
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait(timeout=30)
            for future in [*producing, *working]:
                future.result(timeout=RUN_TIMEOUT_SECONDS + 30)
    finally:
        if victim.poll() is None:
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait(timeout=30)

    held_ids = {job["id"] for job in held}
    assert len(held_ids) == VICTIM_JOBS
    assert unexpected == []
    assert server_errors([*producers, *workers, admin]) == {}
    # Every job completed exactly once, and no live worker was handed a job another held.
    assert len(completions) == TOTAL_JOBS
    assert set(completions.values()) == {1}
    assert set(live_claims.values()) == {1}

    stored = {job["id"]: job for job in admin.list_all()}
    assert len(stored) == TOTAL_JOBS
    for job_id, job in stored.items():
        assert job["status"] == "completed", job
        assert job["worker_id"] != "victim"
        if job_id in held_ids:
            # The expired lease counted as a failed attempt, then the job went to another.
            assert (job["retry_count"], job["error"]) == (1, "lease expired"), job
        else:
            assert (job["retry_count"], job["error"]) == (0, None), job

    # The dead worker's key and lease tokens, used by a process that comes back, are fenced.
    returning = QueueClient(server, victim_token)
    for job in held[:3]:
        assert returning.complete(job["id"], lease_token=job["lease_token"]).status_code == 409
        assert returning.heartbeat(job["id"], lease_token=job["lease_token"]).status_code == 409
