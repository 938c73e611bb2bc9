"""What each step of a job costs the database (docs/SCALING.md, What a job costs): the
statements and round trips a plain enqueue, claim, complete and retrying fail send, and what
each feature adds where it acts. A statement added to the hot path fails here; one taken
away is written down here too, so the table stays the truth.

Counted on the app's own engine: every statement the driver is given
(`before_cursor_execute`), and on PostgreSQL the round trips besides them (the BEGIN psycopg
sends before a transaction's first statement, the COMMIT, the pool's pre-ping)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import event

# Statements (and on PostgreSQL round trips) per plain step: a job of a type with no flow
# control, key modes or dependencies, no tags, trace or keys.
PLAIN_STATEMENTS = {
    "sqlite": {"enqueue": 6, "claim": 9, "complete": 8, "fail": 10},
    "postgresql": {"enqueue": 5, "claim": 8, "complete": 7, "fail": 9},
}
PLAIN_ROUND_TRIPS = {"enqueue": 8, "claim": 11, "complete": 10, "fail": 12}


@dataclass
class Sent:
    statements: list[str] = field(default_factory=list)
    round_trips: int = 0

    def shown(self) -> str:
        return "\n".join(" ".join(statement.split())[:120] for statement in self.statements)


@contextmanager
def counting(app: Flask) -> Iterator[Sent]:
    """What the app sends to its database inside the block."""
    engine = app.extensions["queuelog"].db.engine
    postgres = engine.dialect.name == "postgresql"
    sent = Sent()

    def on_statement(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        sent.statements.append(statement)
        sent.round_trips += 1

    def on_begin(_conn: Any) -> None:
        # psycopg sends BEGIN on its own before the first statement; SQLite's BEGIN
        # IMMEDIATE is a statement of its own, counted above.
        sent.round_trips += postgres

    def on_commit(_conn: Any) -> None:
        sent.round_trips += 1

    ping = engine.dialect.do_ping

    def counted_ping(dbapi_connection: Any) -> bool:
        sent.round_trips += 1
        return bool(ping(dbapi_connection))

    listeners: list[tuple[str, Callable[..., None]]] = [
        ("before_cursor_execute", on_statement), ("begin", on_begin), ("commit", on_commit)]
    for name, listener in listeners:
        event.listen(engine, name, listener)
    engine.dialect.do_ping = counted_ping  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        engine.dialect.do_ping = ping  # type: ignore[method-assign]
        for name, listener in listeners:
            event.remove(engine, name, listener)


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

    for step, sent in costs.items():
        assert len(sent.statements) == PLAIN_STATEMENTS[engine][step], (step, sent.shown())
        if engine == "postgresql":
            assert sent.round_trips == PLAIN_ROUND_TRIPS[step], (step, sent.shown())


# What each feature adds to a plain job's enqueue, claim and complete, in statements (the same
# on both engines): at most one where it acts, nothing where it does not.
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
FEATURES: dict[str, tuple[dict[str, Any], dict[str, str], dict[str, int]]] = {
    "tags": ({"tags": ["eu", "vip"]}, {}, {"enqueue": 1, "claim": 0, "complete": 0}),
    "trace context": ({}, {"traceparent": TRACEPARENT},
                      {"enqueue": 1, "claim": 0, "complete": 0}),
    "Idempotency-Key": ({}, {"Idempotency-Key": "order-7"},
                        {"enqueue": 0, "claim": 0, "complete": 0}),
    "timeout and expiry": ({"timeout_seconds": 60, "expires_in_seconds": 3600}, {},
                           {"enqueue": 0, "claim": 0, "complete": 0}),
    "concurrency key": ({"concurrency_key": "tenant-1"}, {},
                        {"enqueue": 0, "claim": 0, "complete": 0}),
    "unique key": ({"unique": {"key": "invoice-7"}}, {},
                   {"enqueue": 0, "claim": 0, "complete": 0}),
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
    assert added == adds, {step: sent.shown() for step, sent in costs.items()}
