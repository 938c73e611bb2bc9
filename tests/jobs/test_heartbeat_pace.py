"""A job's heartbeats and checkpoints are taken at a bounded pace (docs/JOBS.md, "Heartbeat
pace"), on both engines and across server processes: one sent sooner is a 429 problem with
Retry-After that writes nothing (not the lease, not the progress, not the checkpoint, no
event), and a checkpoint acknowledged is the one the next attempt gets."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from app import create_app
from tests.conftest import Api, Key

PROBLEM = "https://queuelog.dev/problems/too-many-requests"


def stored(app: Any, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    with app.extensions["queuelog"].db.engine.connect() as conn:
        return [tuple(row) for row in conn.execute(text(sql), params)]


def written(app: Any, job_id: int) -> dict[str, Any]:
    """Everything a heartbeat may write about a job: its row, its checkpoint, its events,
    and its worker's last sign of life."""
    return {
        "row": stored(app, "SELECT * FROM jobs WHERE id = :id", id=job_id),
        "checkpoint": stored(app, "SELECT * FROM job_checkpoints WHERE job_id = :id",
                             id=job_id),
        "events": stored(app, "SELECT * FROM job_events WHERE job_id = :id", id=job_id),
        "activity": stored(app, "SELECT * FROM key_activity"),
    }


def running(api: Api, clock: Any, producer: Key, worker: Key,
            **claim: Any) -> tuple[int, str]:
    """A job claimed by `worker` a moment ago (a heartbeat never reaches the server within
    its claim's microsecond): (its id, its lease token)."""
    job_id = api.enqueue(producer, max_retries=3).json["id"]
    claimed = api.claim(worker, **claim).json
    assert claimed["id"] == job_id
    clock.advance(0.01)
    return job_id, claimed["lease_token"]


def assert_too_soon(answer: Any) -> None:
    assert answer.status_code == 429, answer.json
    assert answer.mimetype == "application/problem+json"
    assert answer.json["type"] == PROBLEM and answer.json["status"] == 429
    assert answer.headers["Retry-After"] == "1"


def test_a_heartbeat_within_a_second_of_the_last_is_429_and_writes_nothing(
        app, api, clock, producer, worker):
    job_id, token = running(api, clock, producer, worker, lease_seconds=60)
    first = api.heartbeat(worker, job_id, lease_token=token, lease_seconds=60)
    assert first.status_code == 200, first.json
    before = written(app, job_id)

    for step in (0.0, 0.3, 0.6):
        clock.advance(step)
        flood = api.heartbeat(worker, job_id, lease_token=token, lease_seconds=600,
                              progress={"done": 5, "total": 10}, message="busy",
                              checkpoint={"row": 5})
        assert_too_soon(flood)
        assert written(app, job_id) == before

    clock.advance(0.1)  # a second after the last heartbeat taken
    taken = api.heartbeat(worker, job_id, lease_token=token, lease_seconds=600,
                          progress={"done": 5, "total": 10})
    assert taken.status_code == 200, taken.json
    assert taken.json["progress"]["done"] == 5
    assert written(app, job_id)["row"] != before["row"]


def test_the_first_heartbeat_after_a_claim_is_taken_and_each_job_has_its_own_pace(
        api, clock, producer, worker):
    one, one_token = running(api, clock, producer, worker)
    two, two_token = running(api, clock, producer, worker)
    assert api.heartbeat(worker, one, lease_token=one_token).status_code == 200
    # Another job of the same worker, at the same moment: its own first heartbeat.
    assert api.heartbeat(worker, two, lease_token=two_token).status_code == 200
    assert_too_soon(api.heartbeat(worker, one, lease_token=one_token))
    assert_too_soon(api.heartbeat(worker, two, lease_token=two_token))


