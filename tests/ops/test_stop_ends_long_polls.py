"""A stop signal to the gunicorn that `queuelog serve` runs (the shipped settings) ends its
long polls at once: a claim waiting for work answers 204 and a read waiting for its job to
finish answers the job as it is, then the server exits and its port is free, long before
the polls would have run out (queuelog_gunicorn/shutdown.py)."""

from __future__ import annotations

import shutil
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from queuelog_gunicorn.binding import first_unbindable
from tests.servers import (
    HOST,
    GunicornServer,
    bearer,
    create_api_key,
    free_port,
    gunicorn_argv,
    server_environment,
)

pytestmark = pytest.mark.slow

# Far longer than the server takes to stop once its polls answer; far shorter than the polls.
STOPPED_WITHIN_SECONDS = 10
CLAIM_WAIT_SECONDS = 20  # the longest a claim may wait
READ_WAIT_SECONDS = 30


class Background:
    """A request made in a thread of its own."""

    def __init__(self, call: Callable[[], requests.Response]) -> None:
        self._answer: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], requests.Response]) -> None:
        try:
            self._answer["response"] = call()
        except Exception as exc:  # said by result(), below
            self._answer["error"] = exc

    def answered(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float = 60) -> requests.Response:
        self._thread.join(timeout=timeout)
        assert "response" in self._answer, self._answer.get("error", f"no answer in {timeout} s")
        response: requests.Response = self._answer["response"]
        return response


def start_waiting(long_poll: Callable[[], requests.Response],
                  probe: Callable[[], requests.Response], server: GunicornServer) -> Background:
    """Start `long_poll` and return once it waits in the server. The process has one waiting
    slot of its kind: `probe`, which asks to wait a moment, is answered at once, with
    Retry-After (docs/API.md), while the long poll holds it. A long poll that came while a
    probe held the slot was answered at once itself: it is made again."""
    for _attempt in range(20):
        poll = Background(long_poll)
        while not poll.answered():
            if "Retry-After" in probe().headers:
                return poll
        assert server.process is not None and server.process.poll() is None
    raise AssertionError("the long poll never got the waiting slot")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_answers_the_long_polls_and_frees_the_port(
        tmp_path: Path, sqlite_template: str, sig: int) -> None:
    database = tmp_path / "q.sqlite3"
    shutil.copyfile(sqlite_template, database)
    db_url = f"sqlite:///{database}"
    port = free_port()
    # One worker, and one waiting slot per kind (see start_waiting).
    env = server_environment(
        tmp_path, QUEUELOG_DATABASE_URL=db_url, QUEUELOG_JOB_TYPES="email,report",
        QUEUELOG_BIND=f"{HOST}:{port}", QUEUELOG_MAX_WAITING_CLAIMS="1",
        QUEUELOG_MAX_WAITING_REQUESTS="1", GUNICORN_WORKERS="1")
    producer = bearer(create_api_key(db_url, "shop", "producer"))
    worker = bearer(create_api_key(db_url, "renderer", "worker"))
    with GunicornServer(gunicorn_argv(), env, port=port, logs=tmp_path).start() as server:
        server.wait_until_answering()
        job = requests.post(server.url_of("/jobs"), json={"type": "email"}, headers=producer,
                            timeout=10).json()

        def claim(wait: float) -> requests.Response:
            return requests.post(server.url_of("/jobs/claim"), headers=worker, timeout=60,
                                 json={"types": ["report"], "wait_seconds": wait})

        def read(wait: float) -> requests.Response:
            return requests.get(server.url_of(f"/jobs/{job['id']}?wait_seconds={wait:g}"),
                                headers=producer, timeout=60)

        claimed = start_waiting(lambda: claim(CLAIM_WAIT_SECONDS), lambda: claim(0.01),
                                server)
        finished = start_waiting(lambda: read(READ_WAIT_SECONDS), lambda: read(0.01), server)

        server.send_signal(sig)
        assert claimed.result(STOPPED_WITHIN_SECONDS).status_code == 204
        answer = finished.result(STOPPED_WITHIN_SECONDS)
        assert answer.status_code == 200
        assert (answer.json()["id"], answer.json()["status"]) == (job["id"], "pending")
        assert "Retry-After" not in answer.headers  # it had waited: the stop answered it
        assert server.process is not None
        assert server.process.wait(timeout=STOPPED_WITHIN_SECONDS) == 0, server.log_tail()
        assert first_unbindable([f"{HOST}:{port}"]) is None
