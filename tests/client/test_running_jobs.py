"""Running jobs through the Python client (contract section 17): a cancel requested while a
handler runs, progress and checkpoints, an attempt's timeout and a job's expiry at enqueue.

The live tests run a real gunicorn-served queuelog on both engines, with a Worker in a
thread where the test needs the handler's state; the first tests need no server."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from queuelog_client import (
    CancelRequested,
    Client,
    Conflict,
    NotFound,
    RetryLater,
    ValidationFailed,
    Worker,
)
from queuelog_client.client import _heartbeat_fields, _job_fields, _running_limits
from queuelog_client.worker import (
    MAX_PROGRESS,
    MAX_PROGRESS_MESSAGE_CHARS,
    ClaimedJob,
)
from tests.client.conftest import wait_until
from tests.client.workflow_servers import WorkflowServer

HEARTBEAT_ROUTE = "/jobs/<id:job_id>/heartbeat"
JOB_TYPES = "email,report"
# Bounds each wait of the live tests: a runner that never notices fails them, none is timed.
FINISH_TIMEOUT_SECONDS = 60.0


# -- what the client sends (no server) ---------------------------------------------------------

def test_an_enqueues_running_limits_are_sent_as_given_and_a_datetime_as_rfc_3339():
    moment = datetime(2026, 12, 2, 14, 0, tzinfo=UTC)
    assert _running_limits(600, moment, None) == {
        "timeout_seconds": 600, "expires_at": "2026-12-02T14:00:00+00:00"}
    assert _running_limits(None, None, 3600) == {"expires_in_seconds": 3600}
    assert _running_limits(None, None, None) == {}
    # A batch's or a workflow's items are converted the same way.
    assert _job_fields({"type": "email", "expires_at": moment})["expires_at"] == (
        "2026-12-02T14:00:00+00:00")


def test_a_naive_expires_at_is_refused_before_anything_is_sent():
    with pytest.raises(ValueError, match="expires_at must be timezone-aware"):
        _running_limits(None, datetime(2026, 12, 2, 14, 0), None)
    with pytest.raises(ValueError, match="expires_at must be timezone-aware"):
        _job_fields({"type": "email", "expires_at": datetime(2026, 12, 2)})


def test_a_heartbeat_sends_only_what_it_is_given():
    assert _heartbeat_fields(None, None, None, None) == {}
    assert _heartbeat_fields(60, (3, 10), "three of ten", {"row": 3}) == {
        "lease_seconds": 60, "progress": {"done": 3, "total": 10}, "message": "three of ten",
        "checkpoint": {"row": 3}}


def _job(beats: list[float] | None = None) -> ClaimedJob:
    return ClaimedJob({"id": 7, "payload": {}, "lease_token": "secret"},
                      Client("http://127.0.0.1:9", "unused"),
                      beat_soon=None if beats is None else beats.append)


def test_a_handlers_job_keeps_its_lease_token_out_of_the_dict():
    job = _job()
    assert "lease_token" not in job and dict(job) == {"id": 7, "payload": {}}
    assert not job.cancel_requested
    job.raise_if_cancel_requested()  # nothing requested: nothing raised


def test_progress_in_a_tight_loop_asks_for_one_heartbeat_not_one_per_call():
    beats: list[float] = []
    job = _job(beats)
    for done in range(10_000):
        job.progress(done, 10_000)
    assert len(beats) == 1
    # The beat carries the latest; once delivered, the next progress asks again.
    number, progress, _ = job._progress.unsent()
    assert progress == {"done": 9_999, "total": 10_000}
    assert job._progress.delivered(number, time.monotonic()) is None
    job.progress(10_000, 10_000)
    assert len(beats) == 2


def test_progress_refuses_what_the_server_would_and_cuts_a_long_message():
    job = _job([])
    for done, total in [(-1, 10), (11, 10), (0, MAX_PROGRESS + 1)]:
        with pytest.raises(ValueError, match="0 <= done <= total"):
            job.progress(done, total)
    with pytest.raises(TypeError, match="must be an int"):
        job.progress(1.5, 10)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be an int"):
        job.progress(True, 10)
    job.progress(1, 10, "x" * 500)
    assert job._progress.unsent()[2] == "x" * MAX_PROGRESS_MESSAGE_CHARS


def _object_schema(schema: dict[str, Any], schemas: dict[str, Any]) -> dict[str, Any]:
    """The object schema a property's schema names, through $ref and anyOf/allOf/oneOf."""
    if "properties" in schema:
        return schema
    if "$ref" in schema:
        return _object_schema(schemas[schema["$ref"].rsplit("/", 1)[1]], schemas)
    for combined in ("anyOf", "allOf", "oneOf"):
        for choice in schema.get(combined, []):
            with contextlib.suppress(LookupError):
                return _object_schema(choice, schemas)
    raise LookupError(schema)


