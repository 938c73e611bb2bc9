"""What `queuelog worker` says: a mistake on its command line is one line on
stderr, never a traceback; a refusal from the server is logged once; at start it says what it
waits for and from where, never with the token."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.client.conftest import ROOT, _child_env, wait_until

RUNNER = [sys.executable, "-c", "from app.cli import main; main()", "worker"]


def _runner(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RUNNER, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=_child_env(QUEUELOG_TOKEN="not-a-real-token"))


@pytest.mark.parametrize(("url", "said"), [
    ("localhost:8000", "did you mean http://localhost:8000?"),
    ("127.0.0.1:8000", "did you mean http://127.0.0.1:8000?"),
    ("ftp://127.0.0.1", "http(s)://host[:port][/prefix]"),
    ("http://127.0.0.1:99999", "Port out of range"),
    ("http://127.0.0.1:8000/?key=1", "without a query"),
])
def test_a_bad_url_is_one_line_on_stderr(url, said):
    answer = _runner("--url", url, "--handler", "tests.client.handlers:succeed")
    assert answer.returncode == 2
    assert answer.stdout == ""
    lines = answer.stderr.splitlines()
    assert len(lines) == 1, answer.stderr
    assert said in lines[0] and "--url" in lines[0]


@pytest.mark.parametrize("args", [
    ["--handler", "tests.client.handlers:succeed", "--concurrency", "zero"],
    ["--handler", "tests.client.handlers:succeed", "--no-such-option"],
    ["--url", "http://127.0.0.1:9"],  # no --handler
    ["--url", "http://127.0.0.1:9", "--handler", "tests.client.handlers:succeed",
     "--wait-seconds", "21"],
    ["--url", "http://127.0.0.1:9", "--handler", "tests.client.handlers:succeed",
     "--instance", "tab\there"],
])
def test_every_command_line_mistake_is_one_line(args):
    answer = _runner(*args)
    assert answer.returncode == 2
    assert len(answer.stderr.splitlines()) == 1, answer.stderr
    assert "queuelog worker: error:" in answer.stderr and "--help" in answer.stderr


def test_a_refused_claim_is_logged_once(live_server, start_runner):
    runner = start_runner(live_server, "not-a-real-token", "tests.client.handlers:succeed")
    assert runner.wait(timeout=60) == 1
    log = runner.log()
    refusals = [line for line in log.splitlines() if "refused" in line or "giving up" in line]
    assert len(refusals) == 1, log
    assert "Traceback" not in log


def test_an_idle_worker_says_at_start_what_it_waits_for_and_from_where(live_server,
                                                                        start_runner):
    token = live_server.create_key("w", "worker")
    runner = start_runner(live_server, token, "tests.client.handlers:succeed",
                          "--types", "email,pdf", "--wait-seconds", "1")
    line = wait_until(lambda: next((line for line in runner.log().splitlines()
                                    if "waiting for jobs" in line), None),
                      what="the runner's start line")
    assert "types email,pdf" in line and live_server.url in line
    anything = start_runner(live_server, token, "tests.client.handlers:succeed")
    wait_until(lambda: "waiting for jobs of any type the key allows" in anything.log(),
               what="the second runner's start line")
    assert token not in runner.log() + anything.log()
