"""What each step of a job costs the database (docs/SCALING.md, What a job costs): the
statements and round trips a plain enqueue, claim, complete and fail (a retry, and a failure
for good) send, and what each feature adds where it acts. A statement added to the hot path
fails here; one taken away is written down here too, so the table stays the truth.

Counted on the app's own engine: every statement the driver is given
(`before_cursor_execute`), and on PostgreSQL the round trips besides them (the BEGIN psycopg
sends before a transaction's first statement, the COMMIT, a ping). A step that is one
statement runs in autocommit there: one round trip."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from flask import Flask

from app.storage.statement_count import Sent
from app.storage.statement_count import counting as counting_on

# Statements (and on PostgreSQL round trips) per plain step: a job of a type with no flow
# control, key modes or dependencies, no tags, trace or keys. On SQLite BEGIN IMMEDIATE is one
# of the statements; on PostgreSQL a step that is one statement runs in autocommit. A fail
# (a retry, or a failure for good) still writes the attempt it ends, its events and its
# failure group: on PostgreSQL in its one statement, on SQLite in a read of the job and a
# statement per table.
PLAIN_STATEMENTS = {
    "sqlite": {"enqueue": 2, "claim": 2, "complete": 2, "fail": 6, "fail for good": 6},
    "postgresql": {"enqueue": 1, "claim": 1, "complete": 1, "fail": 1, "fail for good": 1},
}
PLAIN_ROUND_TRIPS = {"enqueue": 1, "claim": 1, "complete": 1, "fail": 1, "fail for good": 1}


@pytest.fixture(autouse=True)
def settings_kept_fresh(app: Flask) -> Iterator[None]:
    """The type settings' copy kept by its thread, as where the app is served: a copy read
    more than a second ago is not trusted otherwise, and a step of a loaded machine can take
    that long (its transaction then reads the settings, as without a copy)."""
    copy = app.extensions["queuelog"].type_settings
    copy.refresh()
    copy.start()
    yield
    copy.stop()


@contextmanager
def counting(app: Flask) -> Iterator[Sent]:
    """What the app sends to its database inside the block (app/storage/statement_count.py)."""
    with counting_on(app.extensions["queuelog"].db.engine) as sent:
        yield sent


def _engine(app: Flask) -> str:
    return str(app.extensions["queuelog"].db.engine.dialect.name)


def _warm(api: Any, producer: Any, worker: Any) -> None:
    """One lifecycle first: statements compiled, caches filled, the key seen."""
    job = api.enqueue(producer).json
    claimed = api.claim(worker).json
    assert claimed["id"] == job["id"]
    assert api.complete(worker, job["id"], lease_token=claimed["lease_token"]).status_code == 200


def test_a_plain_job_costs_what_the_table_says(app: Flask, api: Any, producer: Any,
                                               worker: Any, clock: Any) -> None:
    _warm(api, producer, worker)
    engine = _engine(app)
    costs: dict[str, Sent] = {}
    with counting(app) as costs["enqueue"]:
        job = api.enqueue(producer, max_retries=3).json
    with counting(app) as costs["claim"]:
        claimed = api.claim(worker).json
    assert claimed["id"] == job["id"]
    with counting(app) as costs["fail"]:
        failed = api.fail(worker, job["id"], lease_token=claimed["lease_token"])
    assert failed.json["status"] == "pending"
    clock.advance(3600)  # past the retry's backoff
    claimed = api.claim(worker).json
    with counting(app) as costs["complete"]:
        done = api.complete(worker, job["id"], lease_token=claimed["lease_token"])
    assert done.json["status"] == "completed"
    last = api.enqueue(producer, max_retries=0).json
    claimed = api.claim(worker).json
    assert claimed["id"] == last["id"]
    with counting(app) as costs["fail for good"]:
        failed = api.fail(worker, last["id"], lease_token=claimed["lease_token"])
    assert failed.json["status"] == "failed"

    for step, sent in costs.items():
        assert len(sent.statements) == PLAIN_STATEMENTS[engine][step], (step, sent.shown())
        if engine == "postgresql":
            assert sent.round_trips == PLAIN_ROUND_TRIPS[step], (step, sent.shown())
            # No pre-ping, and the caller's key confirmed by the step's own statement.
            assert sent.counts["ping"] == 0 and not sent.reads_keys(), (step, sent.shown())


@pytest.mark.parametrize("engine_name", ["postgresql"], indirect=True)
def test_a_heartbeat_is_one_round_trip(engine_name: str, api: Any, app: Flask, producer: Any,
                                       worker: Any) -> None:
    _warm(api, producer, worker)
    job_id = api.enqueue(producer).json["id"]
    claimed = api.claim(worker).json
    with counting(app) as heartbeat:
        assert api.heartbeat(worker, job_id,
                             lease_token=claimed["lease_token"]).status_code == 200
    assert heartbeat.round_trips == 1, heartbeat.shown()
    assert heartbeat.counts["autocommit"] == 1


# What each feature adds to a plain job's enqueue, claim and complete, in statements (the same
# on both engines): at most one where it acts, nothing where it does not.
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
NOTHING = {"enqueue": 0, "claim": 0, "complete": 0}
# What each feature adds, in statements, to a plain job's enqueue, claim and complete, by
# engine. A concurrency key's enqueue reads its type's key modes in the transaction (a fair or
# ordered type's job joins its key); its complete on PostgreSQL is the plain one statement,
# which finds the type without key modes itself, and on SQLite reads them in its transaction.
FEATURES: dict[str, tuple[dict[str, Any], dict[str, str], dict[str, dict[str, int]]]] = {
    "tags": ({"tags": ["eu", "vip"]}, {},
             {"sqlite": {**NOTHING, "enqueue": 1}, "postgresql": {**NOTHING, "enqueue": 1}}),
    "trace context": ({}, {"traceparent": TRACEPARENT},
                      {"sqlite": {**NOTHING, "enqueue": 1},
                       "postgresql": {**NOTHING, "enqueue": 1}}),
    "Idempotency-Key": ({}, {"Idempotency-Key": "order-7"},
                        {"sqlite": NOTHING, "postgresql": NOTHING}),
    "timeout and expiry": ({"timeout_seconds": 60, "expires_in_seconds": 3600}, {},
                           {"sqlite": NOTHING, "postgresql": NOTHING}),
    "concurrency key": ({"concurrency_key": "tenant-1"}, {},
                        {"sqlite": {**NOTHING, "enqueue": 1, "complete": 1},
                         "postgresql": {**NOTHING, "enqueue": 1}}),
    "unique key": ({"unique": {"key": "invoice-7"}}, {},
                   {"sqlite": NOTHING, "postgresql": NOTHING}),
}


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_a_feature_adds_only_where_it_acts(app: Flask, api: Any, producer: Any, worker: Any,
                                           feature: str) -> None:
    _warm(api, producer, worker)
    engine = _engine(app)
    body, headers, adds = FEATURES[feature]
    costs: dict[str, Sent] = {}
    with counting(app) as costs["enqueue"]:
        job = api.enqueue(producer, headers, **body)
    assert job.status_code == 201, job.json
    with counting(app) as costs["claim"]:
        claimed = api.claim(worker).json
    assert claimed["id"] == job.json["id"]
    with counting(app) as costs["complete"]:
        done = api.complete(worker, claimed["id"], lease_token=claimed["lease_token"])
    assert done.json["status"] == "completed"
    added = {step: len(sent.statements) - PLAIN_STATEMENTS[engine][step]
             for step, sent in costs.items()}
    assert added == adds[engine], {step: sent.shown() for step, sent in costs.items()}


def test_a_claim_from_positions_is_the_plain_claims_cost(app: Flask, api: Any, producer: Any,
                                                          worker: Any, admin: Any,
                                                          clock: Any) -> None:
    """While a held snapshot puts claims on positions (docs/SCALING.md, "A held snapshot"),
    a claim reads from them and, should they find nothing, from the front, in its one
    statement: whether it finds a job ahead of them or behind them."""
    _warm(api, producer, worker)
    engine = _engine(app)
    behind = api.enqueue(producer, max_retries=0).json["id"]
    assert api.claim(worker).json["id"] == behind
    assert api.fail(worker, behind).json["status"] == "failed"
    ahead = [api.enqueue(producer).json["id"] for _ in range(2)]
    clock.advance(60)
    app.extensions["queuelog"].jobs.claim_positions.horizon_held()
    assert api.claim(worker).json["id"] == ahead[0]  # the front's read
    costs: dict[str, Sent] = {}
    with counting(app) as costs["ahead"]:
        assert api.claim(worker).json["id"] == ahead[1]
    assert api.retry(admin, behind).status_code == 200  # pending again, behind the positions
    with counting(app) as costs["behind"]:
        assert api.claim(worker).json["id"] == behind
    for case, sent in costs.items():
        assert len(sent.statements) == PLAIN_STATEMENTS[engine]["claim"], (case, sent.shown())
        assert any("UNION ALL" in sql for sql in sent.statements), (case, sent.shown())
        if engine == "postgresql":
            assert sent.round_trips == PLAIN_ROUND_TRIPS["claim"], (case, sent.shown())


def test_a_breaker_and_a_retry_budget_add_nothing_until_they_act(
        app: Flask, api: Any, producer: Any, worker: Any, admin: Any) -> None:
    """A type with a circuit breaker (closed) and a retry budget: its jobs' enqueue, claim,
    complete and failure for good cost what a plain job's do (docs/FLOW-CONTROL.md, "A type
    that protects itself"); only a retry, where the budget acts, pays for its slot."""
    _warm(api, producer, worker)
    engine = _engine(app)
    protected = api.client.patch("/types/email", headers=admin.headers,
                                 json={"circuit": {}, "retry_budget": {}})
    assert protected.status_code == 200, protected.json
    costs: dict[str, Sent] = {}
    with counting(app) as costs["enqueue"]:
        job = api.enqueue(producer, max_retries=0).json
    with counting(app) as costs["claim"]:
        claimed = api.claim(worker).json
    with counting(app) as costs["fail for good"]:
        failed = api.fail(worker, job["id"], lease_token=claimed["lease_token"])
    assert failed.json["status"] == "failed"
    job = api.enqueue(producer).json
    claimed = api.claim(worker).json
    with counting(app) as costs["complete"]:
        done = api.complete(worker, job["id"], lease_token=claimed["lease_token"])
    assert done.json["status"] == "completed"
    for step, sent in costs.items():
        assert len(sent.statements) == PLAIN_STATEMENTS[engine][step], (step, sent.shown())
    retried = api.enqueue(producer, max_retries=3).json
    claimed = api.claim(worker).json
    with counting(app) as retry:
        assert api.fail(worker, retried["id"],
                        lease_token=claimed["lease_token"]).json["status"] == "pending"
    # Its slot: the type's row locked and read, the window's first attempts, the schedule.
    assert len(retry.statements) > PLAIN_STATEMENTS[engine]["fail"], retry.shown()


