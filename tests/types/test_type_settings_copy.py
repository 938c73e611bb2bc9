"""Features pay only when used: a plain job's steps read no job type's row and send nothing
about dependencies (each process keeps a copy of the types' settings), while every rule a
type's settings make still holds across processes as docs/FLOW-CONTROL.md says: a pause or a
cap set through one app instance stops the other's claims at once, a key's ordering applies
at once to a job that carries a key, and a fairness change reaches the other instance's jobs
without a key once its copy is read again."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import event

from app import create_app
from tests.conftest import Api, Key

HOUR = 3600.0


def _touches_type_rows_or_edges(statement: str) -> bool:
    """A statement that reads job_types on its own (the claim's condition on a type's row,
    inside its one statement, is not one) or says anything about dependencies."""
    return statement.lstrip().startswith(("SELECT job_types", "WITH locked")) or (
        "job_dependencies" in statement)


@pytest.fixture
def statements(app: Flask) -> Iterator[list[str]]:
    """What this test's thread sends on the app's engine (the copy's own refreshes, in its
    background thread as where the app is served, are left out)."""
    services = app.extensions["queuelog"]
    services.type_settings.start()
    services.type_settings.refresh()  # its first read, which the thread may not have made yet
    me = threading.get_ident()
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if threading.get_ident() == me:
            seen.append(statement)

    event.listen(services.db.engine, "before_cursor_execute", record)
    yield seen
    event.remove(services.db.engine, "before_cursor_execute", record)
    services.type_settings.stop()


def test_a_plain_jobs_steps_read_no_type_row_and_send_nothing_about_dependencies(
        api, producer, worker, clock, statements):
    sent: dict[str, list[str]] = {}

    def step(name: str, response: Any) -> Any:
        assert response.status_code in (200, 201), response.json
        sent[name] = list(statements)
        statements.clear()
        return response.json

    job = step("enqueue", api.enqueue(producer, max_retries=1))
    claimed = step("claim", api.claim(worker))
    step("fail with a retry", api.fail(worker, job["id"], lease_token=claimed["lease_token"]))
    clock.advance(HOUR)  # past its backoff
    statements.clear()
    again = step("claim of one type", api.claim(worker, types=["email"]))
    assert again["id"] == job["id"]
    step("complete", api.complete(worker, job["id"], lease_token=again["lease_token"]))
    other = step("another enqueue", api.enqueue(producer, max_retries=0))
    claimed = step("claim again", api.claim(worker))
    assert claimed["id"] == other["id"]
    step("fail for good", api.fail(worker, other["id"], lease_token=claimed["lease_token"]))

    assert {name: [s for s in sent_by_step if _touches_type_rows_or_edges(s)]
            for name, sent_by_step in sent.items()} == {name: [] for name in sent}
    assert all(sent.values())  # each step was counted


def test_a_waiting_claims_empty_attempts_read_no_type_row(app, api, producer, worker,
                                                           statements):
    """A long-polling claim woken by work it cannot take (another type's job) tries again
    and finds nothing, as often as such work comes: those attempts read no type's row (its
    wait notices a type put under flow control elsewhere once the copy is read)."""
    enqueued: list[int] = []

    def enqueue_another_type() -> None:
        time.sleep(0.3)
        enqueued.append(Api(app.test_client()).enqueue(producer, type="pdf").status_code)

    helper = threading.Thread(target=enqueue_another_type)
    helper.start()
    waited = api.claim(worker, types=["email"], wait_seconds=1.5)
    helper.join()

    assert (waited.status_code, enqueued) == (204, [201])
    # An attempt takes SQLite's write lock, or locks its candidates on PostgreSQL (its
    # peeks between wakes do neither).
    attempts = [s for s in statements if s == "BEGIN IMMEDIATE" or "FOR UPDATE" in s]
    assert len(attempts) >= 2, statements  # the first attempt, and the one the wake made
    assert [s for s in statements if _touches_type_rows_or_edges(s)] == []


def test_a_job_with_dependents_still_releases_them(api, producer, worker):
    parent = api.enqueue(producer).json["id"]
    child = api.enqueue(producer, depends_on=[parent]).json["id"]
    batch = api.client.post("/jobs/batch", json={"jobs": [
        {"type": "email", "ref": "first"},
        {"type": "email", "depends_on": ["first"]}]}, headers=producer.headers)
    assert batch.status_code in (200, 201), batch.json
    first, second = (item["id"] for item in batch.json["jobs"])
    assert api.get(producer, child).json["status"] == "waiting"

    for expected in (parent, child, first):
        claimed = api.claim(worker, types=["email"]).json
        assert claimed["id"] == expected  # a dependent only once its dependency completed
        assert api.complete(worker, expected,
                            lease_token=claimed["lease_token"]).status_code == 200

    assert api.get(producer, second).json["status"] == "pending"


@pytest.fixture
def other(app_config: dict[str, Any]) -> Iterator[Flask]:
    """A second app instance on the same database (another process, another host), whose
    copy of the settings is never read again on its own during the test."""
    application = create_app(app_config)
    copy = application.extensions["queuelog"].type_settings
    copy.refresh_seconds = HOUR
    copy.refresh()  # read before the changes the tests make
    yield application
    application.extensions["queuelog"].db.engine.dispose()


def _patch(api: Api, admin: Key, body: dict[str, Any]) -> None:
    response = api.client.patch("/types/email", json=body, headers=admin.headers)
    assert response.status_code == 200, response.json


def test_a_pause_or_a_cap_set_through_one_instance_stops_the_others_claims_at_once(
        api, producer, worker, admin, other):
    there = Api(other.test_client())
    api.enqueue(producer)
    api.enqueue(producer)
    assert other.extensions["queuelog"].type_settings.under_flow_control(None) is False

    _patch(api, admin, {"paused": True})
    assert there.claim(worker).status_code == 204
    assert there.claim(worker, types=["email"]).status_code == 204
    assert there.claim(worker, wait_seconds=1).status_code == 204

    _patch(api, admin, {"paused": False, "max_running": 1})
    assert api.claim(worker).status_code == 200  # the one job the cap allows
    assert there.claim(worker).status_code == 204
    assert there.claim(worker, types=["email"]).status_code == 204

    _patch(api, admin, {"max_running": None})
    assert there.claim(worker).status_code == 200


def test_ordering_set_through_one_instance_holds_the_others_keyed_jobs_at_once(
        api, producer, admin, other):
    there = Api(other.test_client())
    there.enqueue(producer, type="pdf")  # its copy read before the change
    _patch(api, admin, {"ordering": "key"})

    first = there.enqueue(producer, concurrency_key="k").json
    second = there.enqueue(producer, concurrency_key="k").json

    assert (first["status"], second["status"]) == ("pending", "waiting")


def test_ordering_set_through_one_instance_passes_the_turn_at_the_others_complete(
        api, producer, worker, admin, other):
    """The other instance's copy still shows the type without key modes; its complete of a
    keyed job (one statement on PostgreSQL for a type without them) finds the ordering itself
    and passes the key's turn on."""
    there = Api(other.test_client())
    there.enqueue(producer, type="pdf")  # its copy read before the change
    _patch(api, admin, {"ordering": "key"})
    first = there.enqueue(producer, concurrency_key="k").json
    second = there.enqueue(producer, concurrency_key="k").json
    claimed = there.claim(worker, types=["email"]).json
    assert claimed["id"] == first["id"]

    done = there.complete(worker, first["id"], lease_token=claimed["lease_token"])

    assert done.json["status"] == "completed"
    assert api.get(producer, second["id"]).json["status"] == "pending"
    assert there.claim(worker, types=["email"]).json["id"] == second["id"]


def test_fairness_set_through_one_instance_reaches_the_others_jobs_once_its_copy_is_read(
        api, producer, worker, admin, other):
    there = Api(other.test_client())
    copy = other.extensions["queuelog"].type_settings
    there.enqueue(producer, type="pdf")  # its copy read before the change
    _patch(api, admin, {"fairness": "key"})
    keyless = there.enqueue(producer).json["id"]  # on the copy as it was

    copy.tick()  # what its background thread does each second

    claimed = api.claim(worker, types=["email"])
    assert claimed.status_code == 200 and claimed.json["id"] == keyless
