"""Two servers on one PostgreSQL database, one killed with SIGKILL (its whole process group)
while the runner claiming through it holds leases (issue 36). The jobs it held are rescued
once their short leases run out and completed by the runner of the other server, each once;
when the dead server's runner comes back through the surviving server (a load balancer
failing over: here a TCP proxy re-pointed), its late reports of those jobs are refused (409:
fenced), so none completes twice."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from tests.faults.conftest import Keys, StartServer
from tests.faults.load import LoadRun
from tests.servers import HOST, bearer
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.slow

LEASE_SECONDS = 5
# Long enough that the runner holds several jobs at any moment, each reported after the kill.
HANDLER_SECONDS = 0.4
STEADY_SECONDS = 2.0


def _running_of(url: str, admin: str, worker_name: str) -> set[int]:
    response = requests.get(f"{url}/jobs", params={"status": "running", "limit": 500},
                            headers=bearer(admin), timeout=10)
    assert response.status_code == 200, response.text
    return {job["id"] for job in response.json()["jobs"] if job["worker_id"] == worker_name}


def _wait(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_a_server_killed_holding_leases_has_its_jobs_rescued_once_by_the_other(
        private_database_url: str, start_server: StartServer,
        make_keys: Callable[[str], Keys], tmp_path: Path) -> None:
    url = private_database_url
    doomed, survivor = start_server.many(2, url, workers=2, threads=4)
    keys = make_keys(url)
    tokens = [keys.worker_token(url, "runner-doomed"), keys.worker_token(url, "runner-survivor")]
    # The doomed server's runner reaches it through a proxy, as through a load balancer.
    balancer = TcpProxy(doomed.port, HOST)
    balancer.start()
    try:
        with LoadRun(survivor.url, producer_token=keys.producer, worker_token=tokens[1],
                     admin_token=keys.admin, directory=tmp_path, rate_per_producer=10,
                     worker_urls=[f"http://{HOST}:{balancer.port}", survivor.url],
                     worker_tokens=tokens, lease_seconds=LEASE_SECONDS,
                     handler_seconds=HANDLER_SECONDS) as load:
            load.start()
            load.wait_until_flowing()
            time.sleep(STEADY_SECONDS)
            _wait(lambda: bool(_running_of(survivor.url, keys.admin, "runner-doomed")),
                  "the doomed server's runner to hold leases")
            with load.fault("one of two servers killed"):
                doomed.kill()
                held = _running_of(survivor.url, keys.admin, "runner-doomed")
                # Rescued by the survivor's claims once their leases (not renewed: the
                # heartbeats go to the dead server) run out.
                _wait(lambda: not _running_of(survivor.url, keys.admin, "runner-doomed"),
                      "the dead server's leases to be rescued", timeout=LEASE_SECONDS * 6)
            # Failed over: the dead server's runner comes back through the survivor.
            balancer.stop()
            balancer.target = (HOST, survivor.port)
            balancer.start()
            _wait(lambda: len(load.reports()[1]) > 0, "the stale reports to come back",
                  timeout=LEASE_SECONDS * 3)
            time.sleep(STEADY_SECONDS)
            load.stop_producing()
            drained = load.drain()
            runners_alive = all(runner.alive() for runner in load.runners)
            report = load.report()
            stored = load.stored_jobs()
    finally:
        balancer.stop()

    rescued = {job_id for job_id in held if stored[job_id]["error"] == "lease expired"}
    report.print("two servers, one killed -9 holding leases")
    print(f"held by the killed server's runner: {len(held)}, rescued after lease expiry: "
          f"{len(rescued)}, its late reports refused (409): {len(report.reports_refused)}")

    assert held
    assert report.lost == 0, report.acknowledged_lost
    assert report.twice == 0, report.completed_twice_while_leased
    assert report.failures == {}, report.summary("failures")
    # The survivor's runner saw no error; the dead server's saw only no answer at all.
    assert report.worker_failures_of("r1") == {}
    assert set(report.worker_failures_of("r0")) <= {"connection"}
    assert drained and report.not_completed == {}, report.not_completed
    for job_id in held:
        job = stored[job_id]
        assert job["status"] == "completed", job
        # Completed by the survivor's runner (or by the dead server's runner, should the
        # survivor's claims not have rescued it before that runner's report came back).
        assert job["worker_id"] in {"runner-survivor", "runner-doomed"}, job
    # Fenced: the late reports refused were of jobs another attempt had taken over.
    assert {job_id for job_id, runner in report.reports_refused if runner == "r0"} <= held
    assert {job_id for job_id, _runner in report.reports_refused} <= rescued
    assert runners_alive