def test_aging_costs_no_statement_and_leaves_a_type_without_it_as_it_was(
        app: Flask, api: Any, producer: Any, worker: Any, admin: Any) -> None:
    """A type with priority aging: its jobs' enqueue, claim and complete cost what a plain
    job's do (the aged order is read by the claim's own statement: docs/FLOW-CONTROL.md,
    "Priority aging"); and where no type ages, the claim's statement is the plain one."""
    _warm(api, producer, worker)
    job = api.enqueue(producer, type="pdf").json  # the other type's first claim noted too
    claimed = api.claim(worker).json
    api.complete(worker, job["id"], lease_token=claimed["lease_token"])
    engine = _engine(app)
    with counting(app) as plain:
        api.claim(worker)
    aged = api.client.patch("/types/email", headers=admin.headers, json={"aging_seconds": 60})
    assert aged.status_code == 200, aged.json
    costs: dict[str, Sent] = {}
    for job_type in ("email", "pdf"):
        with counting(app) as costs[f"enqueue {job_type}"]:
            job = api.enqueue(producer, type=job_type).json
        with counting(app) as costs[f"claim {job_type}"]:
            claimed = api.claim(worker).json
        assert claimed["id"] == job["id"]
        with counting(app) as costs[f"complete {job_type}"]:
            done = api.complete(worker, job["id"], lease_token=claimed["lease_token"])
        assert done.json["status"] == "completed"
    for step, sent in costs.items():
        assert len(sent.statements) == PLAIN_STATEMENTS[engine][step.split()[0]], (
            step, sent.shown())
    # Without an aging type the claim reads no level range; with one, it does.
    assert "priority = 0" not in " ".join(plain.statements)
    assert "priority = 0" in " ".join(costs["claim pdf"].statements)


