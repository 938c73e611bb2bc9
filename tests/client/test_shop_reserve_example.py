"""docs/CLIENT.md's reserved-job example (a shop on its own SQLite database: `place_order` and its
check endpoint), run exactly as written: the order placed through a live server, the check
served by gunicorn and asked by a real `queuelog dispatch`."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from queuelog_client.signature import signature_header
from tests import doc_examples
from tests.client.conftest import JOB_TYPES, ROOT, LiveServer, _child_env, wait_until
from tests.servers import UNCONFIGURED, GunicornServer, free_port, gunicorn_argv

pytestmark = pytest.mark.slow

CLIENT_DOC = doc_examples.ROOT / "docs" / "CLIENT.md"


class Shop:
    """The example as shop.py in a directory of its own, its check served by gunicorn."""

    def __init__(self, directory: Path, server: LiveServer, port: int) -> None:
        self.directory = directory
        self.server = server
        self.check_url = f"http://127.0.0.1:{port}/queuelog/check"
        (directory / "shop.py").write_text(doc_examples.named(CLIENT_DOC, "shop.py"))
        self.token = server.create_key("shop", "producer")
        self.secret = self.operator("keys", "check-secret", "shop")
        self.env = _child_env(QUEUELOG_URL=server.url, QUEUELOG_TOKEN=self.token,
                              CHECK_SECRET=self.secret)
        self.checks = GunicornServer(
            gunicorn_argv(*UNCONFIGURED, "--bind", f"127.0.0.1:{port}", "--workers", "1",
                          app="shop:check"),
            # The check is served with its secret alone, as docs/CLIENT.md serves it: it must
            # boot without the producer's token.
            {name: value for name, value in self.env.items() if name != "QUEUELOG_TOKEN"},
            port=port, logs=directory, name="shop-check", cwd=directory)

    def operator(self, *args: str) -> str:
        """`queuelog …` against the server's database; its last line."""
        done = subprocess.run(
            [sys.executable, "-m", "app", *args], cwd=ROOT, capture_output=True, text=True,
            timeout=60, env=_child_env(QUEUELOG_DATABASE_URL=self.server.db_url,
                                       QUEUELOG_JOB_TYPES=JOB_TYPES))
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().splitlines()[-1]

    def place_order(self, key: str) -> subprocess.CompletedProcess[str]:
        # From the shop's own directory: only the installed (here: importable) client is used.
        return subprocess.run(
            [sys.executable, "-c", f"import shop; print(shop.place_order({key!r}))"],
            cwd=self.directory, capture_output=True, text=True, timeout=60, env=self.env)

    def ask(self, job_id: int, key: str, *, secret: str | None = None,
            signed: bool = True) -> requests.Response:
        """A check as the dispatcher signs it (the server's own signing code)."""
        query = f"job_id={job_id}&idempotency_key={key}"
        headers = {"Queuelog-Job-Id": str(job_id), "Queuelog-Attempt": "1"}
        if signed:
            headers["Queuelog-Signature"] = signature_header(
                secret or self.secret, int(time.time()), query.encode(), job_id=job_id,
                attempt=1)
        return requests.get(f"{self.check_url}?{query}", headers=headers, timeout=10)


@pytest.fixture
def shop(tmp_path: Path, sqlite_template: str) -> Iterator[Shop]:
    port = free_port()
    (tmp_path / "queuelog").mkdir()
    server = LiveServer(tmp_path / "queuelog", sqlite_template,
                        QUEUELOG_CHECK_URL_ORIGINS=f"http://127.0.0.1:{port}/queuelog/")
    server.start()
    shop_dir = tmp_path / "shop"
    shop_dir.mkdir()
    made = Shop(shop_dir, server, port)
    made.checks.start()
    try:
        made.checks.wait_for(lambda: _listening(made.check_url), "the check to listen")
        yield made
    finally:
        made.checks.kill()
        server.stop()


def _listening(url: str) -> bool:
    try:
        requests.get(url, timeout=2)
        return True
    except requests.ConnectionError:
        return False


def test_an_order_placed_as_written_commits_its_row_and_confirms_its_job(shop):
    placed = shop.place_order("order-1001")
    assert placed.returncode == 0, placed.stderr
    job_id = int(placed.stdout)
    job = shop.server.client().get_job(job_id)
    assert (job["status"], job["idempotency_key"]) == ("pending", "order-1001")

    # The same order again: its reservation was decided, so its block does not run twice.
    again = shop.place_order("order-1001")
    assert again.returncode != 0 and "Conflict" in again.stderr

    # The check answers from the shop's database, and only to queuelog's signature.
    assert shop.ask(job_id, "order-1001").json() == {"commit": True}
    assert shop.ask(job_id, "order-1002").json() == {"commit": False}
    assert shop.ask(job_id, "order-1001", signed=False).status_code == 401
    assert shop.ask(job_id, "order-1001", secret="not-the-secret").status_code == 401


def test_the_dispatcher_asks_the_examples_check_about_reservations_left_open(shop, tmp_path):
    # Two producers that crashed before their confirm: order-1003 after its commit (its row
    # is in the shop's database), order-1004 before it.
    committed = _crashed_reservation(shop, "order-1003", committed=True)
    rolled_back = _crashed_reservation(shop, "order-1004", committed=False)

    log_path = tmp_path / "dispatch.log"
    with open(log_path, "wb") as log:
        dispatcher = subprocess.Popen(
            [sys.executable, "-m", "app", "dispatch", "--concurrency", "2"], cwd=ROOT,
            env=_child_env(QUEUELOG_DATABASE_URL=shop.server.db_url,
                           QUEUELOG_JOB_TYPES=JOB_TYPES),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        admin = shop.server.client()
        wait_until(lambda: all(admin.get_job(job_id)["status"] != "reserved"
                               for job_id in (committed, rolled_back)),
                   what="the checks to decide", timeout=60)
        assert admin.get_job(committed)["status"] == "pending"
        assert admin.get_job(rolled_back)["status"] == "cancelled"
    finally:
        dispatcher.send_signal(signal.SIGTERM)
        assert dispatcher.wait(timeout=60) == 0, log_path.read_text()


def _crashed_reservation(shop: Shop, key: str, *, committed: bool) -> int:
    """What a producer running place_order(key) leaves when it dies before its confirm: a
    job reserved (here with a deadline of a second), and its row when it had committed."""
    made = requests.post(f"{shop.server.url}/jobs", timeout=10, json={
        "type": "email", "payload": {"order": key},
        "reserve": {"confirm_within_seconds": 1, "check_url": shop.check_url}},
        headers={"Authorization": f"Bearer {shop.token}", "Idempotency-Key": key})
    assert made.status_code == 201, made.text
    if committed:
        with contextlib.closing(sqlite3.connect(shop.directory / "shop.sqlite3")) as db, db:
            db.execute("INSERT INTO orders VALUES (?)", (key,))
    job_id: int = made.json()["id"]
    return job_id
