"""Leases, heartbeats, fencing, rescue of expired leases, delays and backoff (section 3)."""

from __future__ import annotations

import threading
import time

import pytest

from app import create_app, start_maintenance, stop_maintenance
from app.core.callers import Role
from app.core.clock import to_rfc3339
from tests.conftest import Api, Key


def test_claim_sets_a_lease_of_the_configured_default(api, producer, worker, clock):
    api.enqueue(producer)
    claimed = api.claim(worker).json
    assert claimed["lease_expires_at"] == to_rfc3339(clock.now_us() + 300_000_000)


def test_heartbeat_extends_the_lease_from_now(api, producer, worker, clock):
    job_id = api.enqueue(producer).json["id"]
    token = api.claim(worker, lease_seconds=30).json["lease_token"]
    clock.advance(20)
    beat = api.heartbeat(worker, job_id, lease_token=token, lease_seconds=45)
    assert beat.status_code == 200
    assert beat.json["lease_expires_at"] == to_rfc3339(clock.now_us() + 45_000_000)
    clock.advance(40)  # past the first lease, within the extended one
    assert api.complete(worker, job_id, lease_token=token).status_code == 200


def test_heartbeat_after_the_lease_expired_is_409_and_the_job_is_rescued(api, producer,
                                                                          worker, admin, clock):
    job_id = api.enqueue(producer).json["id"]
    api.claim(worker, lease_seconds=10)
    clock.advance(10)
    assert api.heartbeat(worker, job_id).status_code == 409
    assert api.complete(worker, job_id).status_code == 409
    assert api.fail(worker, job_id).status_code == 409
    assert api.get(admin, job_id).json["status"] == "pending"  # rescued by maintenance


def test_next_claim_rescues_an_expired_lease_as_a_failed_attempt(api, producer, make_key,
                                                                  admin, clock):
    dead = make_key("dead-worker", "worker")
    alive = make_key("alive-worker", "worker")
    job_id = api.enqueue(producer, max_retries=2).json["id"]
    api.claim(dead, lease_seconds=5)
    clock.advance(6)

    claimed = api.claim(alive)  # rescues, then claims the same job at once (no backoff)

    assert claimed.status_code == 200
    assert claimed.json["id"] == job_id
    assert claimed.json["retry_count"] == 1
    assert claimed.json["worker_id"] == "alive-worker"
    assert api.get(admin, job_id).json["error"] == "lease expired"


def test_expired_lease_with_no_retries_left_ends_failed(api, producer, worker, admin, clock):
    job_id = api.enqueue(producer, max_retries=0).json["id"]
    api.claim(worker, lease_seconds=5)
    clock.advance(5)
    assert api.claim(worker).status_code == 204
    job = api.get(admin, job_id).json
    assert (job["status"], job["retry_count"], job["error"]) == ("failed", 0, "lease expired")
    assert job["worker_id"] == "worker-1" and job["lease_expires_at"] is None


def test_a_job_whose_worker_vanished_is_completed_exactly_once_by_another(api, producer,
                                                                          make_key, admin, clock):
    vanished = make_key("vanished", "worker")
    other = make_key("other", "worker")
    job_id = api.enqueue(producer).json["id"]
    old_token = api.claim(vanished, lease_seconds=30).json["lease_token"]
    clock.advance(31)
    new_token = api.claim(other).json["lease_token"]

    done = api.complete(other, job_id, lease_token=new_token, result={"by": "other"})
    assert done.status_code == 200
    # The vanished worker comes back and tries to finish: refused, nothing overwritten.
    assert api.complete(vanished, job_id, lease_token=old_token).status_code == 409
    assert api.complete(other, job_id, lease_token=new_token).status_code == 409
    job = api.get(admin, job_id).json
    assert job["status"] == "completed" and job["result"] == {"by": "other"}
    assert job["worker_id"] == "other"


def test_a_stale_token_from_the_same_worker_key_is_fenced_off(api, producer, worker, clock):
    job_id = api.enqueue(producer).json["id"]
    stale = api.claim(worker, lease_seconds=10).json["lease_token"]
    clock.advance(11)
    fresh = api.claim(worker).json["lease_token"]  # same key, second attempt
    assert fresh != stale

    for call in (lambda t: api.complete(worker, job_id, lease_token=t),
                 lambda t: api.fail(worker, job_id, lease_token=t),
                 lambda t: api.heartbeat(worker, job_id, lease_token=t)):
        response = call(stale)
        assert response.status_code == 409
        assert "earlier attempt" in response.json["detail"]
    assert api.complete(worker, job_id, lease_token=fresh).status_code == 200


def test_without_a_token_the_holder_may_still_finish_its_live_lease(api, producer, worker):
    job_id = api.enqueue(producer).json["id"]
    api.claim(worker)
    assert api.complete(worker, job_id).status_code == 200


def test_every_job_of_a_claim_has_its_own_token(api, producer, worker):
    api.enqueue(producer)
    api.enqueue(producer)
    tokens = {api.claim(worker).json["lease_token"] for _ in range(2)}
    assert len(tokens) == 2


