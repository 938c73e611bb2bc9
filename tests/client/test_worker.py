"""The worker runner against a real gunicorn-served queuelog: results, failures, retries
asked by the handler, concurrency, leases outlived, SIGTERM, a server restart mid-run.

Runners are `queuelog worker …` subprocesses where signals or the process matter, and the
Python API (Worker in a thread) where the test needs the handler's state."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from queuelog_client import Worker
from tests.client import handlers
from tests.client.conftest import LiveServer, wait_until
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.slow


def _status_of(server: LiveServer, job_ids: list[int]) -> list[str]:
    admin = server.client()
    return [admin.get_job(job_id)["status"] for job_id in job_ids]


def _all_finished(server: LiveServer, job_ids: list[int]) -> bool:
    return all(status in {"completed", "failed"} for status in _status_of(server, job_ids))


class ThreadedWorker:
    """A Worker run through the Python API in a background thread."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.worker.run(install_signal_handlers=False)
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self.worker.stop()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()
        assert self.error is None


@pytest.fixture
def threaded_workers() -> Iterator[Any]:
    started: list[ThreadedWorker] = []

    def start(server: LiveServer, handler: Any, key_name: str, **options: Any
              ) -> ThreadedWorker:
        token = server.create_key(key_name, "worker")
        options.setdefault("wait_seconds", 1)
        running = ThreadedWorker(Worker(server.url, handler, token=token, **options))
        started.append(running)
        return running

    yield start
    for running in started:
        running.worker.stop(grace_seconds=0)
        running.thread.join(timeout=30)


# -- the runner command ----------------------------------------------------------------------

def test_the_runner_completes_jobs_with_the_handlers_result_and_exits_0_on_sigterm(
        live_server, start_runner):
    producer = live_server.client(live_server.create_key("shop", "producer"))
    jobs = producer.enqueue_many([{"type": "email", "payload": {"n": n}} for n in range(6)]
                                 + [{"type": "pdf", "payload": {"n": 99}}])
    email_ids = [job["id"] for job in jobs[:6]]

    runner = start_runner(live_server, live_server.create_key("mailer", "worker"),
                          "tests.client.handlers:succeed", "--types", "email",
                          "--concurrency", "2", "--wait-seconds", "1")
    wait_until(lambda: _all_finished(live_server, email_ids), what="the email jobs")

    admin = live_server.client()
    for job_id, n in zip(email_ids, range(6), strict=True):
        job = admin.get_job(job_id)
        assert job["status"] == "completed", runner.log()
        assert job["result"] == {"handled": job_id, "payload": {"n": n}}
        assert job["worker_id"] == "mailer"
    assert admin.get_job(jobs[6]["id"])["status"] == "pending"  # not one of its types

    runner.signal(signal.SIGTERM)
    assert runner.wait() == 0, runner.log()


def test_a_complete_whose_answer_was_lost_is_sent_again_and_taken_once(live_server,
                                                                       start_runner):
    proxy = TcpProxy(live_server.port)
    proxy.start()
    proxy.lose_answer_to(b"/complete ")
    producer = live_server.client(live_server.create_key("shop", "producer"))
    job = producer.enqueue("email", {"n": 1})

    runner = start_runner(live_server, live_server.create_key("mailer", "worker"),
                          "tests.client.handlers:succeed", "--wait-seconds", "1",
                          url=f"http://127.0.0.1:{proxy.port}")
    wait_until(lambda: live_server.client().get_job(job["id"])["status"] == "completed",
               what="the job to be completed")
    runner.signal(signal.SIGTERM)
    assert runner.wait() == 0, runner.log()
    proxy.stop()

    log = runner.log()
    assert proxy.answers_lost == 1  # the first complete landed; its answer never came back
    assert log.count(f"job {job['id']} completed") == 1, log
    assert "lease was lost" not in log and "'lost': 0" in log, log
    assert "'completed': 1" in log, log
    assert live_server.client().get_job(job["id"])["result"] == {
        "handled": job["id"], "payload": {"n": 1}}


def test_a_handler_that_raises_fails_the_job_with_type_and_message_and_logs_the_traceback(
        live_server, start_runner):
    producer = live_server.client(live_server.create_key("shop", "producer"))
    job = producer.enqueue("email", {"what": "the moon"}, max_retries=0)
    runner = start_runner(live_server, live_server.create_key("mailer", "worker"),
                          "tests.client.handlers:explode", "--wait-seconds", "1")

    wait_until(lambda: _all_finished(live_server, [job["id"]]), what="the job to fail")
    failed = live_server.client().get_job(job["id"])
    assert failed["status"] == "failed"
    assert failed["error"] == "ValueError: cannot handle the moon"
    wait_until(lambda: "Traceback (most recent call last)" in runner.log(),
               what="the traceback in the runner's log")
    assert "handlers.py" in runner.log()

    runner.signal(signal.SIGINT)
    assert runner.wait() == 0, runner.log()