def test_a_lease_under_two_seconds_is_kept_alive_at_half_its_length(api, clock, producer,
                                                                       worker):
    job_id, token = running(api, clock, producer, worker, lease_seconds=1)
    assert api.heartbeat(worker, job_id, lease_token=token, lease_seconds=1).status_code == 200
    clock.advance(0.4)
    assert_too_soon(api.heartbeat(worker, job_id, lease_token=token, lease_seconds=1))
    for _ in range(4):  # half the lease on each time: it never runs out
        clock.advance(0.5)
        beat = api.heartbeat(worker, job_id, lease_token=token, lease_seconds=1)
        assert beat.status_code == 200, beat.json
        assert beat.json["status"] == "running"


def test_refusals_that_are_not_about_pace_stay_404_and_409(api, clock, producer, worker,
                                                           make_key):
    job_id, token = running(api, clock, producer, worker)
    assert api.heartbeat(worker, job_id, lease_token=token).status_code == 200
    other = make_key("worker-2", "worker")
    assert api.heartbeat(other, job_id).status_code == 409
    assert api.heartbeat(worker, job_id, lease_token="not-the-token").status_code == 409
    assert api.heartbeat(worker, job_id + 1000).status_code == 404


def test_checkpoints_are_saved_once_a_second_at_most_and_an_acknowledged_one_is_kept(
        app, api, clock, producer, worker):
    # A 1 s lease takes a heartbeat every half second, but a checkpoint only every second.
    job_id, token = running(api, clock, producer, worker, lease_seconds=1)
    saved = api.heartbeat(worker, job_id, lease_token=token, lease_seconds=1,
                          checkpoint={"row": 100})
    assert saved.status_code == 200, saved.json
    clock.advance(0.5)
    before = written(app, job_id)
    sooner = api.heartbeat(worker, job_id, lease_token=token, lease_seconds=1,
                           checkpoint={"row": 150})
    assert_too_soon(sooner)
    assert "checkpoint" in sooner.json["detail"]
    assert written(app, job_id) == before  # not its lease either: the heartbeat is refused whole
    # The same moment without a checkpoint: a heartbeat like any other.
    assert api.heartbeat(worker, job_id, lease_token=token, lease_seconds=1).status_code == 200
    clock.advance(0.5)
    again = api.heartbeat(worker, job_id, lease_token=token, lease_seconds=1,
                          checkpoint={"row": 200})
    assert again.status_code == 200, again.json

    # The next attempt resumes from the last checkpoint acknowledged, not the refused one.
    assert api.fail(worker, job_id, lease_token=token, retry_in_seconds=0).status_code == 200
    retried = api.claim(worker).json
    assert (retried["id"], retried["checkpoint"]) == (job_id, {"row": 200})


def test_a_fails_checkpoint_is_always_saved(api, clock, producer, worker):
    job_id, token = running(api, clock, producer, worker)
    assert api.heartbeat(worker, job_id, lease_token=token,
                         checkpoint={"row": 1}).status_code == 200
    failed = api.fail(worker, job_id, lease_token=token, retry_in_seconds=0,
                      checkpoint={"row": 2})
    assert failed.status_code == 200, failed.json
    assert api.claim(worker).json["checkpoint"] == {"row": 2}


def test_the_pace_holds_across_server_processes(app_config, app, api, clock, producer, worker):
    """Two apps (two processes' services) on one database: a heartbeat one took makes the
    other's, sent within the second, a 429."""
    job_id, token = running(api, clock, producer, worker)
    assert api.heartbeat(worker, job_id, lease_token=token).status_code == 200
    other = create_app(app_config)
    try:
        before = written(app, job_id)
        answer = Api(other.test_client()).heartbeat(worker, job_id, lease_token=token,
                                                    checkpoint={"row": 7})
        assert_too_soon(answer)
        assert written(app, job_id) == before
        clock.advance(1)
        assert Api(other.test_client()).heartbeat(
            worker, job_id, lease_token=token).status_code == 200
    finally:
        other.extensions["queuelog"].db.engine.dispose()
