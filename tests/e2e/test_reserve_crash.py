"""A producer that dies between its own commit and its confirm (contract section 18), end to
end: real gunicorn, a real `queuelog dispatch` asking the producer's check url, a producer
process with its own SQLite database killed with SIGKILL inside `with client.reserve(...)`,
and the shop's check endpoint in a process of its own, on each engine.

Its commit stood: the check answers commit: true and the job is confirmed (pending, then
claimed). It rolled back: the check answers commit: false and the job is released."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from queuelog_client import Client
from tests.client.conftest import wait_until
from tests.e2e.conftest import StartServer
from tests.e2e.test_push import JOB_TYPES, DispatchProcess
from tests.servers import (
    REPO_ROOT,
    LiveServer,
    bearer,
    create_api_key,
    free_port,
    server_environment,
)

pytestmark = pytest.mark.slow

# Long enough for a loaded machine's dispatcher to have asked the check several times over.
DECIDED_TIMEOUT_SECONDS = 60.0


class ShopProcess:
    """`python -m tests.e2e.reserve_shop …` in a session of its own, its output in a file."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.e2e.reserve_shop", *args], cwd=REPO_ROOT,
                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def printed(self, prefix: str) -> str | None:
        """The first line it printed that starts with `prefix`; fails when it exited."""
        for line in self.output().splitlines():
            if line.startswith(prefix):
                return line
        assert self.process.poll() is None, f"the shop exited:\n{self.output()}"
        return None

    def kill(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=15)


@dataclass
class Shop:
    server: LiveServer
    database_url: str
    tmp_path: Path
    env: dict[str, str]
    check_log: Path
    admin: str

    def order(self, key: str, outcome: str) -> tuple[ShopProcess, int]:
        """A producer process that reserves, writes order `key`, commits or rolls back, and
        waits to be killed inside the block; and its job's id."""
        producer = ShopProcess(["order", str(self.tmp_path / "shop.sqlite3"), key, outcome],
                               self.env, self.tmp_path / f"order-{key}.log")
        line = wait_until(lambda: producer.printed(outcome), timeout=30,
                          what=f"the producer to {outcome}")
        assert line is not None
        return producer, int(line.split()[1])

    def job(self, job_id: int) -> dict[str, Any]:
        return Client(self.server.url, self.admin).get_job(job_id)

    def events(self, job_id: int) -> list[tuple[str, str, Any]]:
        shown = requests.get(f"{self.server.url}/jobs/{job_id}/events",
                             headers=bearer(self.admin), timeout=10).json()["events"]
        return [(e["event"], e["actor"], e["detail"]) for e in shown]

    def decided(self, job_id: int) -> dict[str, Any] | None:
        job = self.job(job_id)
        return None if job["status"] == "reserved" else job


def _cli(env: dict[str, str], *args: str) -> str:
    """`queuelog …` as the operator runs it; its last line (a token or a secret, never
    printed here)."""
    done = subprocess.run([sys.executable, "-m", "app", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture
def shop(start_server: StartServer, server_database_url: str,
         tmp_path: Path) -> Iterator[Shop]:
    check_port = free_port()
    check_url = f"http://127.0.0.1:{check_port}/queuelog/check"
    settings = {"CHECK_URL_ORIGINS": f"http://127.0.0.1:{check_port}/queuelog/"}
    server = start_server(server_database_url, workers=2, threads=8, settings=settings)
    operator = server_environment(tmp_path, QUEUELOG_DATABASE_URL=server_database_url,
                                  QUEUELOG_JOB_TYPES=JOB_TYPES,
                                  QUEUELOG_CHECK_URL_ORIGINS=settings["CHECK_URL_ORIGINS"])
    # The key's check secret made as docs/CLIENT.md tells the operator to. The check url is
    # the reserve's own (a key's, `--check-url`, is the default).
    token = create_api_key(server_database_url, "shop", "producer")
    secret = _cli(operator, "keys", "check-secret", "shop")
    client_env = {**server_environment(tmp_path),
                  "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "client")])}

    check = ShopProcess(["check", str(tmp_path / "shop.sqlite3"), str(check_port)],
                        {**client_env, "QUEUELOG_CHECK_SECRET": secret},
                        tmp_path / "check.log")
    dispatcher = DispatchProcess(server_database_url, tmp_path, concurrency=2,
                                 **settings).start()
    try:
        wait_until(lambda: check.printed("listening"), timeout=30, what="the check endpoint")
        yield Shop(server, server_database_url, tmp_path,
                   {**client_env, "QUEUELOG_URL": server.url, "QUEUELOG_TOKEN": token,
                    "SHOP_CHECK_URL": check_url},
                   check.log, create_api_key(server_database_url, "ops", "admin"))
    finally:
        dispatcher.kill()
        check.kill()


def test_a_producer_killed_after_its_commit_has_its_job_confirmed_by_the_check(shop):
    producer, job_id = shop.order("order-1001", "commit")
    assert shop.job(job_id)["status"] == "reserved"
    producer.kill()  # after the commit, before the confirm leaving the block would send

    job = wait_until(lambda: shop.decided(job_id), timeout=DECIDED_TIMEOUT_SECONDS,
                     what="the check to decide")
    assert job["status"] == "pending", shop.check_log.read_text()
    event, actor, detail = shop.events(job_id)[-1]
    assert (event, actor, detail["by"]) == ("confirmed", "queuelog", "check")
    assert f"job {job_id} check 1: commit True" in shop.check_log.read_text()
    assert "refused" not in shop.check_log.read_text()

    worker = Client(shop.server.url, create_api_key(shop.database_url, "mailer", "worker"))
    claimed = worker.claim(types=["email"])
    assert claimed is not None and claimed["id"] == job_id
    assert claimed["payload"] == {"order": "order-1001"}


def test_a_producer_killed_after_its_rollback_has_its_job_released_by_the_check(shop):
    producer, job_id = shop.order("order-1002", "rollback")
    producer.kill()  # after the rollback, before the release leaving the block would send

    job = wait_until(lambda: shop.decided(job_id), timeout=DECIDED_TIMEOUT_SECONDS,
                     what="the check to decide")
    assert job["status"] == "cancelled", shop.check_log.read_text()
    event, actor, detail = shop.events(job_id)[-1]
    assert (event, actor, detail["by"]) == ("released", "queuelog", "check")
    assert f"job {job_id} check 1: commit False" in shop.check_log.read_text()

    worker = Client(shop.server.url, create_api_key(shop.database_url, "mailer", "worker"))
    assert worker.claim(types=["email"]) is None
