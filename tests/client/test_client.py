"""The client against a real gunicorn-served queuelog: enqueue (one and many), reads,
the worker calls, and the server's problems as typed exceptions."""

from __future__ import annotations

import contextlib
import socket
import threading
import uuid
from collections.abc import Iterator

import pytest

from queuelog_client import (
    Client,
    Conflict,
    Forbidden,
    NotFound,
    ProblemError,
    Unauthorized,
    ValidationFailed,
)
from tests.client.conftest import LiveServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, sqlite_template: str
           ) -> Iterator[LiveServer]:
    # One server for this module's tests: each test uses keys of its own, and producers
    # only see their own jobs; only the claim test enqueues (and claims) the "sync" type.
    live = LiveServer(tmp_path_factory.mktemp("client-server"), sqlite_template)
    live.start()
    yield live
    live.stop()


def _producer(server: LiveServer, **limits: object) -> Client:
    return server.client(server.create_key(f"producer-{uuid.uuid4().hex[:8]}", "producer",
                                           **limits))


def test_enqueue_sends_a_generated_idempotency_key_so_each_call_stores_one_job(server):
    queue = _producer(server)
    first = queue.enqueue("email", {"to": "ada@example.com"})
    second = queue.enqueue("email", {"to": "ada@example.com"})

    assert first["status"] == "pending" and first["replayed"] is False
    assert str(uuid.UUID(first["idempotency_key"])) == first["idempotency_key"]
    assert second["id"] != first["id"]
    assert second["idempotency_key"] != first["idempotency_key"]


def test_enqueue_with_the_callers_key_twice_replays_the_first_job(server):
    queue = _producer(server)
    first = queue.enqueue("email", {"to": "bob@example.com"}, idempotency_key="order-1001",
                          priority="low", max_retries=5, delay_seconds=60)
    again = queue.enqueue("email", {"to": "bob@example.com"}, idempotency_key="order-1001",
                          priority="low", max_retries=5, delay_seconds=60)

    assert again["id"] == first["id"]
    assert again["replayed"] is True
    assert first["priority"] == "low" and first["max_retries"] == 5
    assert [job["id"] for job in queue.iter_jobs()] == [first["id"]]


def test_enqueue_many_keeps_the_order_and_gives_each_item_its_own_key(server):
    queue = _producer(server)
    jobs = queue.enqueue_many([
        {"type": "email", "payload": {"n": 1}},
        {"type": "pdf", "payload": {"n": 2}, "idempotency_key": "mine"},
        {"type": "email", "payload": {"n": 3}, "priority": "low"},
    ])

    assert [job["payload"]["n"] for job in jobs] == [1, 2, 3]
    keys = [job["idempotency_key"] for job in jobs]
    assert keys[1] == "mine"
    assert len(set(keys)) == 3 and all(keys)
    assert [job["replayed"] for job in jobs] == [False, False, False]


def test_get_list_and_iterate_jobs(server):
    queue = _producer(server)
    ids = [job["id"] for job in queue.enqueue_many(
        [{"type": "email" if n % 2 else "pdf", "payload": {"n": n},
          "tags": ["odd"] if n % 2 else []} for n in range(7)])]

    assert queue.get_job(ids[3])["payload"] == {"n": 3}
    page = queue.list_jobs(limit=2)
    assert [job["id"] for job in page["jobs"]] == ids[:2] and page["next_cursor"]
    assert [job["id"] for job in queue.iter_jobs(page_size=3)] == ids
    assert [job["payload"]["n"] for job in queue.iter_jobs(type="pdf")] == [0, 2, 4, 6]
    assert len(list(queue.iter_jobs(status="pending"))) == 7
    assert [job["payload"]["n"] for job in queue.iter_jobs(tag="odd", page_size=2)] == [1, 3, 5]


def test_a_validation_problem_is_raised_with_status_title_detail_and_field_errors(server):
    queue = _producer(server)
    with pytest.raises(ValidationFailed) as caught:
        queue.enqueue("fax", {})
    problem = caught.value
    assert problem.status == 422
    assert problem.title == "Validation failed"
    assert problem.detail
    assert "type" in problem.errors
    assert problem.type.endswith("validation-failed")
    assert "422" in str(problem)

    with pytest.raises(ValidationFailed) as caught:
        queue.enqueue_many([{"type": "email"}, {"type": "fax"}])
    assert "jobs.1.type" in caught.value.errors
    assert list(queue.iter_jobs()) == []  # nothing stored when any item is invalid


