"""A transaction held open on PostgreSQL beside the load (docs/OPERATIONS.md): a REPEATABLE READ
snapshot in the service's database, idle for HOLD_SECONDS, holds the xmin horizon back, so
the dead row versions every claim and complete leave behind cannot be removed. The claim rate
before, during and after is printed (the load here is too short to show what minutes cost:
bench/long_transaction.py holds one for minutes). The operator sees it:
queuelog_database_oldest_transaction_seconds on /metrics, and a /readyz warning (still 200)
past QUEUELOG_HORIZON_WARN_SECONDS; both clear once the transaction ends."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from tests.faults.conftest import Keys, StartServer
from tests.faults.inject import PrivatePostgres, database_of
from tests.faults.load import LoadRun
from tests.ops.scrape import Scrape
from tests.servers import bearer

pytestmark = pytest.mark.slow

HOLD_SECONDS = 15.0
WARNING_SECONDS = 5
STEADY_SECONDS = 3.0
GAUGE = "queuelog_database_oldest_transaction_seconds"


def _gauge(url: str, token: str) -> float | None:
    response = requests.get(f"{url}/metrics", headers=bearer(token), timeout=10)
    assert response.status_code == 200, response.text
    return Scrape(response.text).get(GAUGE)


def _warnings(url: str) -> list[str]:
    response = requests.get(f"{url}/readyz", timeout=10)
    assert response.status_code == 200, response.text
    return list(response.json().get("warnings", []))


def test_a_long_transaction_beside_the_load_is_seen_by_the_operator_and_loses_nothing(
        private_postgres: PrivatePostgres, private_database_url: str,
        start_server: StartServer, make_keys: Callable[[str], Keys], tmp_path: Path) -> None:
    url = private_database_url
    server = start_server(url, workers=2, threads=4, settings={
        "HORIZON_WARN_SECONDS": str(WARNING_SECONDS)})
    keys = make_keys(url)
    with LoadRun(server.url, producer_token=keys.producer, worker_token=keys.worker,
                 admin_token=keys.admin, directory=tmp_path) as load:
        load.start()
        load.wait_until_flowing()
        time.sleep(STEADY_SECONDS)
        gauge_before, warnings_before = _gauge(server.url, keys.admin), _warnings(server.url)
        with load.fault(f"snapshot held {HOLD_SECONDS:g} s"), \
                private_postgres.hold_xmin(database_of(url)):
            time.sleep(HOLD_SECONDS)
            gauge_during, warnings_during = _gauge(server.url, keys.admin), _warnings(server.url)
        time.sleep(STEADY_SECONDS)
        gauge_after, warnings_after = _gauge(server.url, keys.admin), _warnings(server.url)
        load.stop_producing()
        drained = load.drain()
        report = load.report()
        [fault] = report.faults
        claims = load.claim_times()
        claim_rates = [load.rate(claims, fault.started_at - STEADY_SECONDS, fault.started_at),
                       load.rate(claims, fault.started_at, fault.ended_at),
                       load.rate(claims, fault.ended_at, fault.ended_at + STEADY_SECONDS)]

    report.print("postgres long transaction")
    print(f"claims/s before {claim_rates[0]:.1f}, during {claim_rates[1]:.1f}, after "
          f"{claim_rates[2]:.1f}; {GAUGE} before {gauge_before:.1f}, during "
          f"{gauge_during:.1f}, after {gauge_after:.1f}")

    assert report.lost == 0, report.acknowledged_lost
    assert report.twice == 0, report.completed_twice_while_leased
    assert report.failures == {}, report.summary("failures")
    assert report.worker_failures == {}, report.summary("worker failures")
    assert drained and report.not_completed == {}, report.not_completed
    # What the operator sees: the gauge climbs past the threshold and /readyz warns, and
    # both clear once the transaction ends.
    assert gauge_before is not None and gauge_before < WARNING_SECONDS
    assert gauge_during is not None and gauge_during >= HOLD_SECONDS
    assert gauge_after is not None and gauge_after < WARNING_SECONDS
    assert warnings_before == [] and warnings_after == []
    assert len(warnings_during) == 1
    assert "QUEUELOG_HORIZON_WARN_SECONDS" in warnings_during[0]
