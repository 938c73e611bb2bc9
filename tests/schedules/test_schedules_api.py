"""/schedules through the test client, on both engines: who may, what is refused and why."""

from __future__ import annotations

from typing import Any

import pytest

from tests.schedules.conftest import Schedules


def test_create_answers_201_with_location_and_the_next_slot(schedules: Schedules) -> None:
    response = schedules.create(cron="0 3 * * *", timezone="Europe/Berlin")
    assert response.status_code == 201
    assert response.headers["Location"] == "/schedules/nightly"
    body = response.get_json()
    # The test clock stands at 2027-01-15T08:00Z; 03:00 in Berlin (CET) is 02:00Z.
    assert body["next_run_at"] == "2027-01-16T02:00:00.000000Z"
    assert body["catch_up"] == "latest" and body["paused"] is False
    assert body["job"] == {"type": "email", "payload": {"to": "ops"}, "max_retries": 3}
    assert body["last_run_at"] is None and body["last_job_id"] is None
    assert schedules.get("nightly").get_json() == body
    listed = schedules.client.get("/schedules", headers=schedules.admin.headers).get_json()
    assert listed == {"schedules": [body], "next_cursor": None}


def test_timezone_defaults_to_utc_and_macros_are_accepted(schedules: Schedules) -> None:
    body = schedules.create(cron="@hourly").get_json()
    assert body["timezone"] == "UTC"
    assert body["cron"] == "0 * * * *"
    assert body["next_run_at"] == "2027-01-15T09:00:00.000000Z"


def test_a_taken_name_is_409(schedules: Schedules) -> None:
    assert schedules.create(cron="@daily").status_code == 201
    response = schedules.create(cron="@hourly")
    assert response.status_code == 409
    assert "nightly" in response.get_json()["detail"]


@pytest.mark.parametrize(("cron", "message"), [
    ("61 * * * *", "minute field: 61 is out of range 0-59"),
    ("0 24 * * *", "hour field: 24 is out of range 0-23"),
    ("0 3 32 * *", "day-of-month field: 32 is out of range 1-31"),
    ("0 3 * 13 *", "month field: 13 is out of range 1-12"),
    ("0 3 * * funday", "day-of-week field: 'funday' is not a number in 0-7"),
    ("*/0 * * * *", "minute field: step '0' must be a whole number of at least 1"),
    ("0 3 * *", "expected 5 fields"),
    ("* * * * * *", "expected 5 fields"),
    ("@sometimes", "unknown macro '@sometimes'"),
])
def test_a_bad_cron_expression_is_422_naming_the_wrong_part(schedules: Schedules, cron: str,
                                                            message: str) -> None:
    response = schedules.create(cron=cron)
    assert response.status_code == 422
    problem = response.get_json()
    assert message in problem["errors"]["cron"][0]
    assert problem["detail"].startswith("cron: ")


def test_an_unknown_time_zone_is_422_on_timezone(schedules: Schedules) -> None:
    for zone in ("Mars/Olympus_Mons", "../etc/passwd", "Europe/Berlin "):
        response = schedules.create(cron="@daily", timezone=zone)
        assert response.status_code == 422, zone
        assert "unknown time zone" in response.get_json()["errors"]["timezone"][0]


@pytest.mark.parametrize(("job", "field"), [
    ({"type": "fax"}, "job.type"),  # not a configured type
    ({"type": "email", "run_at": "2027-01-01T00:00:00Z"}, "job.run_at"),
    ({"type": "email", "delay_seconds": 5}, "job.delay_seconds"),
    ({"type": "email", "idempotency_key": "k"}, "job.idempotency_key"),
    ({"type": "email", "priority": "urgent"}, "job.priority"),
    ({"payload": {}}, "job.type"),
])
def test_the_job_template_follows_the_rules_of_post_jobs(schedules: Schedules,
                                                        job: dict[str, Any], field: str) -> None:
    response = schedules.create(cron="@daily", job=job)
    assert response.status_code == 422
    assert field in response.get_json()["errors"]


def test_a_name_outside_the_alphabet_is_422(schedules: Schedules) -> None:
    for name in ("", "a b", "x" * 101, "nächtlich", "a/b"):
        assert schedules.create(name=name, cron="@daily").status_code == 422, name


def test_producers_and_workers_are_403_everywhere(schedules: Schedules, producer: Any,
                                                  worker: Any) -> None:
    assert schedules.create(cron="@daily").status_code == 201
    for key in (producer, worker):
        client, headers = schedules.client, key.headers
        assert schedules.create(key, name="theirs", cron="@daily").status_code == 403
        assert client.get("/schedules", headers=headers).status_code == 403
        assert client.get("/schedules/nightly", headers=headers).status_code == 403
        assert client.patch("/schedules/nightly", json={"paused": True},
                            headers=headers).status_code == 403
        assert client.delete("/schedules/nightly", headers=headers).status_code == 403
    assert schedules.client.get("/schedules").status_code == 401


def test_patch_edits_and_recomputes_the_next_slot_from_now(schedules: Schedules) -> None:
    schedules.create(cron="0 3 * * *")
    response = schedules.patch("nightly", cron="30 9 * * *", timezone="America/New_York",
                               catch_up="all", job={"type": "pdf", "priority": "high"})
    assert response.status_code == 200
    body = response.get_json()
    assert body["next_run_at"] == "2027-01-15T14:30:00.000000Z"  # 09:30 EST
    assert body["catch_up"] == "all"
    assert body["job"] == {"type": "pdf", "payload": {}, "priority": "high", "max_retries": 3}
    assert schedules.patch("nightly", cron="99 * * * *").status_code == 422
    assert schedules.patch("nightly", paused=None).status_code == 422
    assert schedules.patch("nobody", paused=True).status_code == 404


def test_delete_is_204_then_404(schedules: Schedules) -> None:
    schedules.create(cron="@daily")
    headers = schedules.admin.headers
    assert schedules.client.delete("/schedules/nightly", headers=headers).status_code == 204
    assert schedules.client.delete("/schedules/nightly", headers=headers).status_code == 404
    assert schedules.get("nightly").status_code == 404
    assert schedules.get("no\x00pe").status_code == 404


def test_routes_take_no_query_parameters(schedules: Schedules) -> None:
    # Only the listing pages (limit and cursor, tests/schedules/test_scale.py).
    response = schedules.client.get("/schedules?wait=5", headers=schedules.admin.headers)
    assert response.status_code == 422


def test_a_patch_without_fields_is_422(schedules: Schedules) -> None:
    schedules.create(cron="@daily")
    assert schedules.patch("nightly").status_code == 422
    empty = schedules.client.patch("/schedules/nightly", headers=schedules.admin.headers)
    assert empty.status_code == 422