def test_the_progress_bounds_are_the_servers(app: Flask):
    document: dict[str, Any] = app.test_client().get("/openapi.json").json
    schemas = document["components"]["schemas"]
    heartbeat = _object_schema(document["paths"]["/jobs/{job_id}/heartbeat"]["post"][
        "requestBody"]["content"]["application/json"]["schema"], schemas)
    assert heartbeat["properties"]["message"]["maxLength"] == MAX_PROGRESS_MESSAGE_CHARS
    progress = _object_schema(heartbeat["properties"]["progress"], schemas)
    for name in ("done", "total"):
        assert (progress["properties"][name]["minimum"],
                progress["properties"][name]["maximum"]) == (0, MAX_PROGRESS)


# -- against a live server -----------------------------------------------------------------------

@pytest.fixture
def server(tmp_path: Path, db_url: str) -> Iterator[WorkflowServer]:
    live = WorkflowServer(tmp_path, db_url, job_types=JOB_TYPES)
    live.start()
    yield live
    live.stop()


def _producer(server: WorkflowServer) -> Client:
    return server.client(server.create_key(f"shop-{uuid.uuid4().hex[:8]}", "producer"))


@contextlib.contextmanager
def running_worker(server: WorkflowServer, handler: Callable[[Any], Any],
                   **options: Any) -> Iterator[Worker]:
    """A Worker of `handler` in a thread, stopped (and its errors raised) on the way out."""
    options.setdefault("wait_seconds", 1)
    worker = Worker(server.url, handler, token=server.create_key(
        f"worker-{uuid.uuid4().hex[:8]}", "worker"), **options)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            worker.run(install_signal_handlers=False)
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop(grace_seconds=0)
        thread.join(timeout=30)
    assert not thread.is_alive() and not failure, failure


def _watch_until_cancelled(job: ClaimedJob) -> dict[str, Any]:
    while not job.cancel_requested:
        time.sleep(0.05)
    return {"stopped": True}


def _raise_once_cancelled(job: ClaimedJob) -> dict[str, Any]:
    while True:
        job.raise_if_cancel_requested()
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("handler", [_watch_until_cancelled, _raise_once_cancelled],
                         ids=["returns", "raises"])
def test_a_cancel_requested_while_a_handler_runs_stops_it_at_the_next_heartbeat(
        server, handler, caplog):
    caplog.set_level("INFO", logger="queuelog_client.worker")
    producer = _producer(server)
    admin = server.client()
    job = producer.enqueue("report", {"rows": 1_000_000}, max_retries=3)
    # Heartbeats every second: the cancel is heard at the first one after it, long before
    # the lease (renewed by each heartbeat) could run out.
    with running_worker(server, handler, types=["report"], lease_seconds=3) as worker:
        wait_until(lambda: admin.get_job(job["id"])["status"] == "running",
                   what="the handler to start")
        beats_before = server.requests_to(HEARTBEAT_ROUTE)
        asked = admin.cancel(job["id"])
        assert asked["status"] == "running" and asked["cancel_requested"] is True
        wait_until(lambda: worker.stats["cancelled"] == 1, timeout=FINISH_TIMEOUT_SECONDS,
                   what="the handler to stop and the runner to report the cancel")
        # At most the heartbeat in flight when the cancel came, and the next one.
        assert server.requests_to(HEARTBEAT_ROUTE) - beats_before <= 2
        assert worker.stats["completed"] == worker.stats["failed"] == 0

    done = admin.get_job(job["id"])
    assert done["status"] == "cancelled" and done["retry_count"] == 0
    attempts = admin.attempts(job["id"])
    assert [attempt["outcome"] for attempt in attempts] == ["cancelled"]
    if handler is _raise_once_cancelled:
        assert attempts[0]["error"].startswith("CancelRequested: ")
    assert f"job {job['id']} cancelled on request" in caplog.text


