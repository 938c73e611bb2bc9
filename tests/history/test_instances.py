"""Worker instances: the label a worker sends with its claims and heartbeats, listed under its
key by GET /workers (last seen, jobs held, jobs claimed in the last minute) and named by its
jobs' attempts; shown as reported, never trusted: the key and the lease token alone say who
holds a job."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.clock import MICROS, to_rfc3339
from app.jobs.timeline.instance_repository import InstanceRepository
from app.jobs.timeline.instances import (
    IDLE_MINUTES,
    MAX_INSTANCES_PER_KEY,
    InstanceNote,
    InstanceTallies,
)
from app.jobs.timeline.stats_repository import MINUTE_US, minute_of

HOST_A = "host-a.example:4242"
HOST_B = "host-b.example:77"
OPERATORS_LABEL = "worker 7 (blue)"


def claim(api: Any, key: Any, instance: str | None = None, **body: Any) -> Any:
    if instance is not None:
        body["instance"] = instance
    return api.claim(key, **body)


def workers(client: Any, admin: Any) -> dict[str, Any]:
    answer = client.get("/workers", headers=admin.headers)
    assert answer.status_code == 200, answer.json
    return {worker["name"]: worker for worker in answer.json["workers"]}


def instances(client: Any, admin: Any, name: str) -> dict[str, Any]:
    return {one["instance"]: one for one in workers(client, admin)[name]["instances"]}


def attempts(client: Any, admin: Any, job_id: int) -> list[dict[str, Any]]:
    answer = client.get(f"/jobs/{job_id}/attempts", headers=admin.headers)
    assert answer.status_code == 200, answer.json
    attempts_shown: list[dict[str, Any]] = answer.json["attempts"]
    return attempts_shown


def test_a_keys_instances_are_listed_under_it_with_what_each_holds(
        api, client, producer, worker, admin, clock):
    for _ in range(3):
        api.enqueue(producer)
    seen_at = clock.now_us()
    first = claim(api, worker, HOST_A).json
    claim(api, worker, HOST_A)
    claim(api, worker, HOST_B)
    claim(api, worker)  # no label: nothing to claim, the key seen all the same

    shown = workers(client, admin)["worker-1"]
    assert shown["running"] == 3
    assert shown["instances"] == [
        {"instance": HOST_A, "last_seen_at": to_rfc3339(seen_at), "running": 2,
         "claimed_per_minute": 0},
        {"instance": HOST_B, "last_seen_at": to_rfc3339(seen_at), "running": 1,
         "claimed_per_minute": 0}]

    # The minute over, the next note of each instance writes its count of it.
    clock.advance(60)
    assert api.complete(worker, first["id"]).status_code == 200
    assert api.heartbeat(worker, first["id"] + 1, instance=HOST_A).status_code == 200
    claim(api, worker, HOST_B)
    listed = instances(client, admin, "worker-1")
    assert listed[HOST_A] == {"instance": HOST_A, "last_seen_at": to_rfc3339(clock.now_us()),
                              "running": 1, "claimed_per_minute": 2}
    assert listed[HOST_B]["claimed_per_minute"] == 1
    assert listed[HOST_B]["running"] == 1

    # Two minutes without a claim counted: none in the last minute.
    clock.advance(120)
    assert instances(client, admin, "worker-1")[HOST_A]["claimed_per_minute"] == 0


def test_claim_many_counts_each_job_it_took(api, client, producer, worker, admin, clock):
    for _ in range(3):
        api.enqueue(producer)
    taken = client.post("/jobs/claim-many", json={"max_jobs": 3, "instance": HOST_A},
                        headers=worker.headers).json["jobs"]
    assert len(taken) == 3
    clock.advance(60)
    claim(api, worker, HOST_A)  # nothing left: counted as a claim of none
    shown = instances(client, admin, "worker-1")[HOST_A]
    assert (shown["running"], shown["claimed_per_minute"]) == (3, 3)
    for job in taken:
        assert attempts(client, admin, job["id"])[0]["worker_instance"] == HOST_A


def test_an_instance_is_written_at_most_once_a_minute(api, client, producer, worker, admin,
                                                       clock):
    job_id = api.enqueue(producer).json["id"]
    first_seen = clock.now_us()
    claim(api, worker, HOST_A)
    clock.advance(30)
    assert api.heartbeat(worker, job_id, instance=HOST_A).status_code == 200
    assert instances(client, admin, "worker-1")[HOST_A]["last_seen_at"] == to_rfc3339(
        first_seen)
    clock.advance(31)  # a new minute: the next note writes
    assert api.heartbeat(worker, job_id, instance=HOST_A).status_code == 200
    assert instances(client, admin, "worker-1")[HOST_A]["last_seen_at"] == to_rfc3339(
        clock.now_us())


def test_attempts_name_the_instance_that_claimed_them(api, client, app, producer, make_key,
                                                      admin, clock):
    """Told by the row (running, completed), stored by a fail (one statement on PostgreSQL)
    and by the service's rescue of a lost lease."""
    worker = make_key("mailer", "worker")
    job_id = api.enqueue(producer, max_retries=3).json["id"]
    claim(api, worker, HOST_A)
    assert attempts(client, admin, job_id)[0]["worker_instance"] == HOST_A
    assert api.fail(worker, job_id, retry_in_seconds=0).json["status"] == "pending"
    claim(api, worker, HOST_B, lease_seconds=5)
    clock.advance(6)
    app.extensions["queuelog"].jobs.sweep()  # the lease ran out: rescued
    claim(api, worker)  # a claim without a label names none
    clock.advance(1)
    api.fail(worker, job_id, retry_in_seconds=0)
    claim(api, worker, OPERATORS_LABEL)
    assert api.complete(worker, job_id).json["status"] == "completed"

    shown = attempts(client, admin, job_id)
    assert [(a["worker_id"], a["worker_instance"], a["outcome"]) for a in shown] == [
        ("mailer", HOST_A, "failed"), ("mailer", HOST_B, "lease_expired"),
        ("mailer", None, "failed"), ("mailer", OPERATORS_LABEL, "completed")]
    # The producer sees the attempts, and their instances, without their errors.
    mine = client.get(f"/jobs/{job_id}/attempts", headers=producer.headers).json["attempts"]
    assert [a["worker_instance"] for a in mine] == [HOST_A, HOST_B, None, OPERATORS_LABEL]


