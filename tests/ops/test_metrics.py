"""GET /metrics through the Flask test client: access, and the figures after a known sequence."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask

from app import create_app
from app.jobs.domain.transitions import JOB_METRICS
from app.ops.metrics import QueueMetrics
from tests.ops.scrape import Scrape

STATUSES = ("pending", "running", "completed", "failed", "cancelled")


def scrape(client: Any, key: Any = None) -> Scrape:
    response = client.get("/metrics", headers=key.headers if key else {})
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.content_type.startswith("text/plain")
    return Scrape(response.get_data(as_text=True))


def test_metrics_need_an_admin_key(client: Any, producer: Any, worker: Any, admin: Any) -> None:
    anonymous = client.get("/metrics")
    assert anonymous.status_code == 401
    assert anonymous.headers["WWW-Authenticate"].startswith("Bearer")
    assert anonymous.content_type == "application/problem+json"
    assert client.get("/metrics", headers=producer.headers).status_code == 403
    assert client.get("/metrics", headers=worker.headers).status_code == 403
    assert client.get("/metrics", headers=admin.headers).status_code == 200


def test_metrics_are_public_when_configured(app_config: dict[str, Any]) -> None:
    app = create_app({**app_config, "METRICS_PUBLIC": True})
    try:
        response = app.test_client().get("/metrics")
        assert response.status_code == 200
        assert "queuelog_jobs_enqueued_total 0.0" in response.get_data(as_text=True)
    finally:
        app.extensions["queuelog"].db.engine.dispose()


def test_metrics_speak_openmetrics_to_a_scraper_that_asks(client: Any, admin: Any) -> None:
    response = client.get("/metrics", headers={
        **admin.headers, "Accept": "application/openmetrics-text; version=1.0.0"})
    assert response.status_code == 200
    assert response.content_type.startswith("application/openmetrics-text")
    assert response.get_data(as_text=True).endswith("# EOF\n")


def test_metrics_after_a_known_sequence_of_jobs(api: Any, client: Any, clock: Any,
                                                producer: Any, worker: Any, admin: Any) -> None:
    email = [api.enqueue(producer, type="email", idempotency_key="e1").json["id"],
             api.enqueue(producer, type="email").json["id"],
             api.enqueue(producer, type="email", max_retries=1).json["id"]]
    pdf = [api.enqueue(producer, type="pdf").json["id"] for _ in range(2)]
    assert api.enqueue(producer, type="email", delay_seconds=600).status_code == 201
    # A replay stores nothing: not counted as enqueued.
    assert api.enqueue(producer, type="email", idempotency_key="e1").status_code == 200
    clock.advance(10)

    first = api.claim(worker).json
    assert first["id"] == email[0]
    assert api.complete(worker, first["id"]).status_code == 200
    second = api.claim(worker).json
    assert second["id"] == email[1]
    assert api.fail(worker, second["id"], retry_in_seconds=3600).json["status"] == "pending"
    third = api.claim(worker, lease_seconds=5).json
    assert third["id"] == email[2]
    clock.advance(6)
    # This claim rescues the expired lease (its one retry), then takes the job again.
    assert api.claim(worker).json["id"] == email[2]
    assert api.fail(worker, email[2]).json["status"] == "failed"
    assert api.heartbeat(worker, email[2]).status_code == 409  # a refused report
    assert api.complete(worker, email[2]).status_code == 409  # and another
    assert api.cancel(admin, pdf[1]).status_code == 200
    assert api.get(producer, 999_999).status_code == 404
    assert client.get("/no/such/path").status_code == 404

    figures = scrape(client, admin)

    assert figures.value("queuelog_jobs_enqueued_total") == 6
    assert figures.value("queuelog_jobs_claimed_total") == 4
    assert figures.value("queuelog_jobs_completed_total") == 1
    assert figures.value("queuelog_jobs_retried_total") == 2  # one fail, one lease expiry
    assert figures.value("queuelog_jobs_failed_total") == 1
    assert figures.value("queuelog_jobs_rescued_total") == 1
    assert figures.value("queuelog_jobs_report_refused_total") == 2

    expected = {("pending", "email"): 2, ("completed", "email"): 1, ("failed", "email"): 1,
                ("pending", "pdf"): 1, ("cancelled", "pdf"): 1}
    for status in STATUSES:
        for job_type in ("email", "pdf", "sync"):  # sync: configured, never enqueued
            assert figures.value("queuelog_jobs", status=status, type=job_type) == \
                expected.get((status, job_type), 0), (status, job_type)
    # pdf[0] has been claimable since it was enqueued, 16 s ago on the test's clock; the
    # failed-and-retried email and the delayed one are not claimable yet.
    assert figures.value("queuelog_oldest_claimable_job_age_seconds") == 16.0
    assert figures.value("queuelog_database_up") == 1

    assert figures.requests("POST", "/jobs", 201) == 6
    assert figures.requests("POST", "/jobs", 200) == 1
    assert figures.requests("POST", "/jobs/claim", 200) == 4
    assert figures.requests("POST", "/jobs/<id:job_id>/complete", 200) == 1
    assert figures.requests("POST", "/jobs/<id:job_id>/fail", 200) == 2
    assert figures.requests("POST", "/jobs/<id:job_id>/cancel", 200) == 1
    assert figures.requests("GET", "/jobs/<id:job_id>", 404) == 1
    assert figures.requests("GET", "<unmatched>", 404) == 1
    # Routes, never raw paths: ids and unknown paths do not make series of their own.
    routes = figures.label_values("queuelog_http_request_duration_seconds_count", "route")
    assert not any(str(email[0]) in route or "/no/such" in route for route in routes)


def test_the_oldest_claimable_age_is_zero_when_nothing_is_claimable(
        api: Any, client: Any, producer: Any, admin: Any) -> None:
    assert scrape(client, admin).value("queuelog_oldest_claimable_job_age_seconds") == 0
    api.enqueue(producer, delay_seconds=60)
    assert scrape(client, admin).value("queuelog_oldest_claimable_job_age_seconds") == 0


def test_a_claim_that_finds_nothing_counts_no_job(api: Any, client: Any, worker: Any,
                                                  admin: Any) -> None:
    assert api.claim(worker).status_code == 204
    figures = scrape(client, admin)
    assert figures.value("queuelog_jobs_claimed_total") == 0
    assert figures.requests("POST", "/jobs/claim", 204) == 1


def test_odd_request_methods_share_one_label(client: Any, admin: Any) -> None:
    for method in ("BREW", "PROPFIND", "X-ANYTHING"):
        client.open("/jobs", method=method)
    figures = scrape(client, admin)
    assert figures.label_values("queuelog_http_request_duration_seconds_count", "method") == {
        "OTHER"}


def test_metrics_still_answer_when_the_database_does_not(tmp_path: Any) -> None:
    app = create_app({"TESTING": True, "METRICS_PUBLIC": True, "DB_POOL_TIMEOUT_SECONDS": 2,
                      "DATABASE_URL": f"sqlite:///{tmp_path / 'missing' / 'q.sqlite3'}"})
    try:
        response = app.test_client().get("/metrics")
        assert response.status_code == 200
        figures = Scrape(response.get_data(as_text=True))
        assert figures.value("queuelog_database_up") == 0
        assert figures.value("queuelog_jobs_enqueued_total") == 0
        assert "queuelog_jobs" not in figures.names()
    finally:
        app.extensions["queuelog"].db.engine.dispose()


def test_each_app_counts_on_its_own(app: Flask, app_config: dict[str, Any]) -> None:
    other = create_app(app_config)
    try:
        app.extensions["queuelog_metrics"].count_job_event("enqueued", 2)
        own = Scrape(app.extensions["queuelog_metrics"].render(None)[0].decode())
        theirs = Scrape(other.extensions["queuelog_metrics"].render(None)[0].decode())
        assert own.value("queuelog_jobs_enqueued_total") == 2
        assert theirs.value("queuelog_jobs_enqueued_total") == 0
    finally:
        other.extensions["queuelog"].db.engine.dispose()


@pytest.mark.parametrize("event", sorted(metric.value for metric in JOB_METRICS))
def test_every_job_event_of_the_service_has_a_counter(event: str) -> None:
    metrics = QueueMetrics()
    metrics.count_job_event(event, 3)
    metrics.count_job_event("an-event-from-the-future", 1)  # ignored, never raises
    figures = Scrape(metrics.render(None)[0].decode())
    assert figures.value(f"queuelog_jobs_{event}_total") == 3