def test_a_runner_whose_key_is_refused_exits_1_and_says_why(live_server, start_runner):
    runner = start_runner(live_server, "not-a-token", "tests.client.handlers:succeed")
    assert runner.wait() == 1
    assert "401" in runner.log()
    assert "not-a-token" not in runner.log()


def test_a_runner_asking_for_a_misspelt_type_stops_at_start_with_the_servers_message(
        live_server, start_runner):
    token = live_server.create_key("mailer", "worker")
    runner = start_runner(live_server, token, "tests.client.handlers:succeed",
                          "--types", "email,emial", "--wait-seconds", "20")
    assert runner.wait(timeout=30) == 1, runner.log()
    assert "422" in runner.log()
    assert "Not configured: emial" in runner.log()
    assert "configured: email, pdf, sync" in runner.log()


def test_sigterm_mid_job_stops_claiming_lets_the_job_finish_and_exits_0(
        live_server, start_runner, tmp_path):
    producer = live_server.client(live_server.create_key("shop", "producer"))
    started = tmp_path / "started"
    job = producer.enqueue("email", {"started": str(started), "seconds": 1.5})
    runner = start_runner(live_server, live_server.create_key("mailer", "worker"),
                          "tests.client.handlers:announce_then_sleep", "--wait-seconds", "1")

    wait_until(started.exists, what="the handler to start")
    runner.signal(signal.SIGTERM)
    later = producer.enqueue("email", {"started": str(tmp_path / "never"), "seconds": 0})
    assert runner.wait() == 0, runner.log()

    admin = live_server.client()
    finished = admin.get_job(job["id"])
    assert finished["status"] == "completed", runner.log()
    assert finished["result"] == {"slept": 1.5}
    assert admin.get_job(later["id"])["status"] == "pending"  # no claim after SIGTERM


def test_sigterm_fails_a_job_still_running_after_the_grace_period_and_exits_0(
        live_server, start_runner, tmp_path):
    producer = live_server.client(live_server.create_key("shop", "producer"))
    started = tmp_path / "started"
    job = producer.enqueue("email", {"started": str(started), "seconds": 60})
    runner = start_runner(live_server, live_server.create_key("mailer", "worker"),
                          "tests.client.handlers:announce_then_sleep", "--wait-seconds", "1",
                          "--grace-seconds", "0.5")

    wait_until(started.exists, what="the handler to start")
    runner.signal(signal.SIGTERM)
    assert runner.wait() == 0, runner.log()

    abandoned = live_server.client().get_job(job["id"])
    assert abandoned["status"] == "pending"  # back in the queue, claimable at once
    assert abandoned["retry_count"] == 1
    assert abandoned["error"].startswith("WorkerShutdown:")


def test_the_runner_survives_a_server_restart_and_loses_nothing(live_server, start_runner):
    producer = live_server.client(live_server.create_key("shop", "producer"))
    ids = [job["id"] for job in producer.enqueue_many(
        [{"type": "email", "payload": {"seconds": 0.1}} for _ in range(12)])]
    # A short lease: a claim whose answer dies with the server comes back soon.
    runner = start_runner(live_server, live_server.create_key("mailer", "worker"),
                          "tests.client.handlers:pause", "--concurrency", "3",
                          "--wait-seconds", "1", "--lease-seconds", "4")
    wait_until(lambda: _status_of(live_server, ids).count("completed") >= 3,
               what="a few jobs to complete")

    live_server.stop()  # SIGKILL: no graceful goodbye
    wait_until(lambda: "unreachable" in runner.log(), what="the runner to notice")
    live_server.start()
    ids += [job["id"] for job in producer.enqueue_many(
        [{"type": "email", "payload": {"seconds": 0.1}} for _ in range(8)])]

    wait_until(lambda: _all_finished(live_server, ids), timeout=60, what="every job")
    admin = live_server.client()
    for job_id in ids:
        job = admin.get_job(job_id)
        assert job["status"] == "completed", runner.log()
        assert job["result"] == {"handled": job_id}
    assert runner.alive()
    runner.signal(signal.SIGTERM)
    assert runner.wait() == 0, runner.log()


# -- the Python API ----------------------------------------------------------------------------

