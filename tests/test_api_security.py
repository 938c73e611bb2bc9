"""Attacks on the API: authentication, job types, priority ceilings, worker identity, lease
holders, racing claims, payload size, SQL injection, idempotency probing and error disclosure
(the reference design's assessment V-01 … V-10, one heading each), each attacked as the
assessment describes it, and each refused with the contract's answer, leaving the queue as
it was."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import create_engine, inspect, select

from app import create_app
from app.core.callers import Role
from app.core.priorities import Priority
from app.storage.schema import jobs as jobs_table
from tests.conftest import JOB_TYPES, Api, Key

PROBLEM = "application/problem+json"


def _assert_problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.content_type == PROBLEM
    body = response.json
    assert body["status"] == status
    assert body["type"].startswith("https://")
    return body


def _all_jobs(api: Api, admin: Key) -> list[dict[str, Any]]:
    response = api.list(admin, limit=500)
    assert response.status_code == 200
    return response.json["jobs"]


@pytest.fixture
def app_with():
    """Build an app from a config of the test's own; returns (app, its Api, an admin key)."""
    apps = []

    def build(config: dict[str, Any]) -> tuple[Any, Api, Key]:
        application = create_app(config)
        apps.append(application)
        keys = application.extensions["queuelog"].keys
        admin = Key("admin-x", keys.create_key("admin-x", Role.ADMIN))
        return application, Api(application.test_client()), admin

    yield build
    for application in apps:
        application.extensions["queuelog"].db.engine.dispose()


# -- V-01 no authentication --------------------------------------------------------------------

# Every job route, with a body that would succeed for the right key.
JOB_ROUTES = [
    ("POST", "/jobs", {"type": "email", "payload": {"to": "a@example.com"}}),
    ("GET", "/jobs", None),
    ("GET", "/jobs/{id}", None),
    ("POST", "/jobs/claim", {}),
    ("POST", "/jobs/{id}/heartbeat", {}),
    ("POST", "/jobs/{id}/complete", {"result": {"ok": True}}),
    ("POST", "/jobs/{id}/fail", {"error": "boom"}),
    ("POST", "/jobs/{id}/cancel", None),
    ("POST", "/jobs/{id}/retry", None),
]

BAD_CREDENTIALS = {
    "no header": None,
    "empty header": "",
    "basic scheme": "Basic dXNlcjpwYXNz",
    "bearer without token": "Bearer ",
    "bearer with two words": "Bearer abc def",
    "bare token without scheme": "ql_" + "A" * 43,
    "unknown token": "Bearer ql_" + "A" * 43,
    "non-ascii token": "Bearer ql_\u00e9\u00e9\u00e9",
    "overlong token": "Bearer " + "x" * 5000,
}


@pytest.mark.parametrize("method,path,body", JOB_ROUTES,
                         ids=[f"{m} {p}" for m, p, _ in JOB_ROUTES])
def test_every_job_route_refuses_callers_without_a_valid_key(
        client, api, producer, worker, admin, make_key, method, path, body):
    job_id = api.enqueue(producer).json["id"]
    claimed_id = api.claim(worker).json["id"]
    assert claimed_id == job_id  # running, held by worker-1: every route has a real target
    revoked = make_key("revoked-admin", "admin")
    client.application.extensions["queuelog"].keys.revoke_key(revoked.name)
    before = _all_jobs(api, admin)

    attempts = {**BAD_CREDENTIALS, "revoked key": f"Bearer {revoked.token}"}
    for label, header in attempts.items():
        headers = {} if header is None else {"Authorization": header}
        response = client.open(path.format(id=job_id), method=method, json=body,
                               headers=headers)
        problem = _assert_problem(response, 401)
        assert response.headers["WWW-Authenticate"].startswith("Bearer"), label
        assert "ql_" not in problem["detail"], label

    assert _all_jobs(api, admin) == before  # nothing enqueued, claimed, finished or cancelled