def test_two_claims_never_both_rescue_and_hand_out_the_same_job(app, producer, make_key,
                                                                clock):
    dead = make_key("dead", "worker")
    claimers = [make_key(f"claimer-{i}", "worker") for i in range(6)]
    api = Api(app.test_client())
    ids = [api.enqueue(producer).json["id"] for _ in range(12)]
    for _ in ids:
        api.claim(dead, lease_seconds=5)
    clock.advance(6)
    got: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(claimers))

    def claim_all(key):
        thread_api = Api(app.test_client())
        barrier.wait(timeout=30)
        while (response := thread_api.claim(key)).status_code == 200:
            with lock:
                got.append(response.json["id"])

    threads = [threading.Thread(target=claim_all, args=(key,)) for key in claimers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(got) == sorted(ids)  # each rescued job handed out exactly once


def test_fail_backs_off_exponentially_with_jitter(api, producer, worker, clock, app):
    job_id = api.enqueue(producer, max_retries=10).json["id"]
    delays = []
    for attempt in range(4):
        clock.advance(3600)
        assert api.claim(worker).json["id"] == job_id
        failed = api.fail(worker, job_id).json
        now = clock.now_us()
        run_at = failed["run_at"]
        # delay d = 1 s * 2**attempt, drawn from [d/2, d]
        low = to_rfc3339(now + 500_000 * 2**attempt)
        high = to_rfc3339(now + 1_000_000 * 2**attempt)
        assert low <= run_at <= high, (attempt, run_at)
        delays.append(run_at)
    assert len(set(delays)) == 4


def test_a_backoff_delayed_job_is_invisible_to_claims_until_its_time(api, producer, worker,
                                                                     clock):
    job_id = api.enqueue(producer).json["id"]
    api.claim(worker)
    api.fail(worker, job_id, retry_in_seconds=120)
    clock.advance(119)
    assert api.claim(worker).status_code == 204
    clock.advance(1)
    assert api.claim(worker).json["id"] == job_id


def test_retry_in_seconds_zero_makes_the_job_claimable_at_once(api, producer, worker):
    job_id = api.enqueue(producer).json["id"]
    api.claim(worker)
    api.fail(worker, job_id, retry_in_seconds=0)
    assert api.claim(worker).json["id"] == job_id


def test_backoff_is_capped_by_its_maximum(app_config, clock):
    app_config |= {"RETRY_BACKOFF_SECONDS": 10, "RETRY_BACKOFF_MAX_SECONDS": 15}
    application = create_app(app_config)
    services = application.extensions["queuelog"]
    producer = Key("p", services.keys.create_key("p", Role.PRODUCER))
    worker = Key("w", services.keys.create_key("w", Role.WORKER))
    api = Api(application.test_client())
    job_id = api.enqueue(producer, max_retries=5).json["id"]
    for _ in range(4):
        clock.advance(3600)
        api.claim(worker)
        run_at = api.fail(worker, job_id).json["run_at"]
        assert run_at <= to_rfc3339(clock.now_us() + 15_000_000)
        assert run_at >= to_rfc3339(clock.now_us() + 5_000_000)
    services.db.engine.dispose()


@pytest.mark.parametrize("when", ["delay_seconds", "run_at"])
def test_delayed_jobs_wait_for_their_run_at(api, producer, worker, clock, when):
    body = ({"delay_seconds": 60} if when == "delay_seconds"
            else {"run_at": to_rfc3339(clock.now_us() + 60_000_000)})
    job_id = api.enqueue(producer, **body).json["id"]
    clock.advance(59.999999)
    assert api.claim(worker).status_code == 204
    clock.advance(0.000001)
    assert api.claim(worker).json["id"] == job_id


def test_run_at_in_the_past_is_claimable_at_once(api, producer, worker):
    job_id = api.enqueue(producer, run_at="2020-01-01T00:00:00Z").json["id"]
    assert api.claim(worker).json["id"] == job_id


def test_leases_expire_on_the_real_clock_end_to_end(app_config, tmp_path):
    del app_config["CLOCK"]  # the wall clock
    application = create_app(app_config)
    start_maintenance(application)  # as a served process does: it rescues the lease
    services = application.extensions["queuelog"]
    producer = Key("p", services.keys.create_key("p", Role.PRODUCER))
    first = Key("w1", services.keys.create_key("w1", Role.WORKER))
    second = Key("w2", services.keys.create_key("w2", Role.WORKER))
    api = Api(application.test_client())
    job_id = api.enqueue(producer).json["id"]
    token = api.claim(first, lease_seconds=1).json["lease_token"]
    assert api.claim(second).status_code == 204  # the lease is live
    deadline = time.monotonic() + 10
    while (response := api.claim(second)).status_code == 204 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert response.status_code == 200 and response.json["id"] == job_id
    assert api.complete(first, job_id, lease_token=token).status_code == 409
    token = response.json["lease_token"]
    assert api.complete(second, job_id, lease_token=token).status_code == 200
    stop_maintenance(application)
    services.db.engine.dispose()
