"""README.md's order example (a producer and a worker), run exactly as written against a live
server, on both engines."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import doc_examples
from tests.client.conftest import _child_env
from tests.client.workflow_servers import WorkflowServer

pytestmark = pytest.mark.slow

def readme_examples() -> dict[str, str]:
    return {name: doc_examples.named(doc_examples.README, f"{name}.py")
            for name in ("producer", "worker")}


@pytest.fixture
def server(tmp_path: Path, db_url: str) -> Iterator[WorkflowServer]:
    live = WorkflowServer(tmp_path, db_url)
    live.start()
    yield live
    live.stop()


def test_the_order_example_runs_as_written(server, tmp_path):
    examples = readme_examples()
    for name, code in examples.items():
        (tmp_path / f"{name}.py").write_text(code)

    # From a directory of their own: only the installed (here: importable) client is used.
    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "worker.py"], cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
            env=_child_env(QUEUELOG_URL=server.url,
                           QUEUELOG_TOKEN=server.create_key("warehouse", "worker")),
            start_new_session=True)
    try:
        produced = subprocess.run(
            [sys.executable, "producer.py"], cwd=tmp_path, capture_output=True, text=True,
            timeout=120, env=_child_env(QUEUELOG_URL=server.url,
                                        QUEUELOG_TOKEN=server.create_key("shop", "producer")))
        assert produced.returncode == 0, produced.stderr + log_path.read_text()
        assert produced.stdout.splitlines() == [
            "['charge', 'done', 'mail', 'ship']",
            "{'mailed': True, 'tracking': 'T-1001'}",
        ], log_path.read_text()
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, log_path.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=15)

    workflow = server.client().get_workflow(1)
    assert workflow["status"] == "completed"
    assert [(job["ref"], job["status"]) for job in workflow["jobs"]] == [
        ("charge", "completed"), ("mail", "completed"), ("ship", "completed"),
        ("done", "completed")]