@pytest.mark.slow
def test_a_producer_cancels_its_own_running_job_and_the_holder_hears_it(server):
    producer = _producer(server)
    job = producer.enqueue("report", max_retries=3)
    worker = server.client(server.create_key("raw-worker", "worker"))
    claimed = worker.claim(types=["report"])
    assert claimed is not None and claimed["id"] == job["id"]
    assert claimed["checkpoint"] is None  # a first attempt

    assert producer.cancel(job["id"])["cancel_requested"] is True
    beat = worker.heartbeat(job["id"], claimed["lease_token"], progress=(1, 4),
                            message="one of four")
    assert beat["status"] == "running" and beat["cancel_requested"] is True
    ended = worker.fail(job["id"], claimed["lease_token"], error="stopped on request")
    assert ended["status"] == "cancelled"
    assert [a["outcome"] for a in producer.attempts(job["id"])] == ["cancelled"]
    with pytest.raises(NotFound):
        _producer(server).cancel(job["id"])  # another producer's job


@pytest.mark.slow
def test_progress_reported_by_a_handler_shows_on_the_job_while_it_runs(server):
    producer = _producer(server)
    job = producer.enqueue("report")
    release = threading.Event()

    def handle(claimed: ClaimedJob) -> dict[str, Any]:
        claimed.progress(3, 10, "three of ten")
        release.wait(FINISH_TIMEOUT_SECONDS)
        return {"rows": 10}

    # A long lease: the progress must show without waiting for a regular heartbeat.
    with running_worker(server, handle, types=["report"], lease_seconds=120):
        shown = wait_until(lambda: producer.get_job(job["id"])["progress"], timeout=30,
                           what="the progress on the job")
        assert {name: shown[name] for name in ("done", "total", "message")} == {
            "done": 3, "total": 10, "message": "three of ten"}
        assert producer.get_job(job["id"])["status"] == "running"
        release.set()
        assert producer.wait(job["id"], timeout=FINISH_TIMEOUT_SECONDS)["status"] == (
            "completed")


@pytest.mark.slow
def test_progress_in_a_tight_loop_sends_few_heartbeats_and_the_last_progress_arrives(server):
    producer = _producer(server)
    job = producer.enqueue("report")
    release = threading.Event()

    def handle(claimed: ClaimedJob) -> None:
        for done in range(1, 50_001):
            claimed.progress(done, 50_000)
        release.wait(FINISH_TIMEOUT_SECONDS)

    with running_worker(server, handle, types=["report"], lease_seconds=120):
        wait_until(lambda: (producer.get_job(job["id"])["progress"] or {}).get("done") == 50_000,
                   timeout=30, what="the last progress on the job")
        assert server.requests_to(HEARTBEAT_ROUTE) < 20  # 50,000 calls
        release.set()
        producer.wait(job["id"], timeout=FINISH_TIMEOUT_SECONDS)


@pytest.mark.slow
def test_a_checkpoint_saved_by_one_attempt_is_handed_to_the_next(server):
    producer = _producer(server)
    job = producer.enqueue("report", max_retries=2)
    seen: list[Any] = []

    def handle(claimed: ClaimedJob) -> dict[str, Any]:
        seen.append(claimed["checkpoint"])
        if claimed["checkpoint"] is None:
            claimed.checkpoint({"next_row": 420})
            raise RetryLater(0, "the database went away")  # a failure, without the backoff
        return {"resumed_from": claimed["checkpoint"]["next_row"]}

    with running_worker(server, handle, types=["report"]):
        done = producer.wait(job["id"], timeout=FINISH_TIMEOUT_SECONDS)
    assert done["status"] == "completed" and done["result"] == {"resumed_from": 420}
    assert seen == [None, {"next_row": 420}]


@pytest.mark.slow
def test_a_checkpoint_after_the_lease_was_lost_raises_conflict(server):
    producer = _producer(server)
    job = producer.enqueue("report")
    worker = server.client(server.create_key("raw-worker", "worker"))
    claimed = worker.claim(types=["report"])
    assert claimed is not None
    worker.complete(job["id"], claimed["lease_token"])
    with pytest.raises(Conflict):
        ClaimedJob(claimed, worker).checkpoint({"next_row": 1})


@pytest.mark.slow
def test_a_checkpoint_larger_than_a_payload_is_refused_naming_it(server):
    producer = _producer(server)
    job = producer.enqueue("report")
    worker = server.client(server.create_key("raw-worker", "worker"))
    claimed = worker.claim(types=["report"])
    assert claimed is not None
    with pytest.raises(ValidationFailed) as refused:
        ClaimedJob(claimed, worker).checkpoint({"rows": "x" * 70_000})
    assert "checkpoint" in (refused.value.errors or {})
    assert producer.get_job(job["id"])["status"] == "running"  # the lease is still held


