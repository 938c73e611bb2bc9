"""The runner's instance label: host:pid unless told (QUEUELOG_INSTANCE, `instance=`,
`--instance`), sent with its claims and heartbeats, so that GET /workers lists it under the
key and each job's attempt names it; a label the server would refuse is refused at start."""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest

from queuelog_client import Worker
from queuelog_client.client import MAX_INSTANCE_CHARS
from queuelog_client.worker import INSTANCE_VARIABLE, check_instance, default_instance
from tests.client import handlers
from tests.client.conftest import wait_until
from tests.client.test_worker import threaded_workers  # noqa: F401 - a fixture used below


def test_the_default_label_is_host_and_pid_unless_the_operator_sets_one(monkeypatch):
    monkeypatch.delenv(INSTANCE_VARIABLE, raising=False)
    assert default_instance() == f"{socket.gethostname()}:{os.getpid()}"
    monkeypatch.setattr(socket, "gethostname", lambda: "h" * 300)
    label = default_instance()
    assert len(label) == MAX_INSTANCE_CHARS and label.endswith(f":{os.getpid()}")
    monkeypatch.setattr(socket, "gethostname", lambda: "h\u00f6st one")
    assert check_instance(default_instance()) == f"h?st?one:{os.getpid()}"
    monkeypatch.setenv(INSTANCE_VARIABLE, "blue-7")
    assert default_instance() == "blue-7"
    assert Worker("http://127.0.0.1:9", handlers.succeed, token="t").instance == "blue-7"
    assert Worker("http://127.0.0.1:9", handlers.succeed, token="t",
                  instance="green-2").instance == "green-2"


@pytest.mark.parametrize("label", ["", " ", " lead", "trail ", "tab\there", "line\nbreak",
                                   "\u202eevil", "h\u00f6st:1", "x" * (MAX_INSTANCE_CHARS + 1)])
def test_a_label_the_server_would_refuse_is_refused_at_start(label):
    with pytest.raises(ValueError, match="instance label"):
        check_instance(label)
    with pytest.raises(ValueError, match="instance label"):
        Worker("http://127.0.0.1:9", handlers.succeed, token="t", instance=label)


def _attempt_instances(server: Any, job_id: int) -> list[str | None]:
    return [attempt["worker_instance"] for attempt in server.client().attempts(job_id)]


@pytest.mark.slow
def test_the_runners_claims_name_their_instance(live_server, start_runner,
                                               threaded_workers):  # noqa: F811
    producer = live_server.client(live_server.create_key("shop", "producer"))
    email = producer.enqueue("email", {"to": "ada@example.com"})["id"]
    pdf = producer.enqueue("pdf", {"n": 1})["id"]
    running = threaded_workers(live_server, handlers.succeed, "mailer", types=["email"])
    token = live_server.create_key("printer", "worker")
    runner = start_runner(live_server, token, "tests.client.handlers:succeed",
                          "--types", "pdf", "--wait-seconds", "1", "--instance", "blue-7")
    admin = live_server.client()
    wait_until(lambda: all(admin.get_job(job_id)["status"] == "completed"
                           for job_id in (email, pdf)), timeout=60, what="both jobs done")
    assert _attempt_instances(live_server, email) == [f"{socket.gethostname()}:{os.getpid()}"]
    assert _attempt_instances(live_server, pdf) == ["blue-7"]
    assert "as instance blue-7" in runner.log()
    listed = {worker["name"]: [one["instance"] for one in worker["instances"]]
              for worker in admin._object("GET", "/workers")["workers"]}
    assert listed == {"mailer": [running.worker.instance], "printer": ["blue-7"]}