def test_a_heartbeats_label_changes_nothing_of_the_attempt(api, client, producer, worker,
                                                            admin, clock):
    job_id = api.enqueue(producer).json["id"]
    claim(api, worker, HOST_A)
    clock.advance(2)
    assert api.heartbeat(worker, job_id, instance=HOST_B).status_code == 200
    assert attempts(client, admin, job_id)[0]["worker_instance"] == HOST_A
    listed = instances(client, admin, "worker-1")
    assert (listed[HOST_A]["running"], listed[HOST_B]["running"]) == (1, 0)


def test_a_label_is_never_trusted_for_ownership(api, client, producer, make_key, admin):
    """A second key sending the first one's label gains nothing: neither its jobs nor a
    place under its key."""
    owner = make_key("mailer", "worker")
    other = make_key("intruder", "worker")
    job = api.enqueue(producer).json["id"]
    token = claim(api, owner, HOST_A).json["lease_token"]
    api.enqueue(producer)
    claim(api, other, HOST_A)

    for report in (api.heartbeat, api.complete, api.fail):
        refused = report(other, job, lease_token=token)
        assert refused.status_code == 409, refused.json
    assert api.heartbeat(other, job, instance=HOST_A).status_code == 409
    assert client.post(f"/jobs/{job}/heartbeat", json={"instance": HOST_A},
                       headers=other.headers).status_code == 409

    shown = workers(client, admin)
    assert [(i["instance"], i["running"]) for i in shown["mailer"]["instances"]] == [
        (HOST_A, 1)]
    assert [(i["instance"], i["running"]) for i in shown["intruder"]["instances"]] == [
        (HOST_A, 1)]
    assert api.get(admin, job).json["worker_id"] == "mailer"
    assert api.complete(owner, job, lease_token=token).json["status"] == "completed"
    assert [(a["worker_id"], a["worker_instance"])
            for a in attempts(client, admin, job)] == [("mailer", HOST_A)]


@pytest.mark.parametrize("label", [
    "", "   ", " lead", "trail ", "host\n1", "host\r:1", "tab\t1", "\x1b[31mred", "host\x00",
    "\x7f", "\u202eevil", "zero\u200bwidth", "h\u043est:1", "\u4e3b\u673a-7:4242",
    "x" * 201, 42, None, ["host"], {"host": 1}])
def test_a_bad_label_is_a_422_naming_the_field(api, client, producer, worker, label):
    job_id = api.enqueue(producer).json["id"]
    for path, body in (("/jobs/claim", {}), ("/jobs/claim-many", {"max_jobs": 2}),
                       (f"/jobs/{job_id}/heartbeat", {})):
        answer = client.post(path, json={**body, "instance": label}, headers=worker.headers)
        assert answer.status_code == 422, (path, label, answer.json)
        assert answer.content_type == "application/problem+json"
        assert list(answer.json["errors"]) == ["instance"], answer.json
    assert api.get(worker, job_id).status_code == 404  # nothing was claimed


