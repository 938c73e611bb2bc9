"""Durable steps and waits end to end (docs/CLIENT.md, "Durable steps and waits"): a Worker
in a thread runs handlers that suspend their jobs on a real gunicorn-served queuelog, on
both engines, and the jobs resume by an event, a sleep's time, a waitpoint and a timeout.

The handlers count what they do in lists the test reads: a step must run once across the
suspend and the resume, however many times the handler runs. The section's example runs as
written, a worker script of its own."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from queuelog_client import (
    ClaimedJob,
    Client,
    Conflict,
    NotFound,
    WaitTimedOut,
)
from tests import doc_examples
from tests.client.conftest import _child_env, wait_until
from tests.client.test_running_jobs import running_worker
from tests.client.workflow_servers import WorkflowServer

pytestmark = pytest.mark.slow

JOB_TYPES = "order,report"
FINISH_TIMEOUT_SECONDS = 60.0


@pytest.fixture
def server(tmp_path: Path, db_url: str) -> Iterator[WorkflowServer]:
    live = WorkflowServer(tmp_path, db_url, job_types=JOB_TYPES)
    live.start()
    yield live
    live.stop()


def _producer(server: WorkflowServer) -> Client:
    return server.client(server.create_key(f"shop-{uuid.uuid4().hex[:8]}", "producer"))


def _status(client: Client, job_id: int) -> str:
    status: str = client.get_job(job_id)["status"]
    return status


def steps_example() -> str:
    """The Python block of docs/CLIENT.md's "Durable steps and waits"."""
    client_md = doc_examples.ROOT / "docs" / "CLIENT.md"
    section = client_md.read_text().split("## Durable steps and waits\n", 1)[1].split(
        "\n## ", 1)[0]
    [code] = [example.code for example in doc_examples.read(client_md).examples
              if example.language == "python" and example.code in section]
    return code


def test_the_documents_order_example_runs_as_written(server, tmp_path):
    producer = _producer(server)
    script = tmp_path / "orders.py"
    script.write_text(steps_example())
    # From a directory of its own: only the installed (here: importable) client is used.
    worker = subprocess.Popen(
        [sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
        env=_child_env(QUEUELOG_URL=server.url,
                       QUEUELOG_TOKEN=server.create_key("warehouse", "worker")))
    try:
        job = producer.enqueue("order", {"order": "1001"})
        wait_until(lambda: _status(producer, job["id"]) == "suspended",
                   timeout=FINISH_TIMEOUT_SECONDS, what="the example to suspend the order")
        assert producer.post_event("order.shipped", {"tracking": "1Z999"},
                                   key="1001") == {"woken": 1}
        done = producer.wait(job["id"], timeout=FINISH_TIMEOUT_SECONDS)
    finally:
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=FINISH_TIMEOUT_SECONDS)
    assert worker.returncode == 0, err
    assert done["status"] == "completed"
    assert done["result"] == {"charge": {"charge_id": "ch_1001"}, "tracking": "1Z999"}
    assert out.splitlines() == ["charging order 1001", "emailing 1001 1Z999"]
    assert f"job {job['id']} suspended: waits for event 'order.shipped' key '1001'" in err


def test_an_orders_charge_runs_once_across_its_wait_for_the_shipping_event(server):
    producer = _producer(server)
    runs: list[int] = []
    charges: list[str] = []
    emails: list[str] = []

    def handle_order(job: ClaimedJob) -> dict[str, Any]:
        runs.append(job["id"])
        order = job["payload"]["order"]
        charge = job.step("charge", lambda: charges.append(order) or {"charge_id": "ch_1"})
        shipped = job.wait_for_event("order.shipped", key=order, timeout_seconds=3600)
        assert shipped is not None
        job.step("email", lambda: emails.append(shipped["tracking"]))
        return {"charge": charge, "tracking": shipped["tracking"]}

    job = producer.enqueue("order", {"order": "1001"})
    with running_worker(server, handle_order, types=["order"]) as worker:
        wait_until(lambda: _status(producer, job["id"]) == "suspended",
                   timeout=FINISH_TIMEOUT_SECONDS, what="the job to suspend at its wait")
        suspended = producer.get_job(job["id"])
        assert suspended["waiting_for"]["kind"] == "event"
        assert (suspended["waiting_for"]["event"], suspended["waiting_for"]["key"]) == (
            "order.shipped", "1001")
        assert suspended["lease_expires_at"] is None  # no lease is held while it waits
        assert charges == ["1001"]
        # The worker's thread counts the suspension once the server has answered it.
        wait_until(lambda: worker.stats["suspended"] == 1, timeout=FINISH_TIMEOUT_SECONDS,
                   what="the worker to count the suspension")

        assert producer.post_event("order.shipped", {"tracking": "1Z999"},
                                   key="1001") == {"woken": 1}
        done = producer.wait(job["id"], timeout=FINISH_TIMEOUT_SECONDS)

    assert done["status"] == "completed"
    assert done["result"] == {"charge": {"charge_id": "ch_1"}, "tracking": "1Z999"}
    assert charges == ["1001"] and emails == ["1Z999"]  # each step ran exactly once
    assert runs == [job["id"], job["id"]]  # the handler ran again after the resume


