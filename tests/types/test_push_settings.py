"""PATCH /types/{type} push settings (contract section 12): admins only, the secret shown
once, credentials never shown, and workers never claim a push type's jobs."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from tests.conftest import Api, Key


def patch(client: Any, key: Key, job_type: str, **body: Any) -> Any:
    return client.patch(f"/types/{job_type}", json=body, headers=key.headers)


def test_the_first_push_setting_shows_the_secret_once_and_get_never(client, admin):
    first = patch(client, admin, "email", push={"url": "https://svc.internal/jobs",
                                                "timeout_seconds": 5})
    assert first.status_code == 200, first.json
    push = first.json["push"]
    assert push["url"] == "https://svc.internal/jobs" and push["timeout_seconds"] == 5
    assert push["secret"].startswith("qlsec_")

    shown = client.get("/types/email", headers=admin.headers).json["push"]
    # No dispatcher has delivered there yet: no concurrency figure.
    assert shown == {"url": "https://svc.internal/jobs", "timeout_seconds": 5,
                     "concurrency": None}
    listed = client.get("/types", headers=admin.headers).json["types"]
    assert shown in [t["push"] for t in listed]

    again = patch(client, admin, "email", push={"url": "https://svc.internal/v2"}).json["push"]
    assert again == {"url": "https://svc.internal/v2", "timeout_seconds": 30,
                     "concurrency": None}

    rotated = patch(client, admin, "email", push={"url": "https://svc.internal/v2",
                                                  "rotate_secret": True}).json["push"]
    assert rotated["secret"] != push["secret"]


def test_push_null_makes_a_pulled_type_again_and_forgets_the_secret(client, admin):
    secret = patch(client, admin, "pdf", push={"url": "http://10.0.0.1:8080/x"}).json[
        "push"]["secret"]
    assert patch(client, admin, "pdf", push=None).json["push"] is None
    renewed = patch(client, admin, "pdf", push={"url": "http://10.0.0.1:8080/x"}).json["push"]
    assert renewed["secret"] != secret


def test_credentials_in_a_push_url_are_never_shown_nor_logged(client, admin, caplog):
    caplog.set_level(logging.DEBUG)
    url = "https://alice:s3cr3t-pass@svc.internal/hook?token=t0k3n&x=1"
    response = patch(client, admin, "email", push={"url": url})
    got = client.get("/types/email", headers=admin.headers)
    listed = client.get("/types", headers=admin.headers)
    for answer in (response, got, listed):
        text = json.dumps(answer.json)
        assert "s3cr3t-pass" not in text and "alice" not in text and "t0k3n" not in text
    assert got.json["push"]["url"] == "https://svc.internal/hook?token=***&x=***"
    assert "s3cr3t-pass" not in caplog.text and "t0k3n" not in caplog.text


@pytest.mark.parametrize("push,field", [
    ({"url": "ftp://svc.internal/x"}, "push.url"),
    ({"url": "file:///etc/passwd"}, "push.url"),
    ({"url": "javascript:alert(1)"}, "push.url"),
    ({"url": "https://"}, "push.url"),
    ({"url": "https://svc internal/x"}, "push.url"),
    ({"url": "https://svc.internal:99999/x"}, "push.url"),
    ({"url": "https://svc.internal/x#frag"}, "push.url"),
    ({"url": "https://svc.internal/" + "a" * 2000}, "push.url"),
    ({"url": 5}, "push.url"),
    ({}, "push.url"),
    ({"url": "https://svc.internal/x", "timeout_seconds": 0}, "push.timeout_seconds"),
    ({"url": "https://svc.internal/x", "timeout_seconds": 901}, "push.timeout_seconds"),
    ({"url": "https://svc.internal/x", "timeout_seconds": "5"}, "push.timeout_seconds"),
    ({"url": "https://svc.internal/x", "rotate_secret": 1}, "push.rotate_secret"),
    ({"url": "https://svc.internal/x", "secret": "mine"}, "push.secret"),
    ("https://svc.internal/x", "push._schema"),
])
def test_bad_push_settings_are_422_naming_the_field(client, admin, push, field):
    response = patch(client, admin, "email", push=push)
    assert response.status_code == 422, response.json
    assert field in response.json["errors"], response.json
    assert client.get("/types/email", headers=admin.headers).json["push"] is None


def test_producers_and_workers_cannot_set_push(client, producer, worker):
    for key in (producer, worker):
        response = patch(client, key, "email", push={"url": "https://evil.example/x"})
        assert response.status_code == 403


def test_workers_never_claim_jobs_of_a_push_type(client, api, admin, producer, worker,
                                                 make_key):
    patch(client, admin, "email", push={"url": "https://svc.internal/x"})
    email = api.enqueue(producer, type="email").json["id"]
    pdf = api.enqueue(producer, type="pdf").json["id"]
    only_email = make_key("emailer", "worker", types=["email"])

    assert api.claim(only_email).status_code == 204
    assert api.claim(only_email, types=["email"], wait_seconds=0.2).status_code == 204
    many = client.post("/jobs/claim-many", json={"max_jobs": 10}, headers=worker.headers)
    assert [job["id"] for job in many.json["jobs"]] == [pdf]
    assert client.post("/jobs/claim-many", json={"types": ["email"]},
                       headers=worker.headers).json["jobs"] == []

    explained = Api(client).explain(admin, email)
    codes = [reason["code"] for reason in explained["reasons"]]
    assert "push_type" in codes and "no_worker_for_type" not in codes
    assert explained["claimable_now"] is True

    # Pulled again: a worker takes it.
    patch(client, admin, "email", push=None)
    assert api.claim(only_email).json["id"] == email
