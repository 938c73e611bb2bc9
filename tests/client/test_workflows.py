"""Workflows through the Python client, against a real gunicorn-served queuelog on both
engines: ids by ref, the order example run by a Worker (charge, then mail and ship at once,
then done reading their results through job.dependencies()), idempotent replays, and bad
input as ValidationFailed naming the field."""

from __future__ import annotations

import contextlib
import pickle
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from queuelog_client import Client, Forbidden, NotFound, ValidationFailed, Worker
from queuelog_client.worker import ClaimedJob
from tests.client.conftest import wait_until
from tests.client.workflow_servers import WorkflowServer
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.slow

DEPENDENCIES_ROUTE = "/jobs/<id:job_id>/dependencies"
# Bounds a handler's wait for its twin: a server that never runs mail and ship together
# breaks the barrier and fails the job, which the test then names; no timing is asserted.
RENDEZVOUS_TIMEOUT_SECONDS = 30.0
FINISH_TIMEOUT_SECONDS = 60.0


def order(number: int = 1001, *, charge_retries: int | None = None) -> list[dict[str, Any]]:
    """charge → (mail, ship) → done, done running however mail and ship end."""
    payload = {"order": number, "to": "ada@example.com"}
    charge: dict[str, Any] = {"ref": "charge", "type": "charge", "payload": payload}
    if charge_retries is not None:
        charge["max_retries"] = charge_retries
    return [charge,
            {"ref": "mail", "type": "email", "payload": payload, "depends_on": ["charge"]},
            {"ref": "ship", "type": "ship", "payload": payload, "depends_on": ["charge"]},
            {"ref": "done", "type": "notify", "payload": payload,
             "depends_on": ["mail", "ship"], "on_dependency_failure": "run"}]


@pytest.fixture
def server(tmp_path: Path, db_url: str) -> Iterator[WorkflowServer]:
    live = WorkflowServer(tmp_path, db_url)
    live.start()
    yield live
    live.stop()


def _producer(server: WorkflowServer) -> Client:
    return server.client(server.create_key(f"shop-{uuid.uuid4().hex[:8]}", "producer"))


@contextlib.contextmanager
def running_worker(server: WorkflowServer, handler: Callable[[Any], Any],
                   **options: Any) -> Iterator[Worker]:
    """A Worker (the Python API) running `handler` in a thread until the block ends."""
    token = server.create_key(f"worker-{uuid.uuid4().hex[:8]}", "worker")
    worker = Worker(server.url, handler, token=token, wait_seconds=1, **options)
    failures: list[BaseException] = []

    def run() -> None:
        try:
            worker.run(install_signal_handlers=False)
        except BaseException as exc:  # handed to the test below
            failures.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop(grace_seconds=0)
        thread.join(timeout=30)
    assert not thread.is_alive() and not failures, failures


def test_a_workflow_created_through_the_client_answers_its_jobs_ids_by_ref(server):
    queue = _producer(server)
    created = queue.workflow(order(), name="order-1001")

    ids = created["jobs"]
    assert list(ids) == ["charge", "mail", "ship", "done"]
    assert len(set(ids.values())) == 4 and all(isinstance(i, int) for i in ids.values())
    assert (created["name"], created["status"], created["replayed"]) == (
        "order-1001", "running", False)
    assert (created["counts"]["pending"], created["counts"]["waiting"]) == (1, 3)

    shown = queue.get_workflow(created["id"])
    assert [(job["ref"], job["id"], job["type"], job["status"], job["depends_on"])
            for job in shown["jobs"]] == [
        ("charge", ids["charge"], "charge", "pending", []),
        ("mail", ids["mail"], "email", "waiting", [ids["charge"]]),
        ("ship", ids["ship"], "ship", "waiting", [ids["charge"]]),
        ("done", ids["done"], "notify", "waiting", [ids["mail"], ids["ship"]]),
    ]
    done = queue.get_job(ids["done"])
    assert (done["status"], done["depends_on"], done["waiting_on"],
            done["on_dependency_failure"]) == ("waiting", [ids["mail"], ids["ship"]], 2, "run")
    assert queue.get_job(ids["mail"])["on_dependency_failure"] == "cancel"
    assert queue.dependencies(ids["done"]) == [
        {"id": ids["mail"], "type": "email", "status": "waiting", "result": None},
        {"id": ids["ship"], "type": "ship", "status": "waiting", "result": None},
    ]
    assert [w["id"] for w in queue.list_workflows()["workflows"]] == [created["id"]]
    assert [w["id"] for w in queue.iter_workflows(status="running", page_size=1)] == [
        created["id"]]
    assert list(queue.iter_workflows(status="completed")) == []


