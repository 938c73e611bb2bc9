"""Two real gunicorn servers on one database, on the real clock: one of them leads
maintenance; a lease that runs out is rescued by the leader with no claim asking for it;
and when the leader's server is killed, the other takes the lead and rescues the leases
that run out after (docs/OPERATIONS.md, "Maintenance")."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.e2e.client import QueueClient
from tests.e2e.conftest import StartServer
from tests.servers import LiveServer, create_api_key

# Generous: the behaviour is asserted, never how soon (a lease is rescued within a second,
# and a follower asks for the lead every few seconds, on an idle machine).
EVENTUALLY_SECONDS = 60.0


def eventually(condition: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + EVENTUALLY_SECONDS
    while not (found := condition()):
        assert time.monotonic() < deadline, f"not within {EVENTUALLY_SECONDS} s: {what}"
        time.sleep(0.1)
    return found


def leads(server: LiveServer) -> bool:
    """What the server's one worker says of itself in /readyz."""
    ready = QueueClient(server, "").request("GET", "/readyz")
    assert ready.status_code == 200, ready.text
    leader: bool = ready.json()["maintenance"]["leader"]
    return leader


def rescued(client: QueueClient, job_id: int) -> bool:
    job = client.request("GET", f"/jobs/{job_id}").json()
    return bool(job["status"] == "pending" and job["error"] == "lease expired")


@pytest.mark.slow
def test_one_server_leads_rescues_without_a_claim_and_the_other_takes_over_when_it_dies(
        start_server: StartServer, server_database_url: str) -> None:
    producer = create_api_key(server_database_url, "producer", "producer")
    worker = create_api_key(server_database_url, "worker", "worker")
    admin = create_api_key(server_database_url, "admin", "admin")
    # One worker each: a server's /readyz is then its one process's word.
    servers = [start_server(server_database_url, workers=1, threads=4) for _ in range(2)]
    eventually(lambda: [leads(server) for server in servers].count(True) == 1, "one leader")
    leader, follower = servers if leads(servers[0]) else servers[::-1]
    assert not leads(follower)

    # The leader rescues a lease that ran out; no claim is made until it has.
    for server in (follower, leader):
        job_id = QueueClient(server, producer).enqueue({"type": "email"}).json()["id"]
        claimed = QueueClient(server, worker).claim(lease_seconds=1)
        assert (claimed.status_code, claimed.json()["id"]) == (200, job_id)
        reader = QueueClient(server, admin)
        eventually(lambda: rescued(reader, job_id), "the rescue")  # noqa: B023 (called now)
        again = QueueClient(server, worker).claim(lease_seconds=60)
        assert (again.status_code, again.json()["id"]) == (200, job_id)
        done = QueueClient(server, worker).request(
            "POST", f"/jobs/{job_id}/complete",
            json={"lease_token": again.json()["lease_token"]})
        assert done.status_code == 200, done.text

    # A job held through the follower, its lease running out after the leader died.
    job_id = QueueClient(follower, producer).enqueue({"type": "email"}).json()["id"]
    assert QueueClient(follower, worker).claim(lease_seconds=1).json()["id"] == job_id
    leader.kill()

    eventually(lambda: rescued(QueueClient(follower, admin), job_id), "the rescue")
    assert leads(follower)
    again = QueueClient(follower, worker).claim()
    assert (again.status_code, again.json()["id"], again.json()["retry_count"]) == (
        200, job_id, 1)
