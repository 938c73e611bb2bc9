"""docs/JOBS.md's Python examples for unique jobs and waiting for a result, run exactly as
written against a live server."""

from __future__ import annotations

import re
import subprocess
import sys
import threading

import pytest

from tests.client.conftest import ROOT, _child_env, wait_until

pytestmark = pytest.mark.slow

_EXAMPLE = re.compile(r"<!-- example: (\w+) -->\s*```python\n(.*?)```", re.DOTALL)


def readme_example(section: str, name: str) -> str:
    text = (ROOT / "docs" / "JOBS.md").read_text().split(f"## {section}\n", 1)[1]
    return dict(_EXAMPLE.findall(text.split("\n## ", 1)[0]))[name]


def run_example(code: str, tmp_path, server, token: str) -> subprocess.Popen[str]:
    script = tmp_path / "example.py"
    script.write_text(code)
    # From a directory of its own: only the installed (here: importable) client is used.
    return subprocess.Popen(
        [sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        env=_child_env(QUEUELOG_URL=server.url, QUEUELOG_TOKEN=token))


def test_the_unique_example_runs_as_written(live_server, tmp_path):
    example = run_example(readme_example("Unique jobs", "unique"), tmp_path, live_server,
                          live_server.create_key("shop", "producer"))
    out, err = example.communicate(timeout=60)
    assert example.returncode == 0, err
    assert out.splitlines() == ["True replaced {'profile': 7, 'edit': 2}"]
    assert len(live_server.client().list_jobs()["jobs"]) == 1


def test_the_wait_example_runs_as_written(live_server, tmp_path):
    worker = live_server.client(live_server.create_key("mailer", "worker"))
    example = run_example(readme_example("Waiting for a result", "wait"), tmp_path,
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
