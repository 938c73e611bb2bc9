"""docs/PUSH.md's Flask receiver, run as written: served by gunicorn,
fed by a real `queuelog dispatch`, checking signatures with queuelog_client."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from queuelog_client.signature import signature_header
from tests import doc_examples
from tests.client.conftest import ROOT, LiveServer, _child_env, wait_until
from tests.servers import UNCONFIGURED, GunicornServer, free_port, gunicorn_argv

pytestmark = pytest.mark.slow

def receiver_example() -> str:
    """docs/PUSH.md's one Python block: the receiver."""
    [code] = [example.code for example in doc_examples.read(ROOT / "docs" / "PUSH.md").examples
              if example.language == "python"]
    return code


def test_the_readme_receiver_takes_signed_deliveries_and_refuses_others(
        live_server: LiveServer, tmp_path: Path) -> None:
    (tmp_path / "receiver.py").write_text(receiver_example())
    admin = live_server.client()
    producer = live_server.client(live_server.create_key("shop", "producer"))
    port = free_port()
    url = f"http://127.0.0.1:{port}/jobs/email"
    patched = requests.patch(
        f"{live_server.url}/types/email", json={"push": {"url": url}}, timeout=10,
        headers={"Authorization": f"Bearer {live_server.admin_token}"})
    secret = patched.json()["push"]["secret"]

    receiver = GunicornServer(
        gunicorn_argv(*UNCONFIGURED, "--bind", f"127.0.0.1:{port}", "--workers", "1",
                      app="receiver:app"),
        _child_env(QUEUELOG_PUSH_SECRET=secret), port=port, logs=tmp_path, name="receiver",
        cwd=tmp_path)
    receiver.start()
    dispatch_log = tmp_path / "dispatch.log"
    with open(dispatch_log, "wb") as log:
        dispatcher = subprocess.Popen(
            [sys.executable, "-m", "app", "dispatch", "--concurrency", "2"], cwd=ROOT,
            env=_child_env(QUEUELOG_DATABASE_URL=live_server.db_url,
                           QUEUELOG_JOB_TYPES="email,pdf,sync"),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        receiver.wait_for(lambda: _answers(url), "the receiver to listen")
        job = producer.enqueue("email", {"to": "ada@example.com"})
        done = wait_until(lambda: (j := admin.get_job(job["id"]))["status"] == "completed"
                          and j, what="the delivery", timeout=60)
        assert done["result"] == {"sent": True}
        assert "sending to ada@example.com" in receiver.stdout()

        body = b'{"id": 1}'
        assert requests.post(url, data=body, timeout=10).status_code == 400
        forged = signature_header("not-the-secret", int(time.time()), body)
        assert requests.post(url, data=body, timeout=10,
                             headers={"Queuelog-Signature": forged}).status_code == 401
    finally:
        dispatcher.send_signal(signal.SIGTERM)
        assert dispatcher.wait(timeout=60) == 0, dispatch_log.read_text()
        receiver.stop()


def _answers(url: str) -> bool:
    try:
        requests.post(url, data=b"", timeout=2)
        return True
    except requests.ConnectionError:
        return False