def test_each_refusal_has_its_own_exception_type(server):
    queue = _producer(server)
    with pytest.raises(NotFound) as not_found:
        queue.get_job(999_999)
    assert not_found.value.status == 404

    with pytest.raises(Forbidden):
        queue.enqueue("email", priority="critical")

    with pytest.raises(Unauthorized) as unauthorized:
        Client(server.url, "not-a-token").list_jobs()
    assert unauthorized.value.status == 401
    assert "not-a-token" not in str(unauthorized.value)

    worker = server.client(server.create_key(f"w-{uuid.uuid4().hex[:8]}", "worker"))
    job = queue.enqueue("pdf")
    with pytest.raises(Conflict) as conflict:
        worker.complete(job["id"], result={})
    assert conflict.value.status == 409
    assert isinstance(conflict.value, ProblemError)


def test_the_worker_calls_claim_heartbeat_complete_and_fail(server):
    queue = _producer(server)
    worker = server.client(server.create_key(f"w-{uuid.uuid4().hex[:8]}", "worker"))
    first, second, third = queue.enqueue_many([{"type": "sync", "payload": {"n": n}}
                                               for n in range(3)])

    claimed = worker.claim(types=["sync"], lease_seconds=60)
    assert claimed["id"] == first["id"] and claimed["lease_token"]
    assert worker.heartbeat(claimed["id"], claimed["lease_token"],
                            lease_seconds=120)["status"] == "running"
    done = worker.complete(claimed["id"], claimed["lease_token"], result={"ok": True})
    assert done["status"] == "completed" and done["result"] == {"ok": True}

    both = worker.claim_many(5, types=["sync"], wait_seconds=1)
    assert [job["id"] for job in both] == [second["id"], third["id"]]
    failed = worker.fail(both[0]["id"], both[0]["lease_token"], error="boom",
                         retry_in_seconds=3600)
    assert failed["status"] == "pending" and failed["retry_count"] == 1
    results = worker.complete_many([{"id": both[1]["id"], "lease_token": both[1]["lease_token"],
                                     "result": None}])
    assert results[0]["status"] == 200

    assert worker.claim(types=["sync"]) is None
    assert worker.claim_many(5, types=["sync"], wait_seconds=0.2) == []


def test_attempts_and_explain_of_a_producers_own_job(server):
    queue = _producer(server)
    worker = server.client(server.create_key(f"w-{uuid.uuid4().hex[:8]}", "worker"))
    job = queue.enqueue("sync", {"n": 1})
    claimed = worker.claim(types=["sync"], lease_seconds=60)
    assert claimed["id"] == job["id"]

    [attempt] = queue.attempts(job["id"])
    assert (attempt["number"], attempt["outcome"]) == (1, "running")
    explained = queue.explain(job["id"])
    assert explained["reasons"][0]["code"] == "running"
    assert explained["position"] is None  # running: not in line
    waiting = queue.enqueue("sync", {"n": 2})
    place = queue.explain(waiting["id"])  # claimable: its place in the line of sync jobs
    assert place["position"] >= 0 and place["position_capped"] is False
    assert place["aging"] is None  # sync jobs do not age here
    with pytest.raises(NotFound):
        _producer(server).explain(job["id"])


class _ResponseDroppingProxy:
    """Forwards loopback TCP to the server, but on the first connection throws the server's
    answer away and hangs up: the request was handled, the client never hears of it."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            drop = self.connections == 1
            threading.Thread(target=self._pipe, args=(downstream, upstream, False),
                             daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, downstream, drop),
                             daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket, drop: bool) -> None:
        try:
            while data := source.recv(65536):
                if drop:
                    break
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            # shutdown, not just close: it wakes the other thread blocked in recv().
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.listener.close()


def test_a_lost_answer_is_retried_and_the_idempotency_key_keeps_it_one_job(server):
    token = server.create_key(f"producer-{uuid.uuid4().hex[:8]}", "producer")
    proxy = _ResponseDroppingProxy(server.port)
    try:
        job = Client(f"http://127.0.0.1:{proxy.port}", token,
                     backoff_seconds=0.01).enqueue("email", {"to": "carol@example.com"})
    finally:
        proxy.close()

    assert proxy.connections == 2
    assert job["replayed"] is True  # the first attempt stored it; the retry found it
    assert [j["id"] for j in server.client(token).iter_jobs()] == [job["id"]]