def test_a_label_rides_in_the_statement_each_step_already_sends(
        app: Flask, api: Any, producer: Any, worker: Any, clock: Any) -> None:
    """A worker's instance label (docs/API.md, GET /workers) is a value bound into the
    claim's own UPDATE, and its claims and heartbeats are counted in memory, written at most
    once a minute beside a request: a claim and a heartbeat with a label cost what plain ones
    do, on PostgreSQL one round trip each."""
    label = {"instance": "host-a.example:4242"}
    job = api.enqueue(producer).json
    claimed = api.claim(worker, **label).json  # the key and its instance noted this minute
    assert api.complete(worker, job["id"], lease_token=claimed["lease_token"]).status_code == 200
    engine = _engine(app)
    job = api.enqueue(producer).json
    costs: dict[str, Sent] = {}
    with counting(app) as costs["claim"]:
        claimed = api.claim(worker, **label).json
    assert claimed["id"] == job["id"]
    assert any("worker_instance" in sql for sql in costs["claim"].statements)
    with counting(app) as heartbeat:
        assert api.heartbeat(worker, job["id"], lease_token=claimed["lease_token"],
                             **label).status_code == 200
    with counting(app) as costs["complete"]:
        done = api.complete(worker, job["id"], lease_token=claimed["lease_token"])
    assert done.json["status"] == "completed"
    for step, sent in costs.items():
        assert len(sent.statements) == PLAIN_STATEMENTS[engine][step], (step, sent.shown())
        if engine == "postgresql":
            assert sent.round_trips == PLAIN_ROUND_TRIPS[step], (step, sent.shown())
    if engine == "postgresql":
        assert heartbeat.round_trips == 1, heartbeat.shown()
    else:
        assert len(heartbeat.statements) == 2, heartbeat.shown()  # BEGIN IMMEDIATE, UPDATE
    # The minute over, the first claim of the next one writes what the last one counted,
    # beside its own statement (as the key's own note, once a minute, does).
    clock.advance(60)
    with counting(app) as later:
        assert api.claim(worker, **label).status_code == 204
    assert sum("worker_instances" in sql for sql in later.statements) == 1, later.shown()


