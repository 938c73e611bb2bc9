"""queuelog's own spans (app/ops/tracing.py), exported over OTLP/HTTP to a collector in this
process, on both engines; and, without the OTEL_* variables, no OpenTelemetry at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from app import create_app
from app.ops.tracing import export_wanted, flush_tracing, shutdown_tracing

pytest.importorskip("opentelemetry.sdk.trace")
pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")

from tests.ops.otlp_collector import Collector

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PRODUCER_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PRODUCER_SPAN_ID}-01"
WORKER_SPAN_ID = "b7ad6b7169203331"


@pytest.fixture
def collector() -> Iterator[Collector]:
    with Collector() as collector:
        yield collector


@pytest.fixture
def app(app_config: dict[str, Any], collector: Collector,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[Flask]:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    for name in ("OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_SERVICE_NAME",
                 "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_SAMPLER",
                 "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    application = create_app(app_config)
    yield application
    shutdown_tracing(application)
    application.extensions["queuelog"].db.engine.dispose()


def test_enqueue_claim_and_report_spans_join_the_producers_trace(
        app, client, api, producer, worker, collector):
    headers = {"traceparent": TRACEPARENT, "tracestate": "vendor=abc"}
    job_id = api.enqueue(producer, headers=headers, payload={"secret": "s3"}).json["id"]
    claimed = api.claim(worker)
    assert claimed.status_code == 200 and claimed.json["id"] == job_id
    # The runner reports with its job's traceparent (here: the worker's own span's).
    report = client.post(f"/jobs/{job_id}/complete",
                         json={"result": {"ok": 1},
                               "lease_token": claimed.json["lease_token"]},
                         headers={**worker.headers,
                                  "traceparent": f"00-{TRACE_ID}-{WORKER_SPAN_ID}-01"})
    assert report.status_code == 200
    assert flush_tracing(app)

    [enqueue] = collector.named("queuelog.enqueue")
    assert (enqueue["trace_id"], enqueue["parent_span_id"]) == (TRACE_ID, PRODUCER_SPAN_ID)
    assert enqueue["attributes"]["queuelog.job.id"] == job_id
    assert enqueue["attributes"]["queuelog.job.type"] == "email"
    assert enqueue["attributes"]["http.response.status_code"] == 201
    assert enqueue["service"] == "queuelog"
    [claim] = collector.named("queuelog.claim")
    # Parented on the job's stored trace: the producer's span.
    assert (claim["trace_id"], claim["parent_span_id"]) == (TRACE_ID, PRODUCER_SPAN_ID)
    assert claim["attributes"]["queuelog.job.id"] == job_id
    [complete] = collector.named("queuelog.report")
    # A report's answer does not show the job's trace: the request's own traceparent is the
    # parent.
    assert (complete["trace_id"], complete["parent_span_id"]) == (TRACE_ID, WORKER_SPAN_ID)
    assert complete["attributes"]["queuelog.report"] == "complete"
    assert complete["attributes"]["queuelog.job.id"] == job_id
    # Never a payload, a result or a token.
    shown = json.dumps(collector.spans)
    assert "s3" not in shown and claimed.json["lease_token"] not in shown
    assert producer.token not in shown and worker.token not in shown


def test_a_batch_gets_one_enqueue_span_and_a_claim_or_report_of_several_one_span_per_job(
        app, client, producer, worker, collector):
    response = client.post("/jobs/batch", json={"jobs": [{"type": "email"}] * 3},
                           headers={**producer.headers, "traceparent": TRACEPARENT})
    assert response.status_code == 201
    ids = [job["id"] for job in response.json["jobs"]]
    claimed = client.post("/jobs/claim-many", json={"max_jobs": 3}, headers=worker.headers)
    assert [job["id"] for job in claimed.json["jobs"]] == ids
    job_trace = claimed.json["jobs"][0]["trace"]
    failed = client.post(f"/jobs/{ids[0]}/fail", headers={**worker.headers, **job_trace},
                         json={"error": "no",
                               "lease_token": claimed.json["jobs"][0]["lease_token"]})
    assert failed.status_code == 200
    items = [{"id": job["id"], "lease_token": job["lease_token"], "result": None}
             for job in claimed.json["jobs"][1:]]
    completed = client.post("/jobs/complete-many", json={"items": items},
                            headers={**worker.headers, **job_trace})
    assert [result["status"] for result in completed.json["results"]] == [200, 200]
    assert flush_tracing(app)

    [enqueue] = collector.named("queuelog.enqueue")
    assert enqueue["parent_span_id"] == PRODUCER_SPAN_ID
    assert enqueue["attributes"]["queuelog.job.ids"] == ids
    claims = collector.named("queuelog.claim")
    assert sorted(span["attributes"]["queuelog.job.id"] for span in claims) == ids
    assert {(span["trace_id"], span["parent_span_id"]) for span in claims} == {
        (TRACE_ID, PRODUCER_SPAN_ID)}
    reports = {span["attributes"]["queuelog.job.id"]: span
               for span in collector.named("queuelog.report")}
    assert sorted(reports) == ids
    assert reports[ids[0]]["attributes"]["queuelog.report"] == "fail"
    assert {reports[job_id]["attributes"]["queuelog.report"] for job_id in ids[1:]} == {
        "complete"}
    assert {(span["trace_id"], span["parent_span_id"]) for span in reports.values()} == {
        (TRACE_ID, PRODUCER_SPAN_ID)}


def test_requests_without_trace_context_start_their_own_traces_and_empty_claims_none(
        app, api, producer, worker, collector):
    job_id = api.enqueue(producer, headers={"traceparent": "not-a-traceparent"}).json["id"]
    assert api.claim(worker).json["id"] == job_id
    assert api.claim(worker).status_code == 204
    assert flush_tracing(app)

    [enqueue] = collector.named("queuelog.enqueue")
    assert enqueue["parent_span_id"] == ""
    [claim] = collector.named("queuelog.claim")
    assert claim["parent_span_id"] == "" and claim["trace_id"] != enqueue["trace_id"]


@pytest.mark.parametrize("environ, wanted", [
    ({}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "TRUE"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
    ({"OTEL_SERVICE_NAME": "queuelog"}, False),
])
def test_export_is_wanted_only_when_an_otlp_endpoint_is_named(environ, wanted):
    assert export_wanted(environ) is wanted


_WITHOUT_OTEL = """
import importlib.abc, json, sys