def test_a_key_revoked_while_in_use_is_refused_on_its_next_request(
        client, api, make_key, admin):
    producer = make_key("soon-revoked", "producer")
    assert api.enqueue(producer).status_code == 201

    client.application.extensions["queuelog"].keys.revoke_key(producer.name)

    _assert_problem(api.enqueue(producer), 401)
    _assert_problem(api.list(producer), 401)
    assert len(_all_jobs(api, admin)) == 1


def test_an_unauthenticated_request_is_refused_before_its_body_is_looked_at(client, api,
                                                                               admin):
    response = client.post("/jobs", data=b"{not json", content_type="application/json")
    _assert_problem(response, 401)
    response = client.post("/jobs/999999/complete", json={"bogus": 1})
    _assert_problem(response, 401)
    assert _all_jobs(api, admin) == []


# -- V-02 any job type -------------------------------------------------------------------------

@pytest.mark.parametrize("job_type", ["DROP TABLE", "shutdown", "admin_task", "EMAIL", "email ",
                                      "spam"])
def test_an_unknown_job_type_is_refused_with_422_naming_type_and_nothing_is_stored(
        api, producer, admin, job_type):
    response = api.enqueue(producer, type=job_type, payload={"x": 1})

    problem = _assert_problem(response, 422)
    assert problem["type"].endswith("validation-failed")
    assert "type" in problem["errors"]
    assert _all_jobs(api, admin) == []
    assert api.enqueue(admin, type=job_type).status_code == 422  # admins get no exception


def test_a_worker_asking_for_unknown_types_is_told_so_and_claims_nothing(
        api, producer, worker, admin):
    job_id = api.enqueue(producer, type="email").json["id"]

    refused = api.claim(worker, types=["shutdown", "email"])
    assert refused.status_code == 422
    assert "shutdown" in refused.json["detail"]
    assert api.get(admin, job_id).json["status"] == "pending"
    assert api.claim(worker).json["id"] == job_id


# -- V-03 anyone sets critical -----------------------------------------------------------------

def test_a_producer_with_the_default_ceiling_cannot_enqueue_above_medium(
        api, producer, admin):
    for priority in ("critical", "high", "CRITICAL", "High"):
        problem = _assert_problem(api.enqueue(producer, type="email", priority=priority), 403)
        assert "medium" in problem["detail"]
    assert _all_jobs(api, admin) == []

    for priority in ("medium", "low"):
        created = api.enqueue(producer, priority=priority)
        assert created.status_code == 201
        assert created.json["priority"] == priority
    assert api.enqueue(producer).json["priority"] == "medium"


def test_a_key_with_a_high_ceiling_may_enqueue_high_but_not_critical(api, make_key, admin):
    trusted = make_key("trusted-producer", "producer", max_priority=Priority.HIGH)

    assert api.enqueue(trusted, priority="high").status_code == 201
    _assert_problem(api.enqueue(trusted, priority="critical"), 403)

    assert [job["priority"] for job in _all_jobs(api, admin)] == ["high"]


def test_an_admin_may_enqueue_critical(api, admin):
    created = api.enqueue(admin, priority="critical")

    assert created.status_code == 201
    assert created.json["priority"] == "critical"


def test_a_producer_whose_ceiling_is_low_gets_low_by_default_and_nothing_more(
        api, make_key, admin):
    humble = make_key("humble-producer", "producer", max_priority=Priority.LOW)

    created = api.enqueue(humble)
    assert created.status_code == 201
    assert created.json["priority"] == "low"
    _assert_problem(api.enqueue(humble, priority="medium"), 403)
    assert len(_all_jobs(api, admin)) == 1


def test_a_critical_spam_job_from_a_producer_never_jumps_the_queue(
        api, producer, worker, admin):
    legitimate = api.enqueue(admin, priority="high").json["id"]

    _assert_problem(api.enqueue(producer, type="email", payload={"spam": True},
                                priority="critical"), 403)

    assert api.claim(worker).json["id"] == legitimate
    assert api.claim(worker).status_code == 204


# -- V-04 worker_id spoofing -------------------------------------------------------------------

