"""`python -m queuelog_client`: --help and --version answer (exit 0); no command,
or a wrong one, is one line on stderr with the usage (exit 2); `worker` is the runner."""

from __future__ import annotations

import subprocess
import sys

import pytest

import queuelog_client
from tests.client.conftest import ROOT, _child_env

MODULE = [sys.executable, "-m", "queuelog_client"]
RUNNER = [sys.executable, "-c", "from app.cli import main; main()", "worker"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=_child_env())


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_says_what_the_command_does_and_how_to_run_the_worker(flag):
    answer = _run(*MODULE, flag)
    assert answer.returncode == 0, answer.stderr
    assert answer.stderr == ""
    assert "worker" in answer.stdout and "QUEUELOG_TOKEN" in answer.stdout
    assert "python -m queuelog_client worker --help" in answer.stdout


@pytest.mark.parametrize("command", [MODULE, [*MODULE, "worker"], RUNNER])
def test_version_prints_the_clients_version(command):
    answer = _run(*command, "--version")
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.strip() == f"queuelog-client {queuelog_client.__version__}"


@pytest.mark.parametrize(("args", "said"), [
    ((), "no command given"),
    (("bogus",), "invalid choice: 'bogus'"),
    (("--nope",), "unrecognized arguments: --nope"),
])
def test_no_command_or_a_wrong_one_is_one_line_with_the_usage(args, said):
    answer = _run(*MODULE, *args)
    assert answer.returncode == 2
    assert answer.stdout == ""
    lines = answer.stderr.splitlines()
    assert len(lines) == 1, answer.stderr
    assert said in lines[0]
    assert "usage: python -m queuelog_client worker --url URL --handler" in lines[0]


def test_the_worker_command_is_the_runner():
    answer = _run(*MODULE, "worker", "--help")
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.startswith("usage: python -m queuelog_client worker")
    assert "--handler" in answer.stdout
