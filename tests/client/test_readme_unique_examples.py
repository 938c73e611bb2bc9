"""docs/JOBS.md's Python example of waiting for a result, run exactly as written against a
live server beside a worker (tests/test_doc_examples.py runs its unique-jobs example)."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from tests import doc_examples
from tests.client.conftest import _child_env, wait_until

pytestmark = pytest.mark.slow

def wait_example() -> str:
    """The Python block of JOBS.md's "Waiting for a result"."""
    jobs = doc_examples.ROOT / "docs" / "JOBS.md"
    section = jobs.read_text().split("## Waiting for a result\n", 1)[1].split("\n## ", 1)[0]
    [code] = [example.code for example in doc_examples.read(jobs).examples
              if example.language == "python" and example.code in section]
    return code


def run_example(code: str, tmp_path, server, token: str) -> subprocess.Popen[str]:
    script = tmp_path / "example.py"
    script.write_text(code)
    # From a directory of its own: only the installed (here: importable) client is used.
    return subprocess.Popen(
        [sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        env=_child_env(QUEUELOG_URL=server.url, QUEUELOG_TOKEN=token))


def test_the_wait_example_runs_as_written(live_server, tmp_path):
    worker = live_server.client(live_server.create_key("mailer", "worker"))
    example = run_example(wait_example(), tmp_path,
                          live_server, live_server.create_key("shop", "producer"))

    def work() -> None:
        job = wait_until(lambda: worker.claim(wait_seconds=5), what="the example's job")
        worker.complete(job["id"], job["lease_token"], result={"sent": True})

    working = threading.Thread(target=work)
    working.start()
    out, err = example.communicate(timeout=60)
    working.join(timeout=60)
    assert example.returncode == 0, err
    assert out.splitlines() == ["completed {'sent': True}"]
