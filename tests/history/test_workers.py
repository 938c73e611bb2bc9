"""GET /workers: live worker keys, when each was last seen, and what each holds."""

from __future__ import annotations

from app.core.clock import to_rfc3339


def workers(client, key):
    answer = client.get("/workers", headers=key.headers)
    assert answer.status_code == 200, answer.json
    return {w["name"]: w for w in answer.json["workers"]}


def test_a_worker_never_seen_is_listed_with_no_last_seen(client, worker, admin):
    assert workers(client, admin) == {
        "worker-1": {"name": "worker-1", "types": None, "last_seen_at": None, "running": 0,
                     "instances": []}}


def test_claims_and_reports_set_last_seen_and_running_counts(api, client, app, producer,
                                                              make_key, admin, clock):
    busy = make_key("busy", "worker", types=["pdf", "email"])
    idle = make_key("idle", "worker")
    for _ in range(2):
        api.enqueue(producer)
    claimed_at = clock.now_us()
    api.claim(busy)
    first = api.claim(busy).json
    api.claim(idle)  # finds nothing, but the worker is alive

    shown = workers(client, admin)
    assert shown["busy"] == {"name": "busy", "types": ["email", "pdf"],
                             "last_seen_at": to_rfc3339(claimed_at), "running": 2,
                             "instances": []}
    assert shown["idle"]["last_seen_at"] == to_rfc3339(claimed_at)
    assert shown["idle"]["running"] == 0

    clock.advance(61)  # a report more than a minute later moves last seen
    api.complete(busy, first["id"])
    shown = workers(client, admin)
    assert shown["busy"]["last_seen_at"] == to_rfc3339(clock.now_us())
    assert shown["busy"]["running"] == 1


def test_last_seen_is_written_at_most_once_a_minute(api, client, producer, worker, admin,
                                                     clock):
    job_id = api.enqueue(producer).json["id"]
    first_seen = clock.now_us()
    api.claim(worker)
    clock.advance(30)
    api.heartbeat(worker, job_id)
    assert workers(client, admin)["worker-1"]["last_seen_at"] == to_rfc3339(first_seen)
    clock.advance(31)
    api.heartbeat(worker, job_id)
    assert workers(client, admin)["worker-1"]["last_seen_at"] == to_rfc3339(clock.now_us())


def test_revoked_keys_and_other_roles_are_not_listed(app, client, make_key, producer, admin):
    make_key("gone", "worker")
    app.extensions["queuelog"].keys.revoke_key("gone")
    assert workers(client, admin) == {}


def test_only_admins_list_workers(client, producer, worker):
    assert client.get("/workers", headers=producer.headers).status_code == 403
    assert client.get("/workers", headers=worker.headers).status_code == 403
