"""PostgreSQL restarted under load (issue 36): `pg_ctl restart -m fast`, then a fast shutdown
held down for seconds and a start, while producers enqueue, a `queuelog worker` runner claims
and completes, a `queuelog dispatch` process pushes jobs of one type to a receiver, and the
servers' tickers fire a schedule every second.

While PostgreSQL is down the service answers 503 problems with Retry-After (never a 500 or a
hang) and /readyz says 503; once it is back everything recovers by itself: no gunicorn
worker, dispatcher or runner is restarted, nothing acknowledged is lost, nothing completes
twice, and every schedule slot is enqueued at most once.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from sqlalchemy import create_engine, select

from app.storage.schema import jobs
from tests.dispatch.receiver import Receiver, Reply
from tests.e2e.test_push import DispatchProcess
from tests.faults.conftest import Keys, StartServer
from tests.faults.inject import PrivatePostgres
from tests.faults.load import LoadRun
from tests.servers import bearer

pytestmark = pytest.mark.slow

SETTINGS = {"SCHEDULE_SECONDS": "1", "RETRY_BACKOFF_SECONDS": "0.2",
            "RETRY_BACKOFF_MAX_SECONDS": "0.5"}
STEADY_SECONDS = 2.0
DOWN_SECONDS = 5.0
PUSHED_JOBS = 10
SECOND = 1_000_000


def _readyz(url: str) -> requests.Response:
    return requests.get(f"{url}/readyz", timeout=10)


def _call(method: str, url: str, token: str, **kwargs: object) -> requests.Response:
    return requests.request(method, url, headers=bearer(token), timeout=10, **kwargs)


def _slots(database_url: str) -> list[int]:
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            return [row[0] for row in conn.execute(
                select(jobs.c.scheduled_for).where(jobs.c.schedule == "every-second"))]
    finally:
        engine.dispose()


def _wait(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_postgres_restarted_and_shut_down_mid_load_loses_nothing_and_recovers_by_itself(
        private_postgres: PrivatePostgres, private_database_url: str,
        start_server: StartServer, make_keys: Callable[[str], Keys], tmp_path: Path) -> None:
    url = private_database_url
    server = start_server(url, workers=2, threads=4, settings=SETTINGS)
    gunicorn_workers = sorted(server.worker_pids())
    keys = make_keys(url)
    schedule = _call("POST", f"{server.url}/schedules", keys.admin, json={
        "name": "every-second", "cron": "* * * * * *", "job": {"type": "sync"}})
    assert schedule.status_code == 201, schedule.text

    with Receiver(answer=lambda _received: Reply(200, b'{"ok": true}')) as receiver, \
            LoadRun(server.url, producer_token=keys.producer, worker_token=keys.worker,
                    admin_token=keys.admin, directory=tmp_path) as load:
        push = _call("PATCH", f"{server.url}/types/pdf", keys.admin,
                     json={"push": {"url": receiver.url, "timeout_seconds": 5}})
        assert push.status_code == 200, push.text
        dispatcher = DispatchProcess(url, tmp_path, concurrency=4).start()
        try:
            pushed = [_call("POST", f"{server.url}/jobs", keys.producer,
                            json={"type": "pdf", "payload": {"n": n}}).json()["id"]
                      for n in range(PUSHED_JOBS)]
            load.start()
            load.wait_until_flowing()
            time.sleep(STEADY_SECONDS)

            with load.fault("restart -m fast"):
                private_postgres.restart("fast")
            time.sleep(STEADY_SECONDS)

            with load.fault(f"fast shutdown, {DOWN_SECONDS:g} s down"):
                private_postgres.stop("fast")
                down = _readyz(server.url)
                time.sleep(DOWN_SECONDS)
                private_postgres.start()
            _wait(lambda: _readyz(server.url).status_code == 200, "/readyz to answer 200")
            fault_ended_us = int(time.time() * SECOND)
            # Pushed after the faults: the dispatcher that lived through them delivers them.
            pushed += [_call("POST", f"{server.url}/jobs", keys.producer,
                             json={"type": "pdf", "payload": {"n": n}}).json()["id"]
                       for n in range(PUSHED_JOBS, 2 * PUSHED_JOBS)]
            time.sleep(STEADY_SECONDS)
            load.stop_producing()
            drained = load.drain()
            runners_alive = all(runner.alive() for runner in load.runners)

            def all_pushed_completed() -> bool:
                answer = _call("GET", f"{server.url}/jobs", keys.admin,
                               params={"type": "pdf", "status": "completed", "limit": 500})
                return answer.status_code == 200 and len(answer.json()["jobs"]) == len(pushed)

            _wait(all_pushed_completed, "every pushed job completed")
            dispatcher_alive = dispatcher.process is not None and dispatcher.process.poll() is None
        finally:
            dispatcher.kill()
        report = load.report()

    report.print("postgres restart + fast shutdown")
    slots = _slots(url)
    after = [slot for slot in slots if slot > fault_ended_us]
    print(f"schedule: {len(slots)} slots enqueued, {len(after)} after the faults; "
          f"pushed {len(pushed)}, deliveries {len(receiver.received)}")

    assert down.status_code == 503
    assert down.headers["Content-Type"].startswith("application/problem+json")
    assert down.headers.get("Retry-After")
    assert report.lost == 0, report.acknowledged_lost
    assert report.twice == 0, report.completed_twice_while_leased
    assert report.failures == {}, report.summary("failures")
    assert report.worker_failures == {}, report.summary("worker failures")
    assert report.reported_complete_not_completed == []
    assert drained and report.not_completed == {}, report.not_completed
    # Recovered by itself: the same gunicorn workers, runner and dispatcher throughout.
    assert runners_alive
    assert dispatcher_alive
    # The dispatcher says an outage once, and its end, not a traceback per idle wait.
    said = dispatcher.log.read_text(errors="replace")
    assert "Traceback" not in said, said[-2000:]
    assert 1 <= said.count("dispatch: the database did not answer") <= 4, said[-2000:]
    assert "dispatch: the database answers again" in said
    assert sorted(server.worker_pids()) == gunicorn_workers
    assert {r.job_id for r in receiver.received} == set(pushed)
    # The ticker kept firing after the faults, and no slot was enqueued twice.
    assert len(after) >= 1
    assert [slot for slot, count in Counter(slots).items() if count > 1] == []
    assert "Traceback" not in server.stderr()
