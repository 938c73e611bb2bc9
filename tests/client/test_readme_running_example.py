"""README.md's long-job example (a worker showing progress, saving checkpoints and stopping
on a cancel), run exactly as written against a live server, on both engines."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import doc_examples
from tests.client.conftest import _child_env, wait_until
from tests.client.workflow_servers import WorkflowServer

pytestmark = pytest.mark.slow

FINISH_TIMEOUT_SECONDS = 60.0


@pytest.fixture
def server(tmp_path: Path, db_url: str) -> Iterator[WorkflowServer]:
    live = WorkflowServer(tmp_path, db_url, job_types="email,report")
    live.start()
    yield live
    live.stop()


def test_the_long_job_example_runs_as_written(server, tmp_path):
    (tmp_path / "worker.py").write_text(doc_examples.named(doc_examples.README, "render.py"))
    producer = server.client(server.create_key("shop", "producer"))

    # From a directory of its own: only the installed (here: importable) client is used.
    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "worker.py"], cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
            env=_child_env(QUEUELOG_URL=server.url,
                           QUEUELOG_TOKEN=server.create_key("renderer", "worker")),
            start_new_session=True)
    try:
        short = producer.enqueue("report", {"pages": 150}, timeout_seconds=3600)
        done = producer.wait(short["id"], timeout=FINISH_TIMEOUT_SECONDS)
        assert done["status"] == "completed", log_path.read_text()
        assert done["result"] == {"pages": 150}
        # The last progress a heartbeat carried: the complete itself carries none.
        assert done["progress"]["total"] == 150 and done["progress"]["done"] <= 150

        # Far too long to finish: the producer watches its progress, then cancels it.
        long = producer.enqueue("report", {"pages": 1_000_000}, expires_in_seconds=600)
        wait_until(lambda: (producer.get_job(long["id"])["progress"] or {}).get("done"),
                   timeout=FINISH_TIMEOUT_SECONDS, what="the long job's progress")
        assert producer.cancel(long["id"])["cancel_requested"] is True
        cancelled = producer.wait(long["id"], timeout=FINISH_TIMEOUT_SECONDS)
        assert cancelled["status"] == "cancelled", log_path.read_text()
        assert cancelled["progress"]["done"] < 1_000_000
        assert [a["outcome"] for a in producer.attempts(long["id"])] == ["cancelled"]

        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, log_path.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=15)