class NoOpenTelemetry(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(f"no {name} here")
        return None

if sys.argv[2] == "uninstalled":
    sys.meta_path.insert(0, NoOpenTelemetry())
from app import create_app
app = create_app({"TESTING": True, "DATABASE_URL": sys.argv[1]})
assert app.test_client().get("/healthz").status_code == 200
assert app.test_client().post("/jobs", json={}).status_code == 401
app.extensions["queuelog"].db.engine.dispose()
print(json.dumps(sorted(name for name in sys.modules if name.startswith("opentelemetry"))))
"""


def _run_without_otel(db_url: str, tmp_path: Path, mode: str,
                      **otel: str) -> subprocess.CompletedProcess[str]:
    environ = {name: value for name, value in os.environ.items()
               if not name.startswith("OTEL_")} | otel
    root = Path(__file__).resolve().parents[2]
    environ["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "client")])
    done = subprocess.run([sys.executable, "-c", _WITHOUT_OTEL, db_url, mode], env=environ,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
    return done


@pytest.mark.parametrize("engine_name", ["sqlite"], indirect=True)
def test_without_the_otel_variables_nothing_of_opentelemetry_is_imported(
        db_url: str, tmp_path: Path) -> None:
    _run_without_otel(db_url, tmp_path, "installed")


@pytest.mark.parametrize("engine_name", ["sqlite"], indirect=True)
def test_with_the_variables_but_without_the_extra_the_server_warns_and_runs_on(
        db_url: str, tmp_path: Path) -> None:
    done = _run_without_otel(db_url, tmp_path, "uninstalled",
                             OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")
    assert "the `otel` extra is not installed" in done.stderr