@pytest.mark.slow
def test_a_fails_checkpoint_is_handed_to_the_next_attempt(server):
    producer = _producer(server)
    job = producer.enqueue("report", max_retries=2)
    worker = server.client(server.create_key("raw-worker", "worker"))
    first = worker.claim(types=["report"])
    assert first is not None
    worker.fail(job["id"], first["lease_token"], error="interrupted", retry_in_seconds=0,
                checkpoint={"next_row": 7})
    second = wait_until(lambda: worker.claim(types=["report"]), what="the second attempt")
    assert second["id"] == job["id"] and second["checkpoint"] == {"next_row": 7}


@pytest.mark.slow
def test_timeout_and_expiry_pass_through_enqueue_and_its_batch(server):
    producer = _producer(server)
    job = producer.enqueue("email", timeout_seconds=600, expires_in_seconds=3600)
    assert job["timeout_seconds"] == 600
    expires = datetime.fromisoformat(job["expires_at"])
    assert datetime.now(UTC) < expires <= datetime.now(UTC) + timedelta(seconds=3600)

    moment = (datetime.now(UTC) + timedelta(days=1)).replace(microsecond=0)
    [batched] = producer.enqueue_many([{"type": "email", "timeout_seconds": 30,
                                        "expires_at": moment}])
    assert batched["timeout_seconds"] == 30
    assert datetime.fromisoformat(batched["expires_at"]) == moment
    assert producer.get_job(batched["id"])["expires_at"] == batched["expires_at"]

    plain = producer.enqueue("email")
    assert plain["timeout_seconds"] is None and plain["expires_at"] is None
    assert plain["cancel_requested"] is False and plain["progress"] is None

    with pytest.raises(ValidationFailed) as both:
        producer.enqueue("email", expires_at=moment, expires_in_seconds=60)
    assert "expires_in_seconds" in (both.value.errors or {})


@pytest.mark.slow
def test_a_job_not_claimed_before_it_expires_is_cancelled_not_run(server):
    producer = _producer(server)
    job = producer.enqueue("email", expires_in_seconds=1)
    worker = server.client(server.create_key("raw-worker", "worker"))
    expires = datetime.fromisoformat(job["expires_at"])
    wait_until(lambda: datetime.now(UTC) > expires + timedelta(seconds=0.5),
               what="the job's expiry to pass")
    assert worker.claim(types=["email"]) is None  # never handed out once past its expiry
    # Cancelled by the service's maintenance loop (within a second, docs/JOBS.md; a loaded
    # machine may take longer, and the test asserts no timing).
    wait_until(lambda: producer.get_job(job["id"])["status"] == "cancelled",
               timeout=15, what="the expired job cancelled by the service")


@pytest.mark.slow
def test_an_attempt_past_its_timeout_is_over_and_its_late_report_refused(server):
    producer = _producer(server)
    job = producer.enqueue("email", timeout_seconds=1, max_retries=0)
    worker = server.client(server.create_key("raw-worker", "worker"))
    claimed = worker.claim(types=["email"], lease_seconds=600)
    assert claimed is not None
    # The lease asked for does not run past the attempt's deadline.
    lease = (datetime.fromisoformat(claimed["lease_expires_at"])
             - datetime.fromisoformat(claimed["claimed_at"]))
    assert lease <= timedelta(seconds=1)
    deadline = datetime.fromisoformat(claimed["lease_expires_at"])
    wait_until(lambda: datetime.now(UTC) > deadline + timedelta(seconds=0.5),
               what="the attempt's deadline to pass")
    with pytest.raises(Conflict):
        worker.complete(job["id"], claimed["lease_token"], result={"late": True})

    def ended() -> bool:
        worker.claim(types=["email"])  # a claim sweeps what is over, at the latest
        return producer.get_job(job["id"])["status"] == "failed"

    wait_until(ended, timeout=FINISH_TIMEOUT_SECONDS, what="the timed-out attempt to end")
    assert [a["outcome"] for a in producer.attempts(job["id"])] == ["timed_out"]


def test_cancel_requested_is_exported_and_an_exception():
    assert issubclass(CancelRequested, Exception)