def _claimed_batch(api: Any, producer: Any, worker: Any, count: int) -> list[dict[str, Any]]:
    jobs = [api.enqueue(producer).json["id"] for _ in range(count)]
    claimed = api.client.post("/jobs/claim-many", json={"max_jobs": count},
                              headers=worker.headers).json["jobs"]
    assert sorted(job["id"] for job in claimed) == jobs
    return [{"id": job["id"], "lease_token": job["lease_token"]} for job in claimed]


# complete-many of plain jobs: one statement for all of them (app/jobs/usecases/
# bulk_complete.py), the caller's key confirmed inside it; on SQLite BEGIN IMMEDIATE besides
# (before it: a statement per job, 5 and 7 round trips on PostgreSQL for 5 jobs, 6 statements
# on SQLite). With one item refused, PostgreSQL's one-statement attempt (all or nothing)
# finds it and the work runs in a transaction: that statement again, then the refused
# item's own path (its UPDATE, and the reads saying why), as a lone complete refused runs
# its statement again in a transaction: 5 statements, 7 round trips on PostgreSQL (before: 7
# and 9), BEGIN IMMEDIATE and 4 on SQLite (before: 9). The refusal's record, in a
# transaction of its own once the request's has committed, adds what it did before: 6
# statements and 8 round trips on PostgreSQL, BEGIN IMMEDIATE and 6 on SQLite.
COMPLETE_MANY_STATEMENTS = {"sqlite": {"plain": 2, "one refused": 5 + 7},
                            "postgresql": {"plain": 1, "one refused": 5 + 6}}
COMPLETE_MANY_ROUND_TRIPS = {"plain": 1, "one refused": 7 + 8}


def test_complete_many_of_plain_jobs_is_one_statement(app: Flask, api: Any, producer: Any,
                                                      worker: Any) -> None:
    _warm(api, producer, worker)
    engine = _engine(app)
    costs: dict[str, Sent] = {}
    items = _claimed_batch(api, producer, worker, 5)
    with counting(app) as costs["plain"]:
        done = api.client.post("/jobs/complete-many", json={"items": items},
                               headers=worker.headers)
    assert [r["status"] for r in done.json["results"]] == [200] * 5
    items = _claimed_batch(api, producer, worker, 5)
    items[2]["lease_token"] = "stale"
    with counting(app) as costs["one refused"]:
        done = api.client.post("/jobs/complete-many", json={"items": items},
                               headers=worker.headers)
    assert [r["status"] for r in done.json["results"]] == [200, 200, 409, 200, 200]
    for case, sent in costs.items():
        assert len(sent.statements) == COMPLETE_MANY_STATEMENTS[engine][case], (
            case, sent.shown())
        if engine == "postgresql":
            assert sent.round_trips == COMPLETE_MANY_ROUND_TRIPS[case], (case, sent.shown())
            assert sent.counts["ping"] == 0 and not sent.reads_keys(), (case, sent.shown())