def test_a_job_that_outlives_its_lease_is_rescued_and_completed_once_elsewhere(
        live_server, threaded_workers):
    producer = live_server.client(live_server.create_key("shop", "producer"))
    admin = live_server.client()
    job = producer.enqueue("email", {"seconds": 3})

    # No heartbeats and a one-second lease: the first attempt outlives its lease.
    stalled = threaded_workers(live_server, handlers.slow_first_attempt, "stalled",
                               lease_seconds=1, heartbeat=False)
    wait_until(lambda: admin.get_job(job["id"])["worker_id"] == "stalled",
               what="the stalled worker to claim the job")
    rescuer = threaded_workers(live_server, handlers.slow_first_attempt, "rescuer")

    wait_until(lambda: admin.get_job(job["id"])["status"] == "completed",
               what="the rescuer to complete the job")
    wait_until(lambda: stalled.worker.stats["lost"] == 1,
               what="the stalled worker's complete to be refused")

    done = admin.get_job(job["id"])
    assert done["worker_id"] == "rescuer"
    assert done["retry_count"] == 1
    assert done["result"] == {"attempt": 2}
    assert stalled.worker.stats["completed"] == 0
    assert rescuer.worker.stats["completed"] == 1
    stalled.stop()
    rescuer.stop()


def test_heartbeats_keep_a_job_longer_than_its_lease_with_its_worker(live_server,
                                                                    threaded_workers):
    producer = live_server.client(live_server.create_key("shop", "producer"))
    admin = live_server.client()
    job = producer.enqueue("email", {"seconds": 3})

    holder = threaded_workers(live_server, handlers.slow_first_attempt, "holder",
                              lease_seconds=2)
    wait_until(lambda: admin.get_job(job["id"])["worker_id"] == "holder",
               what="the holder to claim the job")
    # A rival polls all along: it would take the job the moment a lease ran out.
    rival = threaded_workers(live_server, handlers.slow_first_attempt, "rival")

    wait_until(lambda: admin.get_job(job["id"])["status"] == "completed",
               what="the holder to complete the job")
    done = admin.get_job(job["id"])
    assert done["worker_id"] == "holder"
    assert done["retry_count"] == 0
    assert done["result"] == {"attempt": 1}
    assert rival.worker.stats["claimed"] == 0
    holder.stop()
    rival.stop()


def test_concurrency_runs_that_many_jobs_at_once(live_server, threaded_workers):
    producer = live_server.client(live_server.create_key("shop", "producer"))
    ids = [job["id"] for job in producer.enqueue_many([{"type": "email"}] * 3)]

    # Each job waits inside the handler until all three are there at the same time.
    running = threaded_workers(live_server, handlers.rendezvous(3), "mailer", concurrency=3)
    wait_until(lambda: _all_finished(live_server, ids), what="the three jobs")

    admin = live_server.client()
    assert [admin.get_job(job_id)["result"] for job_id in ids] == [{"met": 3}] * 3
    running.stop()


def test_a_worker_running_more_jobs_than_one_claim_may_take_claims_them_in_turns(
        live_server, threaded_workers):
    # One claim-many takes at most 100 jobs (CLAIM_JOBS); a worker free for 150 asks for 100,
    # then for the rest, and never for more than the server takes (a 422 would stop it).
    producer = live_server.client(live_server.create_key("shop", "producer"))
    ids = [job["id"] for job in producer.enqueue_many([{"type": "email"}] * 150)]

    running = threaded_workers(live_server, handlers.succeed, "mailer", concurrency=150)
    wait_until(lambda: _all_finished(live_server, ids), what="the 150 jobs")

    assert set(_status_of(live_server, ids)) == {"completed"}
    running.stop()


def test_a_handler_may_ask_for_a_retry_later(live_server, threaded_workers):
    producer = live_server.client(live_server.create_key("shop", "producer"))
    job = producer.enqueue("email")
    running = threaded_workers(live_server, handlers.retry_once, "mailer")

    wait_until(lambda: _all_finished(live_server, [job["id"]]), what="the second attempt")
    done = live_server.client().get_job(job["id"])
    assert done["status"] == "completed"
    assert done["retry_count"] == 1
    assert done["result"] == {"attempt": 2}
    assert done["error"].startswith("RetryLater: the mail server said 421")
    running.stop()


def test_a_result_that_is_not_an_object_fails_the_job(live_server, threaded_workers):
    producer = live_server.client(live_server.create_key("shop", "producer"))
    job = producer.enqueue("email", max_retries=0)
    running = threaded_workers(live_server, handlers.return_a_list, "mailer")

    wait_until(lambda: _all_finished(live_server, [job["id"]]), what="the job to fail")
    failed = live_server.client().get_job(job["id"])
    assert failed["status"] == "failed"
    assert failed["error"].startswith("TypeError: the handler returned list")
    running.stop()
