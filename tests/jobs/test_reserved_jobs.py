"""Reserved jobs (contract §18) through the API on both engines: reserve, confirm, release, the
first answer wins, the deadline's release by the ticker's chore, and the refusals."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tests.conftest import Api, Key


@pytest.fixture
def app_config(app_config: dict[str, Any]) -> dict[str, Any]:
    return {**app_config, "CHECK_URL_ORIGINS": "https://shop.example/queuelog/",
            "TYPE_COUNTS_MAX_AGE_SECONDS": 0}


def reserve(api: Api, key: Key, seconds: int = 60, **body: Any) -> Any:
    return api.enqueue(key, reserve={"confirm_within_seconds": seconds, **body.pop("check", {})},
                       **body)


def post(client: Any, key: Key, job_id: int, action: str) -> Any:
    return client.post(f"/jobs/{job_id}/{action}", headers=key.headers)


def events(client: Any, key: Key, job_id: int) -> list[tuple[str, str, Any]]:
    shown = client.get(f"/jobs/{job_id}/events", headers=key.headers).json["events"]
    return [(e["event"], e["actor"], e["detail"]) for e in shown]


def type_counts(client: Any, admin: Key) -> dict[str, int]:
    counts: dict[str, int] = client.get("/types/email", headers=admin.headers).json["counts"]
    return counts


def test_a_reserved_job_is_never_claimed_until_confirmed(api, client, producer, worker,
                                                         admin):
    made = reserve(api, producer)
    assert made.status_code == 201, made.json
    job_id = made.json["id"]
    assert made.json["status"] == "reserved"
    assert api.claim(worker).status_code == 204
    assert type_counts(client, admin)["reserved"] == 1

    confirmed = post(client, producer, job_id, "confirm")

    assert (confirmed.status_code, confirmed.json["status"]) == (200, "pending")
    assert type_counts(client, admin)["reserved"] == 0
    assert api.claim(worker).json["id"] == job_id
    assert events(client, admin, job_id)[:2] == [
        ("enqueued", "producer-1", None), ("confirmed", "producer-1", {"by": "producer"})]


def test_release_cancels_a_reserved_job_and_repeats_answer_the_same(api, client, producer,
                                                                    worker, admin):
    job_id = reserve(api, producer).json["id"]

    released = post(client, producer, job_id, "release")

    assert (released.status_code, released.json["status"]) == (200, "cancelled")
    assert post(client, producer, job_id, "release").status_code == 200  # a repeat
    refused = post(client, producer, job_id, "confirm")
    assert refused.status_code == 409
    assert refused.content_type == "application/problem+json"
    assert api.claim(worker).status_code == 204
    assert [e[0] for e in events(client, admin, job_id)] == ["enqueued", "released"]


def test_a_confirm_repeated_is_200_and_a_late_release_409(api, client, producer, worker):
    job_id = reserve(api, producer).json["id"]
    assert post(client, producer, job_id, "confirm").status_code == 200
    again = post(client, producer, job_id, "confirm")
    assert (again.status_code, again.json["status"]) == (200, "pending")
    assert post(client, producer, job_id, "release").status_code == 409
    # Still a repeat after the job moved on.
    api.claim(worker)
    assert post(client, producer, job_id, "confirm").status_code == 200


def test_confirm_or_release_of_a_job_never_reserved_is_409(api, client, producer):
    job_id = api.enqueue(producer).json["id"]
    assert post(client, producer, job_id, "confirm").status_code == 409
    assert post(client, producer, job_id, "release").status_code == 409


def test_only_the_producer_or_an_admin_answers_a_reservation(api, client, producer, worker,
                                                            admin, make_key):
    job_id = reserve(api, producer).json["id"]
    other = make_key("producer-2", "producer")
    assert post(client, other, job_id, "confirm").status_code == 404
    assert post(client, worker, job_id, "confirm").status_code == 403
    assert post(client, admin, job_id, "release").json["status"] == "cancelled"


def test_a_cancel_of_a_reserved_job_releases_it(api, client, producer, admin):
    job_id = reserve(api, producer).json["id"]
    cancelled = api.cancel(producer, job_id)
    assert (cancelled.status_code, cancelled.json["status"]) == (200, "cancelled")
    assert events(client, admin, job_id)[-1] == ("released", "producer-1", {"by": "cancel"})


def test_confirm_and_release_racing_apply_one_and_answer_the_other_409(app, api, client,
                                                                        producer):
    for _ in range(5):
        job_id = reserve(api, producer).json["id"]
        barrier = threading.Barrier(2)
        answers: dict[str, int] = {}

        def answer(action: str, job_id: int = job_id, barrier: threading.Barrier = barrier,
                   answers: dict[str, int] = answers) -> None:
            own = app.test_client()
            barrier.wait()
            answers[action] = own.post(f"/jobs/{job_id}/{action}",
                                       headers=producer.headers).status_code

        threads = [threading.Thread(target=answer, args=(action,))
                   for action in ("confirm", "release")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(answers.values()) == [200, 409], answers
        status = api.get(producer, job_id).json["status"]
        assert status == ("pending" if answers["confirm"] == 200 else "cancelled")


def test_a_reservation_left_unanswered_without_a_check_is_released_at_its_deadline(
        app, api, client, producer, admin, clock):
    job_id = reserve(api, producer, seconds=30).json["id"]
    reservations = app.extensions["queuelog"].jobs.reservations
    clock.advance(29)
    assert api.get(admin, job_id).json["status"] == "reserved"
    clock.advance(1)  # maintenance, which moving the clock runs, releases it
    assert reservations.release_overdue() == 0  # nothing left to release
    assert api.get(admin, job_id).json["status"] == "cancelled"
    assert events(client, admin, job_id)[-1] == ("released", "queuelog", {"by": "deadline"})
    # Its producer's late answer: the same outcome is 200, the other 409.
    assert post(client, producer, job_id, "release").status_code == 200
    assert post(client, producer, job_id, "confirm").status_code == 409


def test_a_reservation_with_a_check_is_left_to_the_check_then_released_after_a_day(
        app, api, producer, admin, clock):
    check = {"check_url": "https://shop.example/queuelog/check"}
    job_id = reserve(api, producer, seconds=30, check=check).json["id"]
    reservations = app.extensions["queuelog"].jobs.reservations
    clock.advance(31)
    assert reservations.release_overdue() == 0
    [due] = reservations.due_checks(10)
    assert (due.reservation.job_id, due.reservation.check_url) == (job_id, check["check_url"])
    clock.advance(24 * 3600)  # maintenance, which moving the clock runs, releases it
    assert reservations.release_overdue() == 0  # nothing left to release
    assert api.get(admin, job_id).json["status"] == "cancelled"


def test_a_confirmed_job_of_an_ordered_key_waits_for_its_turn(client, api, producer, admin,
                                                             worker):
    client.patch("/types/email", json={"ordering": "key"}, headers=admin.headers)
    first = api.enqueue(producer, concurrency_key="acct").json["id"]
    reserved = reserve(api, producer, concurrency_key="acct").json["id"]
    assert post(client, producer, reserved, "confirm").json["status"] == "waiting"
    assert api.claim(worker).json["id"] == first


@pytest.mark.parametrize("body,field", [
    ({"reserve": {}}, "reserve.confirm_within_seconds"),
    ({"reserve": {"confirm_within_seconds": 0}}, "reserve.confirm_within_seconds"),
    ({"reserve": {"confirm_within_seconds": 86_401}}, "reserve.confirm_within_seconds"),
    ({"reserve": {"confirm_within_seconds": 60, "check_url": "ftp://shop.example/x"}},
     "reserve.check_url"),
    ({"reserve": {"confirm_within_seconds": 60,
                  "check_url": "https://shop.example.evil/queuelog/check"}},
     "reserve.check_url"),
    ({"reserve": {"confirm_within_seconds": 60,
                  "check_url": "https://shop.example/elsewhere"}}, "reserve.check_url"),
    ({"reserve": {"confirm_within_seconds": 60}, "unique": {"key": "k"}}, "reserve"),
    ({"reserve": {"confirm_within_seconds": 60}, "depends_on": [1]}, "reserve"),
    ({"reserve": {"confirm_within_seconds": 60, "extra": 1}}, "reserve.extra"),
])
def test_bad_reserves_are_422s_naming_the_field(api, producer, admin, body, field):
    if "depends_on" in body:
        api.enqueue(producer)
    refused = api.enqueue(producer, **body)
    assert refused.status_code == 422, refused.json
    assert field in refused.json["errors"], refused.json
    assert [job["status"] for job in api.list(admin).json["jobs"]] in ([], ["pending"])


@pytest.mark.parametrize("path", [
    "%2e%2e/metrics", "%2E./metrics", ".%2e/metrics", "..%2fmetrics", "..%2Fmetrics",
    "a%2f..%2f..%2fmetrics", "..%5cmetrics", "..\\metrics", "%252e%252e/metrics", "..;/metrics",
    "%2e/check",
])
def test_a_check_url_hiding_a_step_out_of_its_prefix_is_a_422(api, producer, admin, path):
    """A dot segment or a slash that only the receiver's decoding reveals would pass the
    operator's prefix and reach another path of the host: refused as a literal `..` is."""
    refused = reserve(api, producer, check={
        "check_url": "https://shop.example/queuelog/" + path})

    assert refused.status_code == 422, refused.json
    assert list(refused.json["errors"]) == ["reserve.check_url"]
    assert "in disguise" in refused.json["detail"]
    assert api.list(admin).json["jobs"] == []


