"""The client and runner carry the producer's W3C trace context (contract §20) against a real
gunicorn-served queuelog: the handler sees it; with OpenTelemetry's SDK the runner's span and
the handler's own spans join the producer's trace; without OpenTelemetry all still works.

The OpenTelemetry runs are subprocesses: each sets its own global tracer provider (once per
process) and its own import blocker, which must not leak into the other tests."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from typing import Any

import pytest

from queuelog_client import Worker
from tests.client.conftest import ROOT, LiveServer, _child_env, wait_until

pytestmark = pytest.mark.slow

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def _run_worker_until(server: LiveServer, handler: Any, job_ids: list[int]) -> None:
    worker = Worker(server.url, handler, token=server.create_key("runner", "worker"),
                    wait_seconds=1)
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False},
                              daemon=True)
    thread.start()
    try:
        wait_until(lambda: all(server.client().get_job(job_id)["status"] == "completed"
                               for job_id in job_ids), what="the jobs' completion")
    finally:
        worker.stop(grace_seconds=0)
        thread.join(timeout=30)


def test_the_handler_sees_the_trace_context_and_tags_the_producer_sent(live_server):
    producer = live_server.client(live_server.create_key("shop", "producer"))
    job = producer.enqueue("email", {"to": "a@b.c"}, tags=["welcome", "eu"],
                           traceparent=TRACEPARENT, tracestate="vendor=abc")
    assert job["tags"] == ["eu", "welcome"]
    assert job["trace"] == {"traceparent": TRACEPARENT, "tracestate": "vendor=abc"}
    untraced = producer.enqueue("email", {"to": "d@e.f"})
    assert untraced["trace"] is None and untraced["tags"] == []
    seen: dict[int, Any] = {}

    def handler(claimed: Any) -> None:
        seen[claimed["id"]] = (claimed.trace, claimed.traceparent, claimed.tags)

    _run_worker_until(live_server, handler, [job["id"], untraced["id"]])
    assert seen[job["id"]] == ({"traceparent": TRACEPARENT, "tracestate": "vendor=abc"},
                               TRACEPARENT, ["eu", "welcome"])
    assert seen[untraced["id"]] == (None, None, [])


_WITH_OPENTELEMETRY = """
import json, sys, threading
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from queuelog_client import Client, Worker

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("the-producer")
url, producer_token, worker_token = sys.argv[1:4]
seen = {}

def handler(job):
    with tracer.start_as_current_span("handler-work"):
        seen["trace"] = job.trace
    return {"ok": True}

producer = Client(url, producer_token)
with tracer.start_as_current_span("produce") as span:
    job = producer.enqueue("email", {"n": 1})
worker = Worker(url, handler, token=worker_token, wait_seconds=1)
thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
thread.start()
try:
    done = producer.wait(job["id"], timeout=30)
finally:
    worker.stop(grace_seconds=0)
    thread.join(30)
context = span.get_span_context()
print(json.dumps({
    "producer": [format(context.trace_id, "032x"), format(context.span_id, "016x")],
    "job_trace": job["trace"], "status": done["status"], "seen": seen["trace"],
    "spans": [{"name": s.name, "trace_id": format(s.context.trace_id, "032x"),
               "span_id": format(s.context.span_id, "016x"),
               "parent": None if s.parent is None else format(s.parent.span_id, "016x"),
               "attributes": dict(s.attributes)}
              for s in exporter.get_finished_spans()]}))
"""


def _script(server: LiveServer, script: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", script, server.url, server.create_key("shop", "producer"),
         server.create_key("runner", "worker")],
        cwd=ROOT, env=_child_env(), capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def test_with_opentelemetry_the_runners_and_handlers_spans_join_the_producers_trace(
        live_server):
    pytest.importorskip("opentelemetry.sdk.trace")
    answer = _script(live_server, _WITH_OPENTELEMETRY)
    trace_id, producer_span = answer["producer"]
    assert answer["status"] == "completed"
    # The enqueue sent the current span's context, without being told.
    assert answer["job_trace"]["traceparent"].startswith(f"00-{trace_id}-{producer_span}-")
    assert answer["seen"] == answer["job_trace"]
    spans = {span["name"]: span for span in answer["spans"]}
    run = spans["queuelog.run email"]
    assert (run["trace_id"], run["parent"]) == (trace_id, producer_span)
    assert run["attributes"]["queuelog.job.type"] == "email"
    work = spans["handler-work"]
    assert (work["trace_id"], work["parent"]) == (trace_id, run["span_id"])


_WITHOUT_OPENTELEMETRY = """
import importlib.abc, json, sys, threading

class NoOpenTelemetry(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(f"no {name} here")
        return None

sys.meta_path.insert(0, NoOpenTelemetry())
from queuelog_client import Client, Worker

url, producer_token, worker_token = sys.argv[1:4]
seen = {}

def handler(job):
    seen["trace"] = job.trace
    return None

producer = Client(url, producer_token)
job = producer.enqueue("email", {"n": 1}, traceparent=sys.argv[4])
worker = Worker(url, handler, token=worker_token, wait_seconds=1)
thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
thread.start()
try:
    done = producer.wait(job["id"], timeout=30)
finally:
    worker.stop(grace_seconds=0)
    thread.join(30)
print(json.dumps({"status": done["status"], "seen": seen["trace"],
                  "imported": sorted(m for m in sys.modules if m.startswith("opentelemetry"))}))
"""


def test_without_opentelemetry_the_client_and_runner_still_carry_the_trace(live_server):
    script = _WITHOUT_OPENTELEMETRY.replace("sys.argv[4]", repr(TRACEPARENT))
    answer = _script(live_server, script)
    assert answer == {"status": "completed", "imported": [],
                      "seen": {"traceparent": TRACEPARENT, "tracestate": None}}


def test_under_gunicorn_the_servers_spans_join_the_producers_trace_through_the_runner(
        tmp_path, sqlite_template):
    """Each gunicorn worker sets its exporter up at its first request; the runner's complete
    carries the job's traceparent, so the report span is parented as the enqueue's."""
    pytest.importorskip("opentelemetry.sdk.trace")
    collector_module = pytest.importorskip("tests.ops.otlp_collector")
    with collector_module.Collector() as collector:
        server = LiveServer(tmp_path, sqlite_template,
                            OTEL_EXPORTER_OTLP_ENDPOINT=collector.url,
                            OTEL_BSP_SCHEDULE_DELAY="50")
        server.start()
        try:
            producer = server.client(server.create_key("shop", "producer"))
            job = producer.enqueue("email", {"n": 1}, traceparent=TRACEPARENT)
            _run_worker_until(server, lambda _job: None, [job["id"]])
            names = ("queuelog.enqueue", "queuelog.claim", "queuelog.report")
            wait_until(lambda: all(collector.named(name) for name in names),
                       what="the server's spans")
        finally:
            server.stop()
    for name in names:
        [span] = [s for s in collector.named(name)
                  if s["attributes"].get("queuelog.job.id") == job["id"]]
        assert (span["trace_id"], span["parent_span_id"]) == (TRACE_ID, "00f067aa0ba902b7")
