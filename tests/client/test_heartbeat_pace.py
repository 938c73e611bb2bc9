"""The client keeps to the server's heartbeat pace (docs/JOBS.md, "Heartbeat pace"): a
heartbeat or checkpoint answered 429 is sent again after Retry-After, never taken for a lost
lease, so a handler checkpointing in a row keeps every checkpoint it was told is saved and
its job keeps running. Live gunicorn-served queuelog on both engines."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from queuelog_client import Client, RetryLater, TooManyRequests
from queuelog_client.worker import ClaimedJob, heartbeat_interval
from tests.client.test_running_jobs import FINISH_TIMEOUT_SECONDS, running_worker
from tests.client.workflow_servers import WorkflowServer

HEARTBEAT_ROUTE = "/jobs/<id:job_id>/heartbeat"


@pytest.fixture
def server(tmp_path: Path, db_url: str) -> Iterator[WorkflowServer]:
    live = WorkflowServer(tmp_path, db_url, job_types="report")
    live.start()
    yield live
    live.stop()


def _client(server: WorkflowServer, role: str) -> Client:
    return server.client(server.create_key(f"{role}-{uuid.uuid4().hex[:8]}", role))


def test_the_runner_beats_no_sooner_than_the_server_takes_heartbeats():
    assert heartbeat_interval(300) == 100
    assert heartbeat_interval(3) == 1
    # Under three seconds, half the lease (up to a second): what the server takes then.
    assert heartbeat_interval(2) == 1
    assert heartbeat_interval(1) == 0.5


@pytest.mark.slow
def test_a_heartbeat_sent_too_soon_is_sent_again_after_retry_after(server):
    producer, worker = _client(server, "producer"), _client(server, "worker")
    job = producer.enqueue("report")
    claimed = worker.claim(types=["report"])
    assert claimed is not None and claimed["id"] == job["id"]
    time.sleep(0.01)  # a heartbeat never reaches the server within its claim's microsecond
    worker.heartbeat(job["id"], claimed["lease_token"])

    with pytest.raises(TooManyRequests) as refused:
        worker.heartbeat(job["id"], claimed["lease_token"], progress=(1, 2),
                         wait_if_too_soon=False)
    assert refused.value.status == 429 and refused.value.retry_after == 1
    assert producer.get_job(job["id"])["progress"] is None  # nothing was written

    beats = server.requests_to(HEARTBEAT_ROUTE)
    beat = worker.heartbeat(job["id"], claimed["lease_token"], progress=(1, 2),
                            checkpoint={"next_row": 1})
    assert beat["status"] == "running" and beat["progress"]["done"] == 1
    # Refused at least once (within the second), then taken.
    assert server.requests_to(HEARTBEAT_ROUTE) - beats >= 2


@pytest.mark.slow
def test_checkpoints_in_a_row_are_each_saved_and_the_short_lease_stays_held(server):
    producer = _client(server, "producer")
    job = producer.enqueue("report", max_retries=2)
    seen: list[Any] = []

    def handle(claimed: ClaimedJob) -> dict[str, Any]:
        seen.append(claimed["checkpoint"])
        if claimed["checkpoint"] is None:
            for row in (100, 200, 300):
                claimed.checkpoint({"next_row": row})  # each durable once it returns
                claimed.progress(row, 300)
            # Past the 4 s lease: the runner's heartbeats keep it. (Three checkpoints take
            # two seconds or more at one a second, while the runner holds its own beats: a
            # lease of 2 s could run out in them on a loaded machine.)
            time.sleep(4.5)
            raise RetryLater(0, "the database went away")
        return {"resumed_from": claimed["checkpoint"]["next_row"]}

    with running_worker(server, handle, types=["report"], lease_seconds=4):
        done = producer.wait(job["id"], timeout=FINISH_TIMEOUT_SECONDS)
    assert done["status"] == "completed" and done["result"] == {"resumed_from": 300}
    assert seen == [None, {"next_row": 300}]
    # The first attempt ended by its own report, not by a lease that ran out.
    assert [a["outcome"] for a in producer.attempts(job["id"])] == ["failed", "completed"]
