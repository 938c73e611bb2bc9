"""Every backend of the service's database terminated (pg_terminate_backend), several times,
under load (issue 36): the pools replace the dead connections without a burst of failures
(each error a client sees is a 503 problem with Retry-After; their count is printed), and a
claim whose commit was cut is applied or not, never half: the worker never holds a job the
database does not know it holds, a claim applied whose answer was lost is rescued when its
short lease runs out, and every job the runner was told it completed is completed."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.faults.conftest import Keys, StartServer
from tests.faults.inject import PrivatePostgres, database_of
from tests.faults.load import LoadRun

pytestmark = pytest.mark.slow

KILLS = 3
BETWEEN_KILLS_SECONDS = 1.5
STEADY_SECONDS = 2.0
# Short: a claim applied whose answer never reached the runner is rescued within the test.
LEASE_SECONDS = 5


def test_every_backend_killed_mid_load_is_survived_without_a_burst_of_failures(
        private_postgres: PrivatePostgres, private_database_url: str,
        start_server: StartServer, make_keys: Callable[[str], Keys], tmp_path: Path) -> None:
    url = private_database_url
    server = start_server(url, workers=2, threads=4)
    gunicorn_workers = sorted(server.worker_pids())
    keys = make_keys(url)
    killed = []
    with LoadRun(server.url, producer_token=keys.producer, worker_token=keys.worker,
                 admin_token=keys.admin, directory=tmp_path,
                 lease_seconds=LEASE_SECONDS) as load:
        load.start()
        load.wait_until_flowing()
        time.sleep(STEADY_SECONDS)
        for n in range(KILLS):
            with load.fault(f"kill {n + 1}"):
                killed.append(private_postgres.kill_backends(database_of(url)))
            time.sleep(BETWEEN_KILLS_SECONDS)
        time.sleep(STEADY_SECONDS)
        load.stop_producing()
        # Within a lease or two: a claim cut after its commit waits for its lease to run out.
        drained = load.drain(timeout=LEASE_SECONDS * 6)
        runners_alive = all(runner.alive() for runner in load.runners)
        report = load.report()
        stored = load.stored_jobs()

    rescued = sorted(job_id for job_id, job in stored.items()
                     if job["retry_count"] and job["error"] == "lease expired")
    report.print(f"postgres backends killed {KILLS}x ({killed} backends)")
    print(f"claims applied whose answer was cut, rescued at lease expiry: {len(rescued)}; "
          f"errors clients saw: {sum(report.client_errors.values())}")

    assert all(count > 0 for count in killed), killed
    assert report.lost == 0, report.acknowledged_lost
    assert report.twice == 0, report.completed_twice_while_leased
    assert report.failures == {}, report.summary("failures")
    assert report.worker_failures == {}, report.summary("worker failures")
    # Never half a claim: no job the runner was told it completed is other than completed,
    # and every acknowledged job ends completed (a lost claim answer is rescued, not stuck).
    assert report.reported_complete_not_completed == []
    assert drained and report.not_completed == {}, report.not_completed
    assert runners_alive
    assert sorted(server.worker_pids()) == gunicorn_workers
    assert "Traceback" not in server.stderr()
