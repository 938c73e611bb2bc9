"""The wall clock stepped back or forward (issue 36), with the tests' ManualClock moved as an
operator's `date -s` or a bad NTP server would move the host's: rate limits keep admitting
about their rate, leases and backoff keep their meaning, fencing refuses a stale holder."""

from __future__ import annotations

from typing import Any

from app.core.clock import MICROS
from app.types.models import CLOCK_STEP_TOLERANCE_US, TypeSettings
from tests.conftest import Api, Key

STEP_SECONDS = 300  # minutes, as the issue asks; far beyond the tolerance


def rated(client: Any, admin: Key, job_type: str, rate: float, burst: int) -> None:
    response = client.patch(f"/types/{job_type}", json={"rate_per_second": rate,
                                                        "burst": burst}, headers=admin.headers)
    assert response.status_code == 200, response.json


def claims(api: Api, worker: Key, n: int) -> int:
    """How many of `n` single claims took a job."""
    return sum(api.claim(worker, types=["email"]).status_code == 200 for _ in range(n))


# -- the bucket's arithmetic ------------------------------------------------------------------

def test_a_bucket_stamped_minutes_ahead_counts_full_at_now() -> None:
    now = 1_800_000_000 * MICROS
    spent = TypeSettings(type="email", rate_per_second=2.0, burst=3, tokens=0.0,
                         tokens_at=now + STEP_SECONDS * MICROS)

    assert spent.clock_stepped_back(now)
    assert spent.tokens_available(now) == 3.0
    assert spent.bucket_at(now) == now
    assert spent.next_token_at(now) is None


def test_a_bucket_stamped_a_little_ahead_waits_for_its_own_time() -> None:
    now = 1_800_000_000 * MICROS
    ahead = now + CLOCK_STEP_TOLERANCE_US  # another host's stamp, or a claim's lock wait
    spent = TypeSettings(type="email", rate_per_second=2.0, burst=3, tokens=0.0,
                         tokens_at=ahead)

    assert not spent.clock_stepped_back(now)
    assert spent.tokens_available(now) == 0.0
    assert spent.bucket_at(now) == ahead
    assert spent.next_token_at(now) == ahead + MICROS // 2


def test_a_new_rate_after_a_step_back_stamps_the_bucket_at_now() -> None:
    now = 1_800_000_000 * MICROS
    spent = TypeSettings(type="email", rate_per_second=2.0, burst=3, tokens=0.0,
                         tokens_at=now + STEP_SECONDS * MICROS)

    changed = spent.changed(now, {"rate_per_second": 4.0})

    assert (changed.tokens, changed.tokens_at) == (3.0, now)


# -- through the API, on both engines ----------------------------------------------------------

def test_a_rated_type_keeps_admitting_after_the_clock_steps_back(client, api, producer, worker,
                                                                 admin, clock):
    rated(client, admin, "email", rate=1.0, burst=2)
    for _ in range(3):
        api.enqueue(producer, type="email")
    assert claims(api, worker, 3) == 2  # the burst, then the bucket is empty

    clock.advance(-STEP_SECONDS)
    # Enqueued after the step: the job left from before is due at its own run_at, which is
    # now five minutes ahead (see test_a_step_back_holds_back_the_jobs_enqueued_before_it).
    for _ in range(10):
        api.enqueue(producer, type="email")

    # Before the fix the bucket, stamped five minutes ahead, refilled nothing until the clock
    # caught up: no claim for five minutes. Now it counts full once, then holds the rate.
    assert claims(api, worker, 3) == 2
    clock.advance(1)
    assert claims(api, worker, 3) == 1
    clock.advance(2)
    assert claims(api, worker, 3) == 2


def test_a_step_back_within_the_tolerance_waits_no_longer_than_the_step(client, api, producer,
                                                                       worker, admin, clock):
    rated(client, admin, "email", rate=1.0, burst=1)
    api.enqueue(producer, type="email")
    assert claims(api, worker, 2) == 1
    step = CLOCK_STEP_TOLERANCE_US / MICROS - 1

    clock.advance(-step)
    for _ in range(2):
        api.enqueue(producer, type="email")
    assert claims(api, worker, 1) == 0
    clock.advance(step)  # back where the bucket was stamped: no token yet
    assert claims(api, worker, 1) == 0
    clock.advance(1)
    assert claims(api, worker, 2) == 1


