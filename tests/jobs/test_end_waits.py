"""When the process stops (gunicorn's stop signals call the app's "queuelog_end_waits"), the
requests that wait answer at once with what there is: a claim 204, a read the job as it is;
and a request that asks to wait afterwards is answered at once too. Nothing is claimed or
changed by the stop itself."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from tests.conftest import Api

# Far longer than an answer takes once the waits end; far shorter than the waits asked for.
ANSWERED_WITHIN_SECONDS = 10


def _waiting(request: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    answer: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: answer.update(response=request()), daemon=True)
    thread.start()
    return thread, answer


def _answered(thread: threading.Thread, answer: dict[str, Any]) -> Any:
    thread.join(timeout=ANSWERED_WITHIN_SECONDS)
    assert "response" in answer, "still waiting after the waits ended"
    return answer["response"]


def _until_waiting(app: Any) -> None:
    """Until a claim waits for claimable jobs and a read for a finished one, both at once
    (each waits on its signal's condition variable between its peeks)."""
    jobs = app.extensions["queuelog"].jobs
    deadline = time.monotonic() + ANSWERED_WITHIN_SECONDS
    while not (jobs.signal._condition._waiters and jobs.finished._condition._waiters):
        assert time.monotonic() < deadline, "the requests never waited"
        time.sleep(0.01)


def test_a_waiting_claim_and_a_waiting_read_answer_once_the_waits_end(app, producer, worker):
    api = Api(app.test_client())
    job = api.enqueue(producer, type="email").json
    claim = _waiting(lambda: Api(app.test_client()).claim(worker, types=["pdf"],
                                                         wait_seconds=20))
    read = _waiting(lambda: app.test_client().get(
        f"/jobs/{job['id']}", query_string={"wait_seconds": "60"}, headers=producer.headers))
    _until_waiting(app)

    app.extensions["queuelog_end_waits"]()

    assert _answered(*claim).status_code == 204
    answered = _answered(*read)
    assert answered.status_code == 200
    assert (answered.json["id"], answered.json["status"]) == (job["id"], "pending")
    assert "Retry-After" not in answered.headers  # it waited; the stop answered it
    assert api.get(producer, job["id"]).json["status"] == "pending"


def test_after_the_waits_end_a_request_that_asks_to_wait_is_answered_at_once(app, producer,
                                                                            worker):
    api = Api(app.test_client())
    job = api.enqueue(producer, type="email").json
    app.extensions["queuelog_end_waits"]()

    claim = _waiting(lambda: api.claim(worker, types=["pdf"], wait_seconds=20))
    assert _answered(*claim).status_code == 204
    read = _waiting(lambda: app.test_client().get(
        f"/jobs/{job['id']}", query_string={"wait_seconds": "60"}, headers=producer.headers))
    assert _answered(*read).json["status"] == "pending"
    # A claim that finds work still takes it: the stop ends waits, not claims.
    assert api.claim(worker, types=["email"], wait_seconds=20).json["id"] == job["id"]