def test_a_worker_completes_the_order_charge_then_mail_and_ship_together_then_done(server):
    queue = _producer(server)
    ran: list[str] = []
    together = threading.Barrier(2, timeout=RENDEZVOUS_TIMEOUT_SECONDS)

    def handle(job: ClaimedJob) -> dict[str, Any]:
        ran.append(job["type"])
        if job["type"] == "charge":
            return {"charged": job["payload"]["order"]}
        if job["type"] in {"email", "ship"}:
            together.wait()  # returns only once mail and ship are both running
            return {"sent_to": job["payload"]["to"]} if job["type"] == "email" else {
                "tracking": f"T-{job['payload']['order']}"}
        first = job.dependencies()
        assert job.dependencies() == first  # the second call is answered from the first
        return {"read": first}

    created = queue.workflow(order())
    ids = created["jobs"]
    with running_worker(server, handle, concurrency=2):
        done = queue.wait(ids["done"], timeout=FINISH_TIMEOUT_SECONDS)

    assert done["status"] == "completed", server.log()
    assert ran[0] == "charge" and sorted(ran[1:3]) == ["email", "ship"] and ran[3:] == [
        "notify"]
    assert done["result"] == {"read": [
        {"id": ids["mail"], "type": "email", "status": "completed",
         "result": {"sent_to": "ada@example.com"}},
        {"id": ids["ship"], "type": "ship", "status": "completed",
         "result": {"tracking": "T-1001"}},
    ]}
    # Its log line follows the answer: wait for it, then check that it stayed the only one.
    wait_until(lambda: server.requests_to(DEPENDENCIES_ROUTE), what="the request's log line")
    assert server.requests_to(DEPENDENCIES_ROUTE) == 1
    shown = queue.get_workflow(created["id"])
    assert shown["status"] == "completed"
    assert {job["status"] for job in shown["jobs"]} == {"completed"}


def test_a_failed_charge_cancels_mail_and_ship_and_done_runs_on_and_sees_it(server):
    queue = _producer(server)

    def handle(job: ClaimedJob) -> dict[str, Any]:
        if job["type"] == "charge":
            raise RuntimeError("card declined")
        if job["type"] == "notify":
            return {"seen": [(d["type"], d["status"]) for d in job.dependencies()]}
        raise AssertionError(f"{job['type']} ran after its charge failed")

    created = queue.workflow(order(charge_retries=0))
    ids = created["jobs"]
    with running_worker(server, handle):
        done = queue.wait(ids["done"], timeout=FINISH_TIMEOUT_SECONDS)

    assert done["status"] == "completed", server.log()
    assert done["result"] == {"seen": [["email", "cancelled"], ["ship", "cancelled"]]}
    shown = queue.get_workflow(created["id"])
    assert [(job["ref"], job["status"]) for job in shown["jobs"]] == [
        ("charge", "failed"), ("mail", "cancelled"), ("ship", "cancelled"),
        ("done", "completed")]
    assert shown["status"] == "failed"


def test_the_same_idempotency_key_replays_the_same_workflow_and_ids(server):
    queue = _producer(server)
    first = queue.workflow(order(), name="order-1001", idempotency_key="order-1001")
    again = queue.workflow(order(), name="order-1001", idempotency_key="order-1001")

    assert (again["id"], again["jobs"]) == (first["id"], first["jobs"])
    assert (first["replayed"], again["replayed"]) == (False, True)
    assert len(queue.list_workflows()["workflows"]) == 1
    assert len(list(queue.iter_jobs())) == 4

    with pytest.raises(ValidationFailed) as caught:
        queue.workflow(order(1002), name="order-1002", idempotency_key="order-1001")
    assert caught.value.status == 422
    assert len(list(queue.iter_jobs())) == 4