@pytest.mark.parametrize("label", ["x" * 200, "a", "~", OPERATORS_LABEL,
                                   "<b>ip-10-0-3-7.ec2.internal</b>:41877"])
def test_a_printable_ascii_label_up_to_200_characters_is_taken(api, client, producer, worker,
                                                         admin, label):
    job_id = api.enqueue(producer).json["id"]
    assert claim(api, worker, label).json["id"] == job_id
    assert attempts(client, admin, job_id)[0]["worker_instance"] == label
    assert label in instances(client, admin, "worker-1")


def test_instances_unseen_for_an_hour_are_not_listed_and_forgotten_after_a_day(
        api, app, client, producer, worker, admin, clock):
    api.enqueue(producer)
    job_id = claim(api, worker, HOST_A, lease_seconds=3600).json["id"]
    claim(api, worker, HOST_B)
    clock.advance(1800)
    # A heartbeat without a label keeps the lease, and notes the key alone.
    assert api.heartbeat(worker, job_id, lease_seconds=3600).status_code == 200
    clock.advance(1801)
    # HOST_A holds a job: listed, not seen within the hour; HOST_B is not listed any more.
    shown = workers(client, admin)["worker-1"]["instances"]
    assert shown == [{"instance": HOST_A, "last_seen_at": None, "running": 1,
                      "claimed_per_minute": 0}]
    assert api.complete(worker, job_id).status_code == 200
    assert workers(client, admin)["worker-1"]["instances"] == []

    # Maintenance forgets them (its loop may have done so already: the call is paced).
    retention = app.extensions["queuelog"].jobs.retention
    db = app.extensions["queuelog"].db
    assert retention.forget_instances() == 0  # within the day
    with db.read() as conn:
        assert len(InstanceRepository(conn).seen_since(0)) == 2
    clock.advance(86_400)
    retention.forget_instances()
    with db.read() as conn:
        assert InstanceRepository(conn).seen_since(0) == []


def test_each_process_adds_its_count_of_a_minute_and_the_latest_minute_wins(app, clock):
    """What several processes write of one instance (each its own count of a minute)."""
    db = app.extensions["queuelog"].db
    now = clock.now_us()
    minute = minute_of(now)

    def write(seen_at: int, minute_counted: int | None, claimed: int,
              last_claim_at: int | None = None) -> Any:
        with db.write() as conn:
            InstanceRepository(conn).record(InstanceNote(
                "worker-1", HOST_A, seen_at, last_claim_at, minute_counted, claimed))
        with db.read() as conn:
            [row] = InstanceRepository(conn).seen_since(0)
        return row

    row = write(now, None, 0)  # a first note: seen, nothing counted
    assert (row.last_seen_at, row.minute, row.claimed) == (now, None, 0)
    row = write(now + MINUTE_US, minute, 4, last_claim_at=now + 5)
    assert (row.minute, row.claimed, row.last_claim_at) == (minute, 4, now + 5)
    row = write(now + MINUTE_US - 1, minute, 3)  # another process, written a moment earlier
    assert (row.last_seen_at, row.minute, row.claimed) == (now + MINUTE_US, minute, 7)
    assert row.last_claim_at == now + 5
    row = write(now + 2 * MINUTE_US, minute + MINUTE_US, 1)
    assert (row.minute, row.claimed) == (minute + MINUTE_US, 1)
    row = write(now + 3 * MINUTE_US, minute, 9)  # a count of an older minute, late: dropped
    assert (row.minute, row.claimed) == (minute + MINUTE_US, 1)
    assert row.last_seen_at == now + 3 * MINUTE_US


def test_a_process_counts_at_most_so_many_labels_of_a_key():
    """A key whose workers send a new label with each request costs a write per new label,
    up to the cap; then only the labels noted go on, until some have been idle long."""
    tallies = InstanceTallies()
    start = 1_800_000_000 * MICROS
    written = [tallies.note("worker-1", f"host:{n}", start, claimed=1)
               for n in range(MAX_INSTANCES_PER_KEY + 5)]
    assert sum(note is not None for note in written) == MAX_INSTANCES_PER_KEY
    assert tallies.note("worker-2", "host:0", start, claimed=1) is not None  # its own cap
    assert tallies.note("worker-1", "host:0", start, claimed=1) is None  # this minute's
    later = start + IDLE_MINUTES * MINUTE_US
    assert tallies.note("worker-1", "host:new", later, claimed=None) is not None
    note = tallies.note("worker-1", "host:new", later + MINUTE_US, claimed=None)
    assert note is not None and (note.minute, note.claimed) == (minute_of(later), 0)
