"""Requests through PgBouncer in transaction mode (docs/SCALING.md, "Connections"): the served
processes' pools connect to the pooler, with prepared statements off
(QUEUELOG_DB_PREPARED_STATEMENTS=0) and the pooler told to ignore the sessions' `options`; the
host's listening session connects to PostgreSQL itself (QUEUELOG_LISTEN_DATABASE_URL). Many
clients enqueue, claim and complete through fewer server sessions than the processes hold
connections, every statement run far more often than psycopg's threshold for preparing it:
every job is done once, no request fails, and a claim waiting on the host wakes for a job
enqueued through the pooler."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import make_url

from tests.e2e.client import QueueClient, server_errors
from tests.servers import LiveServer, create_api_key, free_port

pytestmark = pytest.mark.slow

CLIENTS = 6
JOBS_PER_CLIENT = 40
SERVER_SESSIONS = 3  # the pooler's sessions to PostgreSQL, for 2 processes of 4 connections


def _pgbouncer() -> str:
    found = shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer"
                                          if os.path.exists("/usr/sbin/pgbouncer") else None)
    if found is None:
        # Skipped on a workstation without it; in CI (CI=true, where .ci/run installs it) a
        # missing pgbouncer is a broken CI, not a reason to prove less.
        if os.environ.get("CI") == "true":
            pytest.fail("pgbouncer is not installed (.ci/run installs it)")
        pytest.skip("pgbouncer is not installed")
    return found


class PgBouncer:
    """A PgBouncer in transaction mode on a free loopback port, in front of `server_url`'s
    PostgreSQL, in a directory of its own (it refuses to run as root: it then runs as the
    postgres user, who must read its files)."""

    def __init__(self, server_url: str) -> None:
        self.target = make_url(server_url)
        self.port = free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="queuelog-pgbouncer-"))
        self.directory.chmod(0o755)
        self.process: subprocess.Popen[bytes] | None = None

    def url_of(self, database_url: str) -> str:
        """`database_url` (on the same server) reached through the pooler."""
        return make_url(database_url).set(host="127.0.0.1", port=self.port).render_as_string(
            hide_password=False)

    def start(self) -> PgBouncer:
        config, users = self.directory / "pgbouncer.ini", self.directory / "userlist.txt"
        users.write_text(f'"{self.target.username}" ""\n')
        config.write_text(
            "[databases]\n"
            f"* = host={self.target.host} port={self.target.port or 5432}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {users}\n"
            f"admin_users = {self.target.username}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {SERVER_SESSIONS}\nmax_client_conn = 200\n"
            "ignore_startup_parameters = extra_float_digits,options\n")
        for path in (config, users):
            path.chmod(0o644)
        argv = [_pgbouncer(), str(config)]
        if os.geteuid() == 0:
            argv[1:1] = ["-u", "postgres"]
        log = (self.directory / "pgbouncer.log").open("wb")
        self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                self.admin("SHOW VERSION")
                return self
            except psycopg.OperationalError:
                if self.process.poll() is not None:
                    break
                time.sleep(0.1)
        raise RuntimeError(f"pgbouncer did not start:\n{self.log()}")

    def admin(self, command: str) -> list[dict[str, Any]]:
        """A command of the pooler's admin console, its rows as dicts."""
        with psycopg.connect(host="127.0.0.1", port=self.port, dbname="pgbouncer",
                             user=self.target.username, autocommit=True,
                             prepare_threshold=None) as conn:
            cursor = conn.execute(command)  # the console speaks the simple protocol
            names = [column.name for column in cursor.description or []]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def log(self) -> str:
        path = self.directory / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture
def pgbouncer(postgres_server: Any) -> Iterator[PgBouncer]:
    bouncer = PgBouncer(postgres_server.url.render_as_string(hide_password=False)).start()
    try:
        yield bouncer
    finally:
        bouncer.stop()


def test_requests_go_through_pgbouncer_in_transaction_mode(
        postgres_server: Any, pgbouncer: PgBouncer, start_server: Any) -> None:
    direct = postgres_server.create_database()
    database = make_url(direct).database
    server: LiveServer = start_server(pgbouncer.url_of(direct), workers=2, threads=8, settings={
        "DB_POOL_SIZE": "4",
        "COUNTING_READS": "1",
        "DB_PREPARED_STATEMENTS": "0",
        "LISTEN_DATABASE_URL": direct,
    })
    producer_token = create_api_key(direct, "producer-1", "producer")
    producer = QueueClient(server, producer_token)
    workers = [QueueClient(server, create_api_key(direct, f"worker-{n}", "worker"))
               for n in range(CLIENTS)]
    producers = [QueueClient(server, producer_token) for _ in workers]

    # A claim waiting on the host, woken by the listening session when a job is committed.
    waited: list[Any] = []
    waiting = threading.Thread(target=lambda: waited.append(
        workers[0].claim(types=["pdf"], wait_seconds=20)))
    waiting.start()
    time.sleep(1.0)
    woken_for = producer.enqueue({"type": "pdf"}).json()["id"]
    waiting.join(30)
    assert waited and waited[0].status_code == 200, waited
    assert waited[0].json()["id"] == woken_for
    assert workers[0].complete(woken_for, lease_token=waited[0].json()["lease_token"]
                               ).status_code == 200

    done: list[int] = []
    failures: list[str] = []

    def work(client: QueueClient, producer: QueueClient) -> None:
        for n in range(JOBS_PER_CLIENT):
            made = producer.enqueue({"type": "email", "payload": {"n": n}})
            # Another client may have taken this one: it waits for the next.
            claimed = client.claim(types=["email"], wait_seconds=10)
            if made.status_code != 201 or claimed.status_code != 200:
                failures.append(f"{made.status_code} {claimed.status_code} {claimed.text}")
                return
            job = claimed.json()
            completed = client.complete(job["id"], lease_token=job["lease_token"])
            if completed.status_code != 200:
                failures.append(f"complete {completed.status_code} {completed.text}")
                return
            done.append(job["id"])

    threads = [threading.Thread(target=work, args=pair)
               for pair in zip(workers, producers, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)

    assert failures == []
    assert len(done) == len(set(done)) == CLIENTS * JOBS_PER_CLIENT
    with psycopg.connect(make_url(direct).set(drivername="postgresql").render_as_string(
            hide_password=False)) as conn:
        statuses = dict(conn.execute(
            "SELECT status, count(*) FROM jobs GROUP BY status").fetchall())
    assert statuses == {"completed": CLIENTS * JOBS_PER_CLIENT + 1}
    assert server_errors([producer, *producers, *workers]) == {}
    log = server.log_tail()
    assert "Traceback" not in log and "prepared statement" not in log, log

    # The requests went through the pooler, over no more server sessions than it keeps.
    pools = [row for row in pgbouncer.admin("SHOW POOLS") if row["database"] == database]
    stats = [row for row in pgbouncer.admin("SHOW STATS") if row["database"] == database]
    assert pools and stats, pgbouncer.log()
    assert stats[0]["total_xact_count"] > 3 * CLIENTS * JOBS_PER_CLIENT
    assert pools[0]["sv_active"] + pools[0]["sv_idle"] + pools[0]["sv_used"] <= SERVER_SESSIONS
