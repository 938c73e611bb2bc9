"""The client's unique enqueues and Client.wait against a real gunicorn-served queuelog."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest

import queuelog_client.client as client_module
from queuelog_client import Client, Conflict, WaitTimeout
from tests.client.conftest import LiveServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, sqlite_template: str
           ) -> Iterator[LiveServer]:
    live = LiveServer(tmp_path_factory.mktemp("unique-server"), sqlite_template)
    live.start()
    yield live
    live.stop()


def _key(server: LiveServer, role: str) -> Client:
    return server.client(server.create_key(f"{role}-{uuid.uuid4().hex[:8]}", role))


def test_enqueue_with_unique_says_what_became_of_the_request(server):
    queue = _key(server, "producer")
    first = queue.enqueue("email", {"to": "ada"}, unique={"key": "digest-ada"})
    returned = queue.enqueue("email", {"to": "ada"}, unique={"key": "digest-ada"})
    replaced = queue.enqueue("email", {"to": "ada", "v": 2}, delay_seconds=60,
                             unique={"key": "digest-ada", "on_conflict": "replace"})

    assert (first["deduplicated"], first["unique_key"]) == (False, "digest-ada")
    assert (returned["id"], returned["deduplicated"]) == (first["id"], True)
    assert (replaced["id"], replaced["deduplicated"]) == (first["id"], "replaced")
    assert replaced["payload"] == {"to": "ada", "v": 2}
    with pytest.raises(Conflict) as refused:
        queue.enqueue("email", unique={"key": "digest-ada", "on_conflict": "reject"})
    assert refused.value.problem["existing_job_id"] == first["id"]


def test_enqueue_many_items_meet_earlier_items_of_the_batch(server):
    queue = _key(server, "producer")
    jobs = queue.enqueue_many([{"type": "pdf", "payload": {"n": n}, "unique": {"key": "doc"}}
                               for n in range(3)])
    assert len({job["id"] for job in jobs}) == 1
    assert [job["deduplicated"] for job in jobs] == [False, True, True]


def test_wait_returns_the_job_once_a_worker_completes_it(server):
    queue, worker = _key(server, "producer"), _key(server, "worker")
    job = queue.enqueue("sync", {"n": 1})
    claimed = worker.claim(types=["sync"], wait_seconds=5)
    assert claimed is not None and claimed["id"] == job["id"]

    def finish_soon() -> None:
        time.sleep(0.5)
        worker.complete(claimed["id"], claimed["lease_token"], result={"ok": True})

    threading.Thread(target=finish_soon).start()
    finished = queue.wait(job["id"], timeout=30)
    assert (finished["status"], finished["result"]) == ("completed", {"ok": True})


def test_wait_asks_again_past_the_servers_longest_wait_and_then_times_out(server,
                                                                          monkeypatch):
    # The server holds a request at most a minute; a shorter cap here makes the loop show.
    monkeypatch.setattr(client_module, "MAX_WAIT_PER_REQUEST_SECONDS", 0.2)
    queue = _key(server, "producer")
    job = queue.enqueue("email", {"n": "never claimed"}, delay_seconds=3600)
    started = time.monotonic()
    with pytest.raises(WaitTimeout) as timed_out:
        queue.wait(job["id"], timeout=1)
    assert time.monotonic() - started >= 1
    assert timed_out.value.job["status"] == "pending"
    assert isinstance(timed_out.value, TimeoutError)
