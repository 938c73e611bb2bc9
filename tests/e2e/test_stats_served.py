"""Stats over time as they are counted in production (contract §20): two gunicorn servers of
two processes each on one database, producers and workers on both at once; GET /stats reads
back exactly the numbers they made, per type, from whichever server is asked, once every
process has written its last counts (each writes about once a second)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from app.core.clock import to_rfc3339
from tests.e2e.client import QueueClient, server_errors
from tests.servers import LiveServer, create_api_key

PRODUCERS = 4  # two on each server
EMAILS_EACH, PDFS_EACH = 60, 15
WORKERS = 4
COMPLETED_EACH, FAILED_EACH = 40, 10  # of the emails each worker claims
# How long the other processes' last counts may take to show: far beyond their second.
SETTLE_SECONDS = 20


def totals(admin: QueueClient, start_us: int, **query: Any) -> tuple[int, int, int, int]:
    answer = admin.request("GET", "/stats", params={
        "from": to_rfc3339(start_us), "to": to_rfc3339(int(time.time() * 1e6) + 60_000_000),
        **query})
    assert answer.status_code == 200, answer.text
    buckets = answer.json()["buckets"]
    return (sum(b["enqueued"] for b in buckets), sum(b["claimed"] for b in buckets),
            sum(b["completed"] for b in buckets), sum(b["failed"] for b in buckets))


def settled(admin: QueueClient, start_us: int, expected: tuple[int, int, int, int],
            **query: Any) -> tuple[int, int, int, int]:
    """The totals once they equal `expected` (every process's counts written), or as they
    stand after SETTLE_SECONDS."""
    deadline = time.monotonic() + SETTLE_SECONDS
    found = totals(admin, start_us, **query)
    while found != expected and time.monotonic() < deadline:
        time.sleep(0.2)
        found = totals(admin, start_us, **query)
    return found


@pytest.mark.slow
def test_four_processes_on_two_servers_count_exactly_what_they_did(
        start_server: Callable[..., LiveServer], server_database_url: str) -> None:
    url = server_database_url
    servers = [start_server(url, workers=2, threads=4) for _ in range(2)]
    start_us = int(time.time() * 1e6)
    admin = QueueClient(servers[1], create_api_key(url, "admin-1", "admin"))
    producers = [QueueClient(servers[n % 2], create_api_key(url, f"producer-{n}", "producer"))
                 for n in range(PRODUCERS)]
    workers = [QueueClient(servers[n % 2], create_api_key(url, f"worker-{n}", "worker"))
               for n in range(WORKERS)]
    problems: list[str] = []

    def produce(client: QueueClient) -> None:
        for n in range(EMAILS_EACH):
            made = client.enqueue({"type": "email", "max_retries": 0, "payload": {"n": n}})
            if made.status_code != 201:
                problems.append(made.text)
        for _ in range(PDFS_EACH):
            if client.enqueue({"type": "pdf"}).status_code != 201:
                problems.append("pdf")

    def work(client: QueueClient) -> None:
        completed = failed = 0
        while completed + failed < COMPLETED_EACH + FAILED_EACH:
            claimed = client.claim(types=["email"])
            if claimed.status_code == 204:
                time.sleep(0.01)
                continue
            job = claimed.json()
            if completed < COMPLETED_EACH:
                answer = client.complete(job["id"], lease_token=job["lease_token"])
                completed += 1
            else:
                answer = client.request("POST", f"/jobs/{job['id']}/fail", json={
                    "lease_token": job["lease_token"], "error": "smtp 421"})
                failed += 1
            if answer.status_code != 200:
                problems.append(answer.text)

    threads = [threading.Thread(target=produce, args=(client,)) for client in producers]
    threads += [threading.Thread(target=work, args=(client,)) for client in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert problems == []

    emails, pdfs = PRODUCERS * EMAILS_EACH, PRODUCERS * PDFS_EACH
    done, failed = WORKERS * COMPLETED_EACH, WORKERS * FAILED_EACH
    email, pdf = (emails, done + failed, done, failed), (pdfs, 0, 0, 0)
    every = (emails + pdfs, done + failed, done, failed)
    assert settled(admin, start_us, email, type="email") == email
    assert settled(admin, start_us, pdf, type="pdf") == pdf
    assert totals(admin, start_us) == every
    # The other server reads the same rows.
    other = QueueClient(servers[0], create_api_key(url, "admin-2", "admin"))
    assert totals(other, start_us, type="email", step="hour") == (emails, done + failed, done,
                                                                  failed)
    # Each process's ticker counted the depth at its first tick: the buckets since say it.
    answer = other.request("GET", "/stats", params={"type": "pdf"})
    assert any(bucket["pending"] is not None for bucket in answer.json()["buckets"])
    assert server_errors([admin, other, *producers, *workers]) == {}
    for server in servers:
        assert "Traceback" not in server.log_tail(), server.log_tail()