def test_a_claim_naming_another_workers_id_is_refused_and_the_job_stays_pending(
        api, producer, make_key, admin):
    make_key("legitimate-worker-1", "worker")
    attacker = make_key("attacker", "worker")
    job_id = api.enqueue(producer).json["id"]

    problem = _assert_problem(api.claim(attacker, worker_id="legitimate-worker-1"), 403)
    assert "worker_id" in problem["detail"]

    job = api.get(admin, job_id).json
    assert job["status"] == "pending"
    assert job["worker_id"] is None
    assert job["claimed_at"] is None


def test_the_claimed_jobs_worker_id_is_always_the_key_name(api, producer, worker, admin):
    first = api.enqueue(producer).json["id"]
    second = api.enqueue(producer).json["id"]

    unnamed = api.claim(worker)
    named = api.claim(worker, worker_id=worker.name)  # naming itself is allowed

    assert unnamed.status_code == named.status_code == 200
    assert [unnamed.json["id"], named.json["id"]] == [first, second]
    for job_id in (first, second):
        assert api.get(admin, job_id).json["worker_id"] == worker.name


# -- V-05 any caller completes any job ---------------------------------------------------------

@pytest.mark.parametrize("action", ["complete", "fail", "heartbeat"])
def test_another_worker_cannot_complete_fail_or_heartbeat_a_job_it_does_not_hold(
        api, producer, worker, make_key, admin, action):
    other = make_key("worker-2", "worker")
    job_id = api.enqueue(producer).json["id"]
    claim = api.claim(worker).json
    held = api.get(admin, job_id).json

    attacks = [
        getattr(api, action)(other, job_id),
        # A stolen lease token does not help either: the job is not held by this key.
        getattr(api, action)(other, job_id, lease_token=claim["lease_token"]),
    ]

    for response in attacks:
        _assert_problem(response, 409)
    after = api.get(admin, job_id).json
    assert after == held  # still running with worker-1, lease untouched, no error recorded
    assert after["status"] == "running"
    assert after["worker_id"] == worker.name
    # The rightful holder still can finish it.
    assert api.complete(worker, job_id, lease_token=claim["lease_token"]).status_code == 200


@pytest.mark.parametrize("action", ["complete", "fail", "heartbeat"])
@pytest.mark.parametrize("role", ["producer", "admin"])
def test_producers_and_admins_cannot_complete_fail_or_heartbeat_a_running_job(
        api, producer, worker, admin, action, role):
    job_id = api.enqueue(producer).json["id"]
    claim = api.claim(worker).json
    held = api.get(admin, job_id).json
    attacker = producer if role == "producer" else admin

    response = getattr(api, action)(attacker, job_id, lease_token=claim["lease_token"])

    _assert_problem(response, 403)
    assert api.get(admin, job_id).json == held


def test_a_worker_cannot_take_over_a_job_by_claiming_while_it_is_held(
        api, producer, worker, make_key, admin):
    other = make_key("worker-2", "worker")
    job_id = api.enqueue(producer).json["id"]
    assert api.claim(worker).json["id"] == job_id

    assert api.claim(other).status_code == 204
    assert api.get(admin, job_id).json["worker_id"] == worker.name


# -- V-06 racy claim ---------------------------------------------------------------------------

THREADS = 8
JOBS = 50


