"""Priority aging (docs/FLOW-CONTROL.md, "Priority aging"), on both engines: a pending job of a
type with aging_seconds is claimed as if its priority rose one level per interval it waited,
never to critical; across types the claims take the highest level reached first, then the
job that reached it first. A stream of high jobs does not starve a low one past its bound; a
type without aging claims in claim order as before; explain says where an aging job stands
and when it next rises, and its position is the order the claims then take."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.clock import MICROS, to_rfc3339
from app.core.priorities import Priority
from tests.conftest import Api, Key

AGING = 60


@pytest.fixture
def app_config(app_config: dict[str, Any]) -> dict[str, Any]:
    return {**app_config, "TYPE_COUNTS_MAX_AGE_SECONDS": 0}


@pytest.fixture
def dispatcher(make_key: Any) -> Key:
    return make_key("dispatcher", "producer", max_priority=Priority.CRITICAL)


def _age(api: Api, admin: Key, job_type: str = "email", seconds: int | None = AGING) -> Any:
    answer = api.client.patch(f"/types/{job_type}", json={"aging_seconds": seconds},
                              headers=admin.headers)
    assert answer.status_code == 200, answer.json
    return answer.json


def _enqueue(api: Api, key: Key, priority: str, job_type: str = "email") -> int:
    answer = api.enqueue(key, type=job_type, priority=priority)
    assert answer.status_code == 201, answer.json
    return int(answer.json["id"])


def _claimed(api: Api, worker: Key, count: int, **body: Any) -> list[int]:
    answer = api.client.post("/jobs/claim-many", json={"max_jobs": count, **body},
                             headers=worker.headers)
    assert answer.status_code == 200, answer.json
    return [job["id"] for job in answer.json["jobs"]]


@pytest.mark.parametrize("claim", [{}, {"types": ["email", "pdf"]}],
                         ids=["any type", "named types"])
def test_claims_take_the_level_each_job_has_reached_then_who_reached_it_first(
        api, dispatcher, worker, admin, clock, claim):
    _age(api, admin)
    low = _enqueue(api, dispatcher, "low")  # t=0: medium from t=60, high from t=120
    clock.advance(30)
    medium = _enqueue(api, dispatcher, "medium")  # t=30: virtual -30, high from t=90
    clock.advance(40)
    high = _enqueue(api, dispatcher, "high")  # t=70
    clock.advance(10)
    other = _enqueue(api, dispatcher, "high", job_type="pdf")  # t=80, pdf does not age
    clock.advance(15)
    late = _enqueue(api, dispatcher, "high", job_type="pdf")  # t=95
    clock.advance(5)
    critical = _enqueue(api, dispatcher, "critical")  # t=100: critical never waits
    # At t=100: critical; high (reached 70); pdf's high (80); medium risen to high (90);
    # pdf's later high (95); low risen to medium. Without aging the medium job would come
    # after both of pdf's.
    assert _claimed(api, worker, 6, **claim) == [critical, high, other, medium, late, low]


def test_a_medium_job_risen_to_high_goes_before_a_later_high_one(api, dispatcher, worker,
                                                                 admin, clock):
    _age(api, admin)
    medium = _enqueue(api, dispatcher, "medium")  # t=0: high from t=60
    clock.advance(61)
    high = _enqueue(api, dispatcher, "high", job_type="pdf")  # t=61
    assert _claimed(api, worker, 2) == [medium, high]
    _age(api, admin, seconds=None)  # off: claim order again
    medium = _enqueue(api, dispatcher, "medium")
    clock.advance(61)
    high = _enqueue(api, dispatcher, "high", job_type="pdf")
    assert _claimed(api, worker, 2) == [high, medium]


@pytest.mark.parametrize("aging", [True, False], ids=["aging", "no aging"])
def test_a_stream_of_high_jobs_does_not_starve_a_low_job_past_its_bound(
        api, dispatcher, worker, admin, clock, aging):
    """Three high jobs arrive every 10 s and two are claimed: the backlog of high jobs never
    empties. With aging the low job rises to high after 2 intervals and is claimed once the
    high jobs enqueued before that moment are; without, it waits for ever."""
    if aging:
        _age(api, admin)
    bound = clock.now_us() + 2 * AGING * MICROS  # when it reaches high
    low = _enqueue(api, dispatcher, "low")
    claimed_at = None
    highs: dict[int, int] = {}  # id -> created_at
    for _ in range(60):  # 10 minutes
        clock.advance(10)
        for _ in range(3):
            highs[_enqueue(api, dispatcher, "high")] = clock.now_us()
        taken = _claimed(api, worker, 2)
        assert len(taken) == 2
        if low in taken:
            claimed_at = clock.now_us()
            before = taken[:taken.index(low)]
            break
        if aging:  # no high job made after the low one reached high is claimed before it
            assert all(highs[job_id] <= bound for job_id in taken)
    if not aging:
        assert claimed_at is None
        return
    assert claimed_at is not None
    assert all(highs[job_id] <= bound for job_id in before)
    # Every high job enqueued before it reached high was claimed before it (one enqueued at
    # that very moment goes after it: the lower id).
    pending_older = [job_id for job_id, created in highs.items()
                     if created < bound and api.get(admin, job_id).json["status"] == "pending"]
    assert pending_older == []


def test_explain_says_the_priority_reached_when_it_next_rises_and_the_place_in_the_aged_order(
        api, dispatcher, worker, admin, clock):
    _age(api, admin)
    start = clock.now_us()
    ids = []
    for priority in ["low", "high", "medium", "low", "critical", "high", "medium", "low"]:
        ids.append(_enqueue(api, dispatcher, priority))
        clock.advance(25)
    _enqueue(api, dispatcher, "high", job_type="pdf")  # another type: not in its line
    clock.advance(50)  # t=250: the first low has risen to high, the first medium too
    first_low = api.explain(admin, ids[0])
    assert first_low["aging"] == {"priority_now": "high", "next_rise_at": None}
    last_low = api.explain(admin, ids[7])  # made at t=175: medium from t=235, high from 295
    assert last_low["aging"] == {"priority_now": "medium",
                                 "next_rise_at": to_rfc3339(start + 295 * MICROS)}
    assert api.explain(admin, ids[4])["aging"] == {"priority_now": "critical",
                                                   "next_rise_at": None}
    positions = {job_id: api.explain(admin, job_id)["position"] for job_id in ids}
    assert sorted(positions.values()) == list(range(len(ids)))
    claimed = _claimed(api, worker, len(ids), types=["email"])
    assert [positions[job_id] for job_id in claimed] == list(range(len(ids)))
    _age(api, admin, seconds=None)
    assert api.explain(admin, ids[0])["aging"] is None


def test_aging_is_set_shown_and_refused_where_it_cannot_apply(api, admin, producer):
    shown = _age(api, admin)
    assert shown["aging_seconds"] == AGING
    assert api.client.get("/types/pdf", headers=admin.headers).json["aging_seconds"] is None
    for wrong in (59, 86_401, 0, -1, 1.5, "60", "\uff16\uff10", True, 10**30, [60],
                  {"seconds": 60}, "NaN"):
        answer = api.client.patch("/types/email", json={"aging_seconds": wrong},
                                  headers=admin.headers)
        assert answer.status_code == 422, wrong
        assert answer.json["errors"]["aging_seconds"]
    fair = api.client.patch("/types/email", json={"fairness": "key"}, headers=admin.headers)
    assert fair.status_code == 422
    assert "aging" in fair.json["detail"]
    assert api.client.get("/types/email", headers=admin.headers).json["fairness"] is None
    assert _age(api, admin, seconds=None)["aging_seconds"] is None
    assert api.client.patch("/types/email", json={"fairness": "key"},
                            headers=admin.headers).status_code == 200
    refused = api.client.patch("/types/email", json={"aging_seconds": AGING},
                               headers=admin.headers)
    assert refused.status_code == 422
    answer = api.client.patch("/types/email", json={"aging_seconds": 120},
                              headers=producer.headers)
    assert answer.status_code == 403
