"""docs/CLIENT.md's Python examples, run exactly as written against a live server."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import pytest

from tests.client.conftest import ROOT, _child_env, wait_until

pytestmark = pytest.mark.slow

_EXAMPLE = re.compile(r"<!-- example: (\w+) -->\s*```python\n(.*?)```", re.DOTALL)


def readme_examples() -> dict[str, str]:
    return dict(_EXAMPLE.findall((ROOT / "docs" / "CLIENT.md").read_text()))


def test_the_client_doc_has_a_producer_and_a_worker_example_of_at_most_ten_lines():
    examples = readme_examples()
    assert set(examples) == {"producer", "worker"}
    for code in examples.values():
        assert len([line for line in code.splitlines() if line.strip()]) <= 10


def test_the_client_doc_examples_run_as_written(live_server, tmp_path):
    examples = readme_examples()
    for name, code in examples.items():
        (tmp_path / f"{name}.py").write_text(code)
    producer_token = live_server.create_key("shop", "producer")
    worker_token = live_server.create_key("mailer", "worker")

    # From a directory of their own: only the installed (here: importable) client is used.
    produced = subprocess.run(
        [sys.executable, "producer.py"], cwd=tmp_path, capture_output=True, text=True,
        timeout=60, env=_child_env(QUEUELOG_URL=live_server.url,
                                   QUEUELOG_TOKEN=producer_token))
    assert produced.returncode == 0, produced.stderr
    assert produced.stdout.splitlines() == ["1 pending", "[2, 3]"]

    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "worker.py"], cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
            env=_child_env(QUEUELOG_URL=live_server.url, QUEUELOG_TOKEN=worker_token),
            start_new_session=True)
    try:
        admin = live_server.client()
        wait_until(lambda: all(admin.get_job(job_id)["status"] == "completed"
                               for job_id in (1, 2, 3)), what="the worker example")
        assert admin.get_job(1)["result"] == {"sent": True}
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, log_path.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=15)
    assert "emailing ada@example.com" in log_path.read_text()