def test_concurrent_claims_never_hand_out_one_job_twice_and_claim_every_job(
        app, api, producer, make_key, admin):
    job_ids = {api.enqueue(producer, payload={"n": n}).json["id"] for n in range(JOBS)}
    workers = [make_key(f"racer-{n}", "worker") for n in range(THREADS)]
    start = threading.Barrier(THREADS)
    claimed: dict[str, list[int]] = {key.name: [] for key in workers}
    failures: list[str] = []

    def race(key: Key) -> None:
        client = app.test_client()
        try:
            start.wait()
            while True:
                response = client.post("/jobs/claim", json={}, headers=key.headers)
                if response.status_code == 204:
                    return
                if response.status_code != 200:
                    failures.append(f"{key.name}: {response.status_code} {response.json}")
                    return
                assert response.json["worker_id"] == key.name
                claimed[key.name].append(response.json["id"])
        except Exception as exc:  # reported below; a thread's exception would be lost
            failures.append(f"{key.name}: {exc!r}")

    threads = [threading.Thread(target=race, args=(key,)) for key in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert failures == []
    handed_out = Counter(job_id for ids in claimed.values() for job_id in ids)
    assert [job_id for job_id, times in handed_out.items() if times > 1] == []
    assert set(handed_out) == job_ids
    # Each job is recorded as held by exactly the worker that received it.
    owners = {job["id"]: job["worker_id"] for job in _all_jobs(api, admin)}
    for name, ids in claimed.items():
        for job_id in ids:
            assert owners[job_id] == name
    assert {job["status"] for job in _all_jobs(api, admin)} == {"running"}


# -- V-07 unbounded payload --------------------------------------------------------------------

LIMIT = 65_536
WRAPPER = len('{"data":""}')  # the compact JSON around the string


def _payload_of(size_in_bytes: int, filler: str = "x") -> dict[str, str]:
    """A payload whose compact UTF-8 JSON is exactly `size_in_bytes` long."""
    width = len(filler.encode("utf-8"))
    body = size_in_bytes - WRAPPER
    return {"data": filler * (body // width) + "x" * (body % width)}


def test_a_payload_of_exactly_the_limit_is_accepted_and_one_byte_more_is_refused(
        api, producer, admin):
    at_limit = api.enqueue(producer, payload=_payload_of(LIMIT))
    assert at_limit.status_code == 201
    assert at_limit.json["payload"] == _payload_of(LIMIT)

    problem = _assert_problem(api.enqueue(producer, payload=_payload_of(LIMIT + 1)), 422)
    assert "payload" in problem["errors"]
    assert len(_all_jobs(api, admin)) == 1


@pytest.mark.parametrize("filler", ["\u00e9", "\u20ac", "\U0001f600"], ids=["2-byte", "3-byte",
                                                                         "4-byte"])
def test_multibyte_characters_count_in_bytes_not_characters(api, producer, admin, filler):
    over = _payload_of(LIMIT + 1, filler)
    assert len(over["data"]) < LIMIT // 2  # far under the limit when counted in characters

    _assert_problem(api.enqueue(producer, payload=over), 422)
    accepted = api.enqueue(producer, payload=_payload_of(LIMIT, filler))
    assert accepted.status_code == 201
    assert accepted.json["payload"] == _payload_of(LIMIT, filler)
    assert len(_all_jobs(api, admin)) == 1


def test_an_oversized_result_is_refused_and_the_job_stays_running(
        api, producer, worker, admin):
    job_id = api.enqueue(producer).json["id"]
    token = api.claim(worker).json["lease_token"]
    held = api.get(admin, job_id).json

    problem = _assert_problem(
        api.complete(worker, job_id, lease_token=token, result=_payload_of(LIMIT + 1)), 422)
    assert "result" in problem["errors"]
    assert api.get(admin, job_id).json == held

    done = api.complete(worker, job_id, lease_token=token, result=_payload_of(LIMIT))
    assert done.status_code == 200
    assert done.json["result"] == _payload_of(LIMIT)


def test_a_body_above_max_content_length_is_a_413_problem_and_stores_nothing(
        client, api, producer, admin):
    limit = client.application.config["MAX_CONTENT_LENGTH"]
    assert limit == 1024 * 1024
    body = b'{"type":"email","payload":{"data":"' + b"x" * limit + b'"}}'

    response = client.post("/jobs", data=body, content_type="application/json",
                           headers=producer.headers)

    problem = _assert_problem(response, 413)
    assert problem["type"].endswith("payload-too-large")
    assert _all_jobs(api, admin) == []


def test_the_payload_limit_follows_the_configuration(app_config, app_with):
    _, api, admin = app_with({**app_config, "MAX_PAYLOAD_BYTES": 100})

    assert api.enqueue(admin, payload=_payload_of(100)).status_code == 201
    _assert_problem(api.enqueue(admin, payload=_payload_of(101)), 422)


# -- V-08 SQL injection ------------------------------------------------------------------------

INJECTION = "'; DROP TABLE jobs; --"


def test_sql_metacharacters_are_stored_as_literal_text_and_the_table_survives(
        app_config, app_with, db_url):
    application, api, admin = app_with({**app_config, "JOB_TYPES": JOB_TYPES | {INJECTION}})
    keys = application.extensions["queuelog"].keys
    producer = Key("p-x", keys.create_key("p-x", Role.PRODUCER))
    worker = Key("w-x", keys.create_key("w-x", Role.WORKER))
    payload = {
        "q": "1' OR '1'='1",
        INJECTION: "\"; DELETE FROM jobs WHERE 1=1; --",
        "u": "Robert'); DROP TABLE api_keys;--",
        "c": "/* comment */ UNION SELECT token_digest FROM api_keys",
    }
    idempotency_key = "x' OR 1=1; UPDATE jobs SET status='completed'; --"

    created = api.enqueue(producer, type=INJECTION, payload=payload,
                          headers={"Idempotency-Key": idempotency_key})
    assert created.status_code == 201, created.json
    other = api.enqueue(producer, type="email").json["id"]
    replay = api.enqueue(producer, type=INJECTION, payload=payload,
                         headers={"Idempotency-Key": idempotency_key})

    assert replay.status_code == 200
    assert replay.json["id"] == created.json["id"]
    job = api.get(producer, created.json["id"]).json
    assert job["type"] == INJECTION
    assert job["payload"] == payload
    assert job["idempotency_key"] == idempotency_key

    by_type = api.list(admin, type=INJECTION)
    assert by_type.status_code == 200
    assert [j["id"] for j in by_type.json["jobs"]] == [created.json["id"]]
    assert api.list(admin, type="email' OR '1'='1").json["jobs"] == []
    for status in ("pending' OR '1'='1", "pending; DROP TABLE jobs"):
        _assert_problem(api.list(admin, status=status), 422)
    _assert_problem(api.client.get("/jobs/1%20OR%201=1", headers=admin.headers), 404)

    claimed = api.claim(worker, types=[INJECTION]).json
    assert claimed["id"] == created.json["id"]
    failed = api.fail(worker, claimed["id"], lease_token=claimed["lease_token"],
                      error="x'); DROP TABLE jobs; --")
    assert failed.status_code == 200
    assert api.get(admin, claimed["id"]).json["error"] == "x'); DROP TABLE jobs; --"

    # The tables are still there, with every row, and no row changed behind our back.
    engine = create_engine(db_url)
    try:
        assert {"jobs", "api_keys"} <= set(inspect(engine).get_table_names())
        with engine.connect() as conn:
            rows = conn.execute(select(jobs_table.c.id, jobs_table.c.type, jobs_table.c.status)
                                .order_by(jobs_table.c.id)).all()
    finally:
        engine.dispose()
    assert [tuple(row) for row in rows] == [(created.json["id"], INJECTION, "pending"),
                                           (other, "email", "pending")]
    assert api.list(admin).status_code == 200


# -- V-09 idempotency probing ------------------------------------------------------------------

def test_another_producer_reusing_an_idempotency_key_gets_its_own_job_and_learns_nothing(
        api, make_key, admin):
    alice = make_key("producer-a", "producer")
    mallory = make_key("producer-b", "producer")
    key = {"Idempotency-Key": "order-1234"}
    secret_payload = {"card": "4111-1111-1111-1111"}
    original = api.enqueue(alice, headers=key, type="email", payload=secret_payload)
    assert original.status_code == 201

    # Under the reference design this probe got a 200 with Alice's job.
    probe = api.enqueue(mallory, headers=key, type="pdf", payload={"probe": True})

    assert probe.status_code == 201
    assert "Idempotent-Replayed" not in probe.headers
    assert probe.json["id"] != original.json["id"]
    assert probe.json["type"] == "pdf"
    assert probe.json["payload"] == {"probe": True}
    assert probe.json["status"] == "pending"
    assert "4111" not in probe.get_data(as_text=True)
    # Mallory cannot read Alice's job, nor find it in her list.
    _assert_problem(api.get(mallory, original.json["id"]), 404)
    assert [j["id"] for j in api.list(mallory).json["jobs"]] == [probe.json["id"]]
    # Alice's replay still finds Alice's job, unchanged; Mallory's finds Mallory's.
    replay = api.enqueue(alice, headers=key, type="email", payload=secret_payload)
    assert replay.status_code == 200
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json == original.json
    again = api.enqueue(mallory, headers=key, type="pdf", payload={"probe": True})
    assert again.status_code == 200
    assert again.json["id"] == probe.json["id"]
    # An admin sees both jobs carrying the same key string, one per producer.
    same_key = [j for j in _all_jobs(api, admin) if j["idempotency_key"] == "order-1234"]
    assert sorted(j["id"] for j in same_key) == sorted([original.json["id"], probe.json["id"]])


def test_a_probe_with_the_exact_same_request_creates_a_separate_job(api, make_key, admin):
    alice = make_key("producer-a", "producer")
    mallory = make_key("producer-b", "producer")
    request = {"type": "email", "payload": {"to": "ceo@example.com"}}
    headers = {"Idempotency-Key": "nightly-report"}

    mine = api.enqueue(alice, headers=headers, **request)
    theirs = api.enqueue(mallory, headers=headers, **request)

    assert mine.status_code == theirs.status_code == 201
    assert theirs.json["id"] != mine.json["id"]
    assert "Idempotent-Replayed" not in theirs.headers
    assert len(_all_jobs(api, admin)) == 2


# -- V-10 error disclosure ---------------------------------------------------------------------

SECRETS = {
    "postgres://user:pass@host/db": ("postgres://***@host/db", ["user:pass"]),
    "password=hunter2": ("password=***", ["hunter2"]),
    '"token": "abc-token-value"': ('"token": "***"', ["abc-token-value"]),
    "Authorization: Bearer xyz-bearer-value": ("Authorization: ***", ["xyz-bearer-value"]),
    "api_key: k-api-key-value": ("api_key: ***", ["k-api-key-value"]),
}


def _failed_job(api: Api, producer: Key, worker: Key, error: str, max_retries: int = 0) -> int:
    job_id = api.enqueue(producer, max_retries=max_retries).json["id"]
    claim = api.claim(worker).json
    assert claim["id"] == job_id
    failed = api.fail(worker, job_id, lease_token=claim["lease_token"], error=error,
                      retry_in_seconds=0)
    assert failed.status_code == 200
    assert "error" not in failed.json  # the worker's own answer does not echo it back
    return job_id


def test_secrets_in_a_workers_error_are_stored_redacted(api, producer, worker, admin):
    error = "job failed: " + " | ".join(SECRETS)
    job_id = _failed_job(api, producer, worker, error)

    shown = api.get(admin, job_id).json["error"]

    assert shown.startswith("job failed: ")
    for masked, leaked in SECRETS.values():
        assert masked in shown
        for secret in leaked:
            assert secret not in shown
    listed = next(j for j in _all_jobs(api, admin) if j["id"] == job_id)
    assert listed["error"] == shown


def test_a_long_error_is_cut_to_2000_characters(api, producer, worker, admin):
    job_id = _failed_job(api, producer, worker, "Traceback: " + "x" * 99_000)

    assert len(api.get(admin, job_id).json["error"]) == 2000


def test_producers_and_workers_never_see_the_error_field(api, producer, worker, admin):
    job_id = _failed_job(api, producer, worker, "password=hunter2 at /srv/app/secret.py")

    for key in (producer, worker):
        single = api.get(key, job_id)
        assert single.status_code == 200
        assert "error" not in single.json
        listed = api.list(key)
        assert [j["id"] for j in listed.json["jobs"]] == [job_id]
        assert all("error" not in job for job in listed.json["jobs"])
        assert "/srv/app" not in listed.get_data(as_text=True)
    assert api.get(admin, job_id).json["error"] == "password=*** at /srv/app/secret.py"


def test_the_next_worker_to_claim_a_retried_job_does_not_see_the_previous_error(
        api, producer, worker, make_key, admin):
    job_id = _failed_job(api, producer, worker, "db at postgres://u:p@db/prod refused",
                         max_retries=1)
    other = make_key("worker-2", "worker")

    claim = api.claim(other)

    assert claim.json["id"] == job_id
    assert "error" not in claim.json
    assert api.get(admin, job_id).json["error"] == "db at postgres://***@db/prod refused"
