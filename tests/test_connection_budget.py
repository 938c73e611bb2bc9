"""A PostgreSQL host holds a known number of connections (docs/SCALING.md, "Connections"):
GUNICORN_WORKERS times QUEUELOG_DB_POOL_SIZE for its requests, however many arrive at once, and
one listening session, whatever its worker count."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests
from sqlalchemy import make_url

from tests.faults.conftest import ServerStarter
from tests.servers import bearer, create_api_key

pytestmark = pytest.mark.slow

WORKERS = 2
POOL = 2
CLIENTS = 16


def _connections(url: str) -> Any:
    return psycopg.connect(make_url(url).set(drivername="postgresql").render_as_string(
        hide_password=False), autocommit=True)


def test_a_loaded_host_holds_no_more_than_its_pools_and_one_listener(postgres_server: Any,
                                                                     tmp_path: Path) -> None:
    url = postgres_server.create_database()
    producer = bearer(create_api_key(url, "producer-1", "producer"))
    worker = bearer(create_api_key(url, "worker-1", "worker"))
    starter = ServerStarter(tmp_path)
    server = starter(url, workers=WORKERS, threads=8,
                     settings={"DB_POOL_SIZE": str(POOL), "COUNTING_READS": "1"})
    seen: list[tuple[int, int]] = []
    done = threading.Event()

    def sample() -> None:
        with _connections(url) as conn:
            while not done.is_set():
                seen.append(conn.execute(
                    "SELECT count(*), count(*) FILTER"
                    " (WHERE application_name = 'queuelog listener')"
                    " FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchone())
                time.sleep(0.02)

    def client(number: int) -> list[int]:
        statuses = []
        with requests.Session() as session:
            for _ in range(15):
                made = session.post(server.url_of("/jobs"), json={"type": "email"},
                                    headers=producer, timeout=60)
                claimed = session.post(server.url_of("/jobs/claim"), json={"types": ["email"]},
                                       headers=worker, timeout=60)
                statuses += [made.status_code, claimed.status_code]
                if claimed.status_code == 200:
                    job = claimed.json()
                    statuses.append(session.post(
                        server.url_of(f"/jobs/{job['id']}/complete"),
                        json={"result": {"by": number}, "lease_token": job["lease_token"]},
                        headers=worker, timeout=60).status_code)
        return statuses

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with ThreadPoolExecutor(CLIENTS) as pool:
            statuses = [status for answer in pool.map(client, range(CLIENTS))
                        for status in answer]
    finally:
        done.set()
        sampler.join()
        starter.stop_all()
    assert set(statuses) <= {200, 201, 204}, sorted(set(statuses))
    assert statuses.count(201) == CLIENTS * 15
    # Every client's requests were under way at once, more than the pools hold: still no
    # more connections than the budget, and the one listening session among them.
    assert max(total for total, _listening in seen) <= WORKERS * POOL + 1, seen
    assert max(listening for _total, listening in seen) == 1