def test_a_lease_claimed_before_a_step_back_is_not_cut_short(api, producer, make_key, admin,
                                                             clock):
    holder = make_key("holder", "worker")
    other = make_key("other", "worker")
    job_id = api.enqueue(producer).json["id"]
    token = api.claim(holder, lease_seconds=30).json["lease_token"]

    clock.advance(-STEP_SECONDS)
    clock.advance(29)  # 29 s of the lease's 30 have passed, on a clock that stepped back

    # Expiries are instants of the wall clock: a step back lengthens every lease by the step
    # (a dead holder's job is rescued that much later), and never shortens one.
    assert api.claim(other).status_code == 204  # nothing to rescue
    assert api.heartbeat(holder, job_id, lease_token=token).status_code == 200
    assert api.complete(holder, job_id, lease_token=token).status_code == 200
    job = api.get(admin, job_id).json
    assert (job["status"], job["worker_id"], job["retry_count"]) == ("completed", "holder", 0)


def test_a_step_forward_past_a_lease_fences_the_silent_holder(api, producer, make_key, admin,
                                                              clock):
    holder = make_key("holder", "worker")
    other = make_key("other", "worker")
    job_id = api.enqueue(producer, max_retries=3).json["id"]
    stale = api.claim(holder, lease_seconds=30).json["lease_token"]

    # Minutes pass in a moment: to the service the holder has been silent past its lease.
    clock.advance(STEP_SECONDS)
    rescued = api.claim(other)
    assert rescued.status_code == 200 and rescued.json["id"] == job_id

    assert api.complete(holder, job_id, lease_token=stale).status_code == 409
    assert api.complete(other, job_id, lease_token=rescued.json["lease_token"]).status_code == 200
    job = api.get(admin, job_id).json
    assert (job["status"], job["worker_id"], job["retry_count"]) == ("completed", "other", 1)


def test_backoff_after_a_step_back_still_retries(api, producer, worker, clock):
    job_id = api.enqueue(producer, max_retries=2).json["id"]
    token = api.claim(worker).json["lease_token"]
    clock.advance(-STEP_SECONDS)

    # The default backoff: 1 s x 2^0, drawn from its upper half, counted from the new now.
    assert api.fail(worker, job_id, lease_token=token, error="boom").status_code == 200
    assert api.claim(worker).status_code == 204
    clock.advance(1)
    retried = api.claim(worker)
    assert retried.status_code == 200 and retried.json["id"] == job_id
    assert retried.json["retry_count"] == 1


def test_a_step_forward_brings_a_backoff_due_at_once(api, producer, worker, clock):
    job_id = api.enqueue(producer, max_retries=2).json["id"]
    token = api.claim(worker).json["lease_token"]
    assert api.fail(worker, job_id, lease_token=token, error="boom",
                    retry_in_seconds=60).status_code == 200

    clock.advance(STEP_SECONDS)
    retried = api.claim(worker)
    assert retried.status_code == 200 and retried.json["id"] == job_id


def test_a_step_back_holds_back_the_jobs_enqueued_before_it(api, producer, worker, clock):
    # Known and documented (docs/OPERATIONS.md): a job is due at its run_at, an instant of
    # the wall clock, which is its enqueue time unless delayed. Jobs enqueued in the span a
    # step back repeats are due again only when the clock gets there; the jobs enqueued
    # after the step are claimed meanwhile.
    before = api.enqueue(producer).json["id"]
    clock.advance(-STEP_SECONDS)
    after = api.enqueue(producer).json["id"]

    assert api.claim(worker).json["id"] == after
    assert api.complete(worker, after).status_code == 200
    assert api.claim(worker).status_code == 204
    clock.advance(STEP_SECONDS)
    assert api.claim(worker).json["id"] == before