def test_a_check_urls_plain_dot_segments_are_resolved_within_the_prefix(api, producer):
    within = reserve(api, producer, check={
        "check_url": "https://shop.example/queuelog/v1/../check?shop=%2e%2e%2f"})
    out = reserve(api, producer, check={"check_url": "https://shop.example/queuelog/../metrics"})

    assert within.status_code == 201, within.json
    assert out.status_code == 422 and list(out.json["errors"]) == ["reserve.check_url"]


def test_a_reserve_replays_with_its_idempotency_key(api, producer):
    headers = {"Idempotency-Key": "order-1001"}
    first = reserve(api, producer, headers=headers)
    again = reserve(api, producer, headers=headers)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json["id"] == first.json["id"] and again.json["status"] == "reserved"
    assert again.headers["Idempotent-Replayed"] == "true"
    other = reserve(api, producer, seconds=61, headers=headers)
    assert other.status_code == 422  # the same key, another request


def test_a_batch_or_a_workflow_takes_no_reserve(client, producer):
    batch = client.post("/jobs/batch", json={"jobs": [
        {"type": "email", "reserve": {"confirm_within_seconds": 60}}]},
        headers=producer.headers)
    assert batch.status_code == 422 and "jobs.0.reserve" in batch.json["errors"]


def test_explain_says_a_reserved_job_waits_for_its_producer(api, client, producer, admin):
    job_id = reserve(api, producer).json["id"]
    shown = api.explain(admin, job_id)
    assert (shown["claimable_now"], [r["code"] for r in shown["reasons"]]) == (
        False, ["reserved"])