def test_a_workflow_whose_answer_was_lost_is_sent_again_and_stored_once(server):
    token = server.create_key("shop", "producer")
    proxy = TcpProxy(server.port)
    proxy.start()
    proxy.lose_answer_to(b"POST /workflows ")
    try:
        created = Client(f"http://127.0.0.1:{proxy.port}", token,
                         backoff_seconds=0.01).workflow(order())
    finally:
        proxy.stop()

    assert proxy.answers_lost == 1
    assert created["replayed"] is True  # the first attempt stored it; the retry found it
    queue = server.client(token)
    assert [w["id"] for w in queue.list_workflows()["workflows"]] == [created["id"]]
    assert sorted(job["id"] for job in queue.iter_jobs()) == sorted(created["jobs"].values())


def test_bad_input_raises_validation_failed_naming_the_field_and_stores_nothing(server):
    queue = _producer(server)
    twice = order()
    twice[1]["ref"] = "charge"
    with pytest.raises(ValidationFailed) as caught:
        queue.workflow(twice)
    assert caught.value.status == 422 and "jobs.1.ref" in caught.value.errors

    with pytest.raises(ValidationFailed) as caught:
        queue.workflow([{"ref": f"j{n}", "type": "email"} for n in range(1001)])
    assert "jobs" in caught.value.errors

    cycle = order()
    cycle[0]["depends_on"] = ["done"]
    with pytest.raises(ValidationFailed) as caught:
        queue.workflow(cycle)
    assert "charge" in str(caught.value) and "done" in str(caught.value)

    with pytest.raises(ValidationFailed) as caught:
        queue.enqueue("email", depends_on=[999_999])
    assert "depends_on" in caught.value.errors

    with pytest.raises(ValidationFailed) as caught:
        queue.enqueue_many([{"ref": "mail", "type": "email", "depends_on": ["charge"]},
                            {"ref": "charge", "type": "charge"}])
    assert "jobs.0.depends_on" in caught.value.errors

    assert queue.list_workflows()["workflows"] == [] and list(queue.iter_jobs()) == []


def test_enqueue_takes_depends_on_and_on_dependency_failure(server):
    queue = _producer(server)
    charge = queue.enqueue("charge", {"order": 7})
    mail = queue.enqueue("email", {"order": 7}, depends_on=[charge["id"]],
                         on_dependency_failure="run")
    assert (mail["status"], mail["depends_on"], mail["waiting_on"],
            mail["on_dependency_failure"]) == ("waiting", [charge["id"]], 1, "run")

    ship, done = queue.enqueue_many([
        {"ref": "ship", "type": "ship", "depends_on": [charge["id"]]},
        {"type": "notify", "depends_on": ["ship", mail["id"]]}])
    assert done["depends_on"] == [ship["id"], mail["id"]]
    assert [job["status"] for job in (ship, done)] == ["waiting", "waiting"]

    worker = server.client(server.create_key("cashier", "worker"))
    claimed = worker.claim(types=["charge"])
    assert claimed is not None and claimed["id"] == charge["id"]
    worker.complete(claimed["id"], claimed["lease_token"], result={"charged": 7})
    assert [queue.get_job(job["id"])["status"] for job in (mail, ship, done)] == [
        "pending", "pending", "waiting"]
    assert queue.dependencies(mail["id"]) == [
        {"id": charge["id"], "type": "charge", "status": "completed",
         "result": {"charged": 7}}]


def test_cancel_and_who_may_see_a_workflow(server):
    queue = _producer(server)
    created = queue.workflow(order())

    with pytest.raises(NotFound):
        _producer(server).get_workflow(created["id"])
    with pytest.raises(Forbidden):
        server.client(server.create_key("courier", "worker")).workflow(order())

    cancelled = queue.cancel_workflow(created["id"])
    assert cancelled["status"] == "cancelled"
    assert {job["status"] for job in cancelled["jobs"]} == {"cancelled"}
    assert queue.get_workflow(created["id"]) == cancelled
    assert [w["id"] for w in queue.list_workflows(status="cancelled")["workflows"]] == [
        created["id"]]


def test_a_handlers_job_pickles_as_the_plain_dict_a_process_pool_can_take():
    job = ClaimedJob({"id": 7, "payload": {"order": 1001}},
                     Client("http://127.0.0.1:9", "unused"))
    copied = pickle.loads(pickle.dumps(job))  # noqa: S301 (our own bytes)
    assert type(copied) is dict and copied == {"id": 7, "payload": {"order": 1001}}
