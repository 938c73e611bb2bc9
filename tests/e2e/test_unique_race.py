"""Unique jobs under concurrency, against real gunicorn (4 processes x 4 threads) on each
engine: the database's unique index, not a look-up before the insert, keeps one job."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests

from tests.e2e.client import QueueClient, server_errors
from tests.servers import LiveServer, create_api_key

CONCURRENT = 24
DEBOUNCES = 10


def enqueue_all_at_once(clients: list[QueueClient], body: dict[str, Any]
                        ) -> list[requests.Response]:
    """One enqueue per client, released together by a barrier."""
    barrier = threading.Barrier(len(clients))

    def send(client: QueueClient) -> requests.Response:
        barrier.wait()
        return client.enqueue(body)

    with ThreadPoolExecutor(max_workers=len(clients)) as pool:
        return list(pool.map(send, clients))


def producers(server: LiveServer, database_url: str, name: str, count: int
              ) -> list[QueueClient]:
    token = create_api_key(database_url, name, "producer")
    return [QueueClient(server, token) for _ in range(count)]


@pytest.mark.slow
@pytest.mark.parametrize("on_conflict,twin_status", [("return", 200), ("reject", 409)])
def test_24_concurrent_enqueues_of_one_unique_key_store_one_job(
        start_server: Callable[..., LiveServer], server_database_url: str, on_conflict: str,
        twin_status: int) -> None:
    """return: one 201, 23 answers 200 with that job and Deduplicated: true. reject: one
    201, 23 answers 409 naming that job."""
    server = start_server(server_database_url)
    clients = producers(server, server_database_url, "shop", CONCURRENT)

    answers = enqueue_all_at_once(clients, {
        "type": "email", "payload": {"customer": 42},
        "unique": {"key": "reindex-42", "on_conflict": on_conflict}})

    assert server_errors(clients) == {}
    assert Counter(a.status_code for a in answers) == {201: 1, twin_status: CONCURRENT - 1}
    created = next(a.json()["id"] for a in answers if a.status_code == 201)
    twins = [a for a in answers if a.status_code == twin_status]
    if on_conflict == "return":
        assert {a.json()["id"] for a in twins} == {created}
        assert {a.headers["Deduplicated"] for a in twins} == {"true"}
    else:
        assert {a.json()["existing_job_id"] for a in twins} == {created}
    assert [job["id"] for job in clients[0].list_all()] == [created]


@pytest.mark.slow
def test_10_rapid_replacing_enqueues_leave_one_job_with_the_last_payload_and_run_at(
        start_server: Callable[..., LiveServer], server_database_url: str) -> None:
    server = start_server(server_database_url)
    client = producers(server, server_database_url, "shop", 1)[0]
    start = datetime.now(UTC) + timedelta(minutes=5)
    run_ats = [(start + timedelta(seconds=n)).isoformat() for n in range(DEBOUNCES)]

    answers = [client.enqueue({"type": "email", "payload": {"edit": n}, "run_at": run_ats[n],
                               "unique": {"key": "profile-7", "on_conflict": "replace"}})
               for n in range(DEBOUNCES)]

    assert [a.status_code for a in answers] == [201] + [200] * (DEBOUNCES - 1)
    assert [a.headers.get("Deduplicated") for a in answers[1:]] == \
        ["replaced"] * (DEBOUNCES - 1)
    stored = client.list_all()
    assert len(stored) == 1
    job = stored[0]
    assert job["id"] == answers[0].json()["id"]
    assert job["payload"] == {"edit": DEBOUNCES - 1}
    assert datetime.fromisoformat(job["run_at"]) == datetime.fromisoformat(run_ats[-1])


@pytest.mark.slow
def test_two_producers_with_one_unique_key_get_two_jobs_and_learn_nothing_of_each_other(
        start_server: Callable[..., LiveServer], server_database_url: str) -> None:
    server = start_server(server_database_url)
    half = CONCURRENT // 2
    shop = producers(server, server_database_url, "shop", half)
    billing = producers(server, server_database_url, "billing", half)

    answers = enqueue_all_at_once(shop + billing, {
        "type": "email", "payload": {"digest": "daily"},
        "unique": {"key": "daily-digest", "on_conflict": "reject"}})

    assert server_errors(shop + billing) == {}
    shop_answers, billing_answers = answers[:half], answers[half:]
    for side in (shop_answers, billing_answers):
        assert Counter(a.status_code for a in side) == {201: 1, 409: half - 1}
    shop_job = next(a.json()["id"] for a in shop_answers if a.status_code == 201)
    billing_job = next(a.json()["id"] for a in billing_answers if a.status_code == 201)
    assert shop_job != billing_job
    # Each side's conflicts name its own job only, and neither can read the other's.
    assert {a.json()["existing_job_id"] for a in shop_answers if a.status_code == 409} == \
        {shop_job}
    assert {a.json()["existing_job_id"] for a in billing_answers if a.status_code == 409} == \
        {billing_job}
    assert [job["id"] for job in shop[0].list_all()] == [shop_job]
    assert [job["id"] for job in billing[0].list_all()] == [billing_job]
    assert shop[0].get(billing_job).status_code == 404
