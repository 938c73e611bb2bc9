"""What a worker says when run as the README runs it, `Worker(...).run()` in a script that
configures no logging: the line at start and each job's outcome (a cancel on request among
them) on stderr, once each; in a script that configures logging, through its handlers alone;
and under `queuelog worker`, which configures logging, once each too."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.client.conftest import LiveServer, RunnerProcess, _child_env, wait_until

pytestmark = pytest.mark.slow

WORKER_SCRIPT = """\
import os, time
{configure}
from queuelog_client import Worker

def watch(job):
    while not job.cancel_requested:
        time.sleep(0.05)

# A short lease: heartbeats (which hear the cancel) come every second.
Worker(os.environ["QUEUELOG_URL"], watch, types=["email"], lease_seconds=3).run()
"""
CONFIGURED = ('import logging, sys\n'
              'logging.basicConfig(level=logging.INFO, stream=sys.stderr, '
              'format="mine: %(message)s")')


class ScriptWorker:
    """A script as a user writes it, run from a directory of its own, its stderr in a file."""

    def __init__(self, directory: Path, server: LiveServer, configure: str) -> None:
        (directory / "worker.py").write_text(WORKER_SCRIPT.format(configure=configure))
        self.stderr_path = directory / "worker.stderr"
        with open(self.stderr_path, "wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "worker.py"], cwd=directory, stdout=subprocess.DEVNULL,
                stderr=stderr, start_new_session=True,
                env=_child_env(QUEUELOG_URL=server.url,
                               QUEUELOG_TOKEN=server.create_key("worker", "worker")))

    def log(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=15)


@pytest.fixture
def script_worker(live_server: LiveServer, tmp_path: Path) -> Iterator[Callable[..., ScriptWorker]]:
    started: list[ScriptWorker] = []

    def start(configure: str = "") -> ScriptWorker:
        directory = tmp_path / f"script-{len(started)}"
        directory.mkdir()
        started.append(ScriptWorker(directory, live_server, configure))
        return started[-1]

    yield start
    for worker in started:
        worker.kill()


def _cancel_a_running_job(server: LiveServer, log: object) -> int:
    """Enqueue an email job, wait for the worker to run it, cancel it, wait for the cancel to
    be reported; its id."""
    admin = server.client()
    job_id: int = admin.enqueue("email")["id"]
    wait_until(lambda: admin.get_job(job_id)["status"] == "running", timeout=60,
               what="the worker to claim the job")
    admin.cancel(job_id)
    done = admin.wait(job_id, timeout=60)
    assert done["status"] == "cancelled", log
    return job_id


def _lines_with(text: str, log: str) -> list[str]:
    return [line for line in log.splitlines() if text in line]


def test_a_script_that_configures_no_logging_sees_the_workers_lines_once(
        live_server, script_worker):
    worker = script_worker()
    wait_until(lambda: "worker waiting for jobs" in worker.log(), timeout=60,
               what="the line at start")
    job_id = _cancel_a_running_job(live_server, worker.log)
    wait_until(lambda: f"job {job_id} cancelled on request" in worker.log(), timeout=30,
               what="the cancel's line")
    assert worker.stop() == 0
    log = worker.log()
    [started] = _lines_with("worker waiting for jobs", log)
    assert "INFO queuelog_client.worker: worker waiting for jobs of types email" in started
    assert len(_lines_with(f"job {job_id} cancelled on request", log)) == 1, log
    assert len(_lines_with("worker stopped", log)) == 1, log


def test_a_script_that_configures_logging_gets_the_lines_through_its_own_handlers_alone(
        live_server, script_worker):
    worker = script_worker(CONFIGURED)
    job_id = _cancel_a_running_job(live_server, worker.log)
    wait_until(lambda: f"job {job_id} cancelled on request" in worker.log(), timeout=30,
               what="the cancel's line")
    assert worker.stop() == 0
    log = worker.log()
    assert _lines_with("worker waiting for jobs", log) == [
        line for line in log.splitlines() if line.startswith("mine: worker waiting for jobs")]
    assert len(_lines_with("worker waiting for jobs", log)) == 1, log
    assert _lines_with(f"job {job_id} cancelled on request", log) == [
        f"mine: job {job_id} cancelled on request"]


def test_the_runner_command_says_each_line_once(live_server, start_runner):
    runner: RunnerProcess = start_runner(live_server, live_server.create_key("runner", "worker"),
                                         "tests.client.handlers:succeed", "--types", "email")
    wait_until(lambda: "worker waiting for jobs" in runner.log(), timeout=60,
               what="the line at start")
    job_id = live_server.client().enqueue("email")["id"]
    assert live_server.client().wait(job_id, timeout=60)["status"] == "completed"
    wait_until(lambda: f"job {job_id} completed" in runner.log(), timeout=30,
               what="the completion's line")
    runner.signal(signal.SIGTERM)
    assert runner.wait() == 0
    log = runner.log()
    assert len(_lines_with("worker waiting for jobs", log)) == 1, log
    assert len(_lines_with(f"job {job_id} completed", log)) == 1, log