def test_a_sleep_of_one_second_resumes_the_job(server):
    producer = _producer(server)
    seen: list[Any] = []

    def nap(job: ClaimedJob) -> dict[str, Any]:
        started = job.step("started", time.time)
        seen.append(job.sleep(1))
        return {"slept": time.time() - started}

    job = producer.enqueue("report")
    with running_worker(server, nap, types=["report"]) as worker:
        done = producer.wait(job["id"], timeout=FINISH_TIMEOUT_SECONDS)
    # Read once the worker has stopped: the wait may end before its thread counts the
    # completion it reported.
    assert worker.stats["suspended"] == 1 and worker.stats["completed"] == 1
    assert done["status"] == "completed" and done["result"]["slept"] >= 1.0
    assert seen == [None]  # the sleep returned once, on the run after the resume


def test_an_event_posted_before_the_wait_is_kept_and_resumes_it_at_once(server):
    producer = _producer(server)
    assert producer.post_event("order.paid", {"amount": 12}, key="77") == {"woken": 0}

    def wait_for_payment(job: ClaimedJob) -> dict[str, Any] | None:
        return job.wait_for_event("order.paid", key="77", timeout_seconds=3600)

    job = producer.enqueue("order")
    with running_worker(server, wait_for_payment, types=["order"]):
        done = producer.wait(job["id"], timeout=FINISH_TIMEOUT_SECONDS)
    assert done["status"] == "completed" and done["result"] == {"amount": 12}


def test_another_producers_event_does_not_wake_the_job(server):
    producer = _producer(server)

    def wait_for_payment(job: ClaimedJob) -> dict[str, Any] | None:
        return job.wait_for_event("order.paid", key="78", timeout_seconds=3600)

    job = producer.enqueue("order")
    with running_worker(server, wait_for_payment, types=["order"]):
        wait_until(lambda: _status(producer, job["id"]) == "suspended",
                   timeout=FINISH_TIMEOUT_SECONDS, what="the job to suspend")
        assert _producer(server).post_event("order.paid", key="78") == {"woken": 0}
        assert _status(producer, job["id"]) == "suspended"
        assert producer.post_event("order.paid", {"amount": 3}, key="78") == {"woken": 1}
        done = producer.wait(job["id"], timeout=FINISH_TIMEOUT_SECONDS)
    assert done["result"] == {"amount": 3}


def test_a_token_wait_is_resumed_by_its_waitpoint_with_no_key(server):
    producer = _producer(server)
    handed: list[tuple[str, str]] = []

    def approve(job: ClaimedJob) -> dict[str, Any] | None:
        return job.wait_for_token(on_token=lambda token, url: handed.append((token, url)),
                                  timeout_seconds=3600)

    job = producer.enqueue("report")
    with running_worker(server, approve, types=["report"]):
        token, url = wait_until(lambda: handed and handed[0], timeout=FINISH_TIMEOUT_SECONDS,
                                what="the runner to hand the token on")
        assert url.startswith(f"{server.url}/waitpoints/")
        assert _status(producer, job["id"]) == "suspended"
        anyone = Client(server.url, anonymous=True)
        anyone.complete_waitpoint(token, {"approved": True})
        with pytest.raises(Conflict):
            anyone.complete_waitpoint(token, {"approved": False})
        with pytest.raises(NotFound):
            anyone.complete_waitpoint(token + "x", {"approved": True})
        done = producer.wait(job["id"], timeout=FINISH_TIMEOUT_SECONDS)
    assert done["status"] == "completed" and done["result"] == {"approved": True}
    assert len(handed) == 1


def test_a_wait_that_times_out_raises_wait_timed_out_in_the_handler(server):
    producer = _producer(server)

    def wait_briefly(job: ClaimedJob) -> dict[str, Any]:
        try:
            job.wait_for_event("order.shipped", key="1002", timeout_seconds=1)
        except WaitTimedOut:
            return {"shipped": False}
        return {"shipped": True}

    job = producer.enqueue("order")
    with running_worker(server, wait_briefly, types=["order"]):
        done = producer.wait(job["id"], timeout=FINISH_TIMEOUT_SECONDS)
    assert done["status"] == "completed" and done["result"] == {"shipped": False}
