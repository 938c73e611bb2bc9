"""POST /jobs: the job as the contract shows it, defaults, scheduling and limits."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import text

from app import create_app
from app.core.callers import Role
from app.core.clock import to_rfc3339
from tests.conftest import Api, Key

RFC3339_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")


def test_enqueue_answers_201_with_the_job_and_its_location(api, producer, clock):
    response = api.enqueue(producer, type="pdf", payload={"doc": 7, "pages": [1, 2]})

    assert response.status_code == 201
    assert response.headers["Location"] == f"/jobs/{response.json['id']}"
    job = response.json
    assert job == {
        "id": job["id"],
        "type": "pdf",
        "payload": {"doc": 7, "pages": [1, 2]},
        "priority": "medium",
        "status": "pending",
        "retry_count": 0,
        "max_retries": 3,
        "idempotency_key": None,
        "concurrency_key": None,
        "run_at": to_rfc3339(clock.now_us()),
        "claimed_at": None,
        "worker_id": None,
        "lease_expires_at": None,
        "result": None,
        "created_at": to_rfc3339(clock.now_us()),
        "updated_at": to_rfc3339(clock.now_us()),
        "unique_key": None,
        "schedule": None,
        "scheduled_for": None,
        "depends_on": [],
        "waiting_on": 0,
        "on_dependency_failure": None,
        "timeout_seconds": None,
        "expires_at": None,
        "cancel_requested": False,
        "progress": None,
        "tags": [],
        "trace": None,
    }
    assert "error" not in job and "lease_token" not in job
    assert RFC3339_UTC.match(job["created_at"])


def test_enqueued_job_reads_back_identically(api, producer):
    created = api.enqueue(producer, payload={"nested": {"k": [1, None, True, 2.5, "é"]}}).json
    assert api.get(producer, created["id"]).json == created


@pytest.mark.parametrize("label", ["low", "medium", "LOW", "Medium"])
def test_priority_labels_are_case_insensitive(api, producer, label):
    assert api.enqueue(producer, priority=label).json["priority"] == label.lower()


def test_priority_is_stored_as_its_integer(api, admin, app):
    ids = {label: api.enqueue(admin, priority=label).json["id"]
           for label in ("low", "medium", "high", "critical")}
    with app.extensions["queuelog"].db.read() as conn:
        stored = dict(conn.execute(text("SELECT id, priority FROM jobs")).all())
    labels = ("low", "medium", "high", "critical")
    assert [stored[ids[label]] for label in labels] == [0, 10, 20, 30]


def test_payload_defaults_to_an_empty_object(api, producer):
    assert api.enqueue(producer).json["payload"] == {}


def test_payload_round_trips_exactly_including_nul_characters(api, producer):
    payload = {"z": 1, "a": "nul\u0000here", "emoji": "🙂", "big": 2**53, "neg": -0.5}
    job = api.enqueue(producer, payload=payload).json
    fetched = api.get(producer, job["id"]).json
    assert fetched["payload"] == payload
    assert list(fetched["payload"]) == ["z", "a", "emoji", "big", "neg"]  # key order kept


@pytest.mark.parametrize("max_retries", [0, 25])
def test_max_retries_accepts_its_bounds(api, producer, max_retries):
    assert api.enqueue(producer, max_retries=max_retries).json["max_retries"] == max_retries


def test_delay_seconds_sets_run_at_in_the_future(api, producer, clock):
    job = api.enqueue(producer, delay_seconds=90).json
    assert job["run_at"] == to_rfc3339(clock.now_us() + 90_000_000)


def test_run_at_with_an_offset_is_normalised_to_utc(api, producer):
    job = api.enqueue(producer, run_at="2027-01-15T10:00:00.5+02:00").json
    assert job["run_at"] == "2027-01-15T08:00:00.500000Z"


def test_run_at_more_than_a_year_ahead_is_refused(api, producer):
    response = api.enqueue(producer, run_at="2030-01-01T00:00:00Z")
    assert response.status_code == 422
    assert "run_at" in response.json["errors"]


def test_run_at_and_delay_seconds_together_are_refused(api, producer):
    response = api.enqueue(producer, run_at="2027-01-15T10:00:00Z", delay_seconds=5)
    assert response.status_code == 422
    assert "delay_seconds" in response.json["errors"]


def test_unknown_job_type_is_refused_and_nothing_is_stored(api, producer, admin):
    response = api.enqueue(producer, type="mine-bitcoin")
    assert response.status_code == 422
    assert response.json["errors"] == {
        "type": ["Not configured: mine-bitcoin (configured: email, pdf, sync)."]}
    assert response.json["detail"] == (
        "Not configured: mine-bitcoin. The configured job types: email, pdf, sync.")
    assert api.list(admin).json["jobs"] == []


def test_without_configured_job_types_every_enqueue_says_so(app_config):
    app_config["JOB_TYPES"] = frozenset()
    app = create_app(app_config)
    token = app.extensions["queuelog"].keys.create_key("p", Role.PRODUCER)
    response = Api(app.test_client()).enqueue(Key("p", token))
    assert response.status_code == 422
    assert "QUEUELOG_JOB_TYPES" in response.json["detail"]
    app.extensions["queuelog"].db.engine.dispose()
