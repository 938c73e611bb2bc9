"""Where a claimable job stands in line (docs/JOBS.md, "Position and estimate"), on both
engines: the position explain gives each job is the order the claims then take them in,
under priorities and under fair share, and the estimate follows the type's recent claims."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.priorities import Priority
from app.history.line import estimate_seconds
from app.types.models import TypeSettings
from tests.conftest import Api, Key


@pytest.fixture
def app_config(app_config: dict[str, Any]) -> dict[str, Any]:
    return {**app_config, "TYPE_COUNTS_MAX_AGE_SECONDS": 0}


def _positions(api: Api, admin: Key, ids: list[int]) -> dict[int, int]:
    places = {}
    for job_id in ids:
        explained = api.explain(admin, job_id)
        assert explained["position_capped"] is False
        places[job_id] = explained["position"]
    return places


def test_each_jobs_position_is_the_order_the_claims_take_them_in(api, make_key, worker, admin,
                                                                  clock):
    producer = make_key("dispatcher-of-all", "producer", max_priority=Priority.CRITICAL)
    priorities = ["low", "high", "medium", "low", "critical", "medium", "high", "low"]
    ids = [api.enqueue(producer, priority=priority).json["id"] for priority in priorities]
    api.enqueue(producer, type="pdf", priority="critical")  # another type: not in its line
    api.enqueue(producer, delay_seconds=60, priority="critical")  # not due: not in line
    clock.advance(1)
    positions = _positions(api, admin, ids)
    assert sorted(positions.values()) == list(range(len(ids)))

    claimed = [api.claim(worker, types=["email"]).json["id"] for _ in ids]
    assert [positions[job_id] for job_id in claimed] == list(range(len(ids)))


def test_a_fair_types_position_follows_its_rounds(api, producer, worker, admin, make_key,
                                                  clock):
    api.client.patch("/types/email", json={"fairness": "key"}, headers=admin.headers)
    other = make_key("producer-2", "producer")
    ids = [api.enqueue(producer, concurrency_key="tenant-a").json["id"] for _ in range(4)]
    ids += [api.enqueue(other, concurrency_key="tenant-b").json["id"] for _ in range(2)]
    ids += [api.enqueue(producer, concurrency_key="tenant-c").json["id"]]
    clock.advance(1)
    positions = _positions(api, admin, ids)
    claimed = [api.claim(worker, types=["email"]).json["id"] for _ in ids]
    assert [positions[job_id] for job_id in claimed] == list(range(len(ids)))
    assert claimed[:3] != ids[:3]  # the rounds, not the enqueue order


def test_only_a_claimable_job_has_a_place(api, producer, worker, admin, clock):
    scheduled = api.enqueue(producer, delay_seconds=60).json["id"]
    running = api.enqueue(producer).json["id"]
    assert api.claim(worker).json["id"] == running
    for job_id in (scheduled, running):
        explained = api.explain(admin, job_id)
        assert explained["position"] is None and explained["estimated_start_seconds"] is None


def test_the_estimate_is_the_jobs_ahead_at_the_types_recent_claim_rate(
        app, api, producer, worker, admin, clock):
    for _ in range(30):
        api.enqueue(producer)
    assert api.explain(admin, 1)["estimated_start_seconds"] is None  # nothing claimed lately
    for _ in range(10):  # 10 claims in one minute: 1/6 claims a second over the window
        job = api.claim(worker).json
        api.complete(worker, job["id"])
        clock.advance(6)
    app.extensions["queuelog"].stats_flusher.flush()
    last = api.explain(admin, 30)
    window = 4 * 60 + (clock.now_us() % 60_000_000) / 1e6
    assert last["position"] == 19
    assert last["estimated_start_seconds"] == pytest.approx(19 / (10 / window), rel=1e-3)
    api.client.patch("/types/email", json={"paused": True}, headers=admin.headers)
    assert api.explain(admin, 30)["estimated_start_seconds"] is None


def test_an_estimate_is_never_faster_than_the_types_rate_limit():
    limited = TypeSettings(type="email", rate_per_second=0.5)
    assert estimate_seconds(10, claimed=600, window_seconds=60, settings=limited) == 20.0
    assert estimate_seconds(10, claimed=600, window_seconds=60, settings=None) == 1.0
    assert estimate_seconds(0, claimed=600, window_seconds=60, settings=None) == 0.0
    assert estimate_seconds(10, claimed=0, window_seconds=60, settings=None) is None
    opened = TypeSettings(type="email", circuit='{"failure_ratio":0.5,"min_attempts":1,'
                          '"window_seconds":60,"cooldown_seconds":30}', circuit_state="open",
                          circuit_since=1)
    assert estimate_seconds(10, claimed=600, window_seconds=60, settings=opened) is None


def test_a_jobs_page_says_its_place_in_line(app, api, producer, worker, admin, client, clock):
    from tests.ui.conftest import sign_in

    ids = [api.enqueue(producer).json["id"] for _ in range(3)]
    for _ in range(2):
        api.complete(worker, api.claim(worker).json["id"])
        clock.advance(30)
    app.extensions["queuelog"].stats_flusher.flush()
    sign_in(client, admin)
    page = client.get(f"/ui/jobs/{ids[2]}").text
    assert '<span id="place">Next in its type' in page
    assert "to its start at the type's recent pace." in page
    api.enqueue(producer)
    later = client.get(f"/ui/jobs/{ids[2] + 1}").text
    assert "1 claimable job(s) of its type ahead; about" in later
