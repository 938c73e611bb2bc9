"""The enqueue rules on a fake unit of work (tests/jobs/fakes.py): idempotent replay, and a
unique key's return, replace and reject, decided without a database."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from app.core.callers import Caller, Role
from app.core.clock import ManualClock
from app.core.errors import UniqueConflict, ValidationFailed
from app.core.priorities import Priority
from app.jobs.domain.intake import IntakeRules, new_job
from app.jobs.domain.uniqueness import Deduplicated
from app.jobs.usecases.enqueue import Enqueuing
from app.jobs.wake.waiting import JobSignal
from tests.jobs.fakes import FakeUnitOfWork

PRODUCER = Caller("shop", Role.PRODUCER, Priority.CRITICAL, None)


@pytest.fixture
def uow() -> FakeUnitOfWork:
    return FakeUnitOfWork()


@pytest.fixture
def enqueuing(uow: FakeUnitOfWork) -> Enqueuing:
    return Enqueuing(uow, ManualClock(start_us=1_800_000_000_000_000),  # type: ignore[arg-type]
                     IntakeRules(frozenset({"email"}), 65_536), JobSignal())


def request(**fields: Any) -> dict[str, Any]:
    return {"type": "email", "payload": {"to": "a@example.com"}, "max_retries": 3, **fields}


def test_a_repeated_idempotency_key_replays_the_job_it_made(enqueuing, uow):
    first = enqueuing.enqueue(PRODUCER, request(idempotency_key="k1"))
    again = enqueuing.enqueue(PRODUCER, request(idempotency_key="k1"))
    assert first.created and again.replayed and not again.created
    assert again.job == first.job
    assert list(uow.jobs.rows) == [first.job.id]
    assert uow.told == [("enqueued", 1)]


def test_an_idempotency_key_reused_with_another_request_is_refused(enqueuing, uow):
    enqueuing.enqueue(PRODUCER, request(idempotency_key="k1"))
    with pytest.raises(ValidationFailed) as refused:
        enqueuing.enqueue(PRODUCER, request(idempotency_key="k1", payload={"to": "b"}))
    assert refused.value.errors == {"idempotency_key": ["Already used with a different request."]}
    assert len(uow.jobs.rows) == 1


def test_a_unique_twin_is_returned_and_told_on_its_timeline(enqueuing, uow):
    first = enqueuing.enqueue(PRODUCER, request(unique={"key": "u"}))
    twin = enqueuing.enqueue(PRODUCER, request(unique={"key": "u"}, payload={"to": "b"}))
    assert twin.deduplicated is Deduplicated.RETURNED and twin.job == first.job
    assert uow.timeline.told[-1] == ("deduplicated", [first.job.id], {"actor": "shop"})
    assert uow.told == [("enqueued", 1)]


def test_a_unique_replace_gives_the_pending_twin_the_new_request(enqueuing, uow):
    first = enqueuing.enqueue(PRODUCER, request(unique={"key": "u", "on_conflict": "replace"}))
    twin = enqueuing.enqueue(PRODUCER, request(unique={"key": "u", "on_conflict": "replace"},
                                               payload={"to": "b"}, priority=Priority.HIGH))
    assert twin.deduplicated is Deduplicated.REPLACED and twin.job.id == first.job.id
    assert uow.jobs.rows[first.job.id].payload == '{"to":"b"}'
    assert uow.jobs.rows[first.job.id].priority == Priority.HIGH
    assert uow.timeline.told[-1][0] == "replace"


def test_a_unique_reject_refuses_with_the_twin_and_stores_nothing(enqueuing, uow):
    first = enqueuing.enqueue(PRODUCER, request(unique={"key": "u", "on_conflict": "reject"}))
    with pytest.raises(UniqueConflict) as refused:
        enqueuing.enqueue(PRODUCER, request(unique={"key": "u", "on_conflict": "reject"}))
    assert refused.value.existing_job_id == first.job.id
    assert list(uow.jobs.rows) == [first.job.id]


def test_a_batch_item_meets_an_earlier_item_as_a_stored_job(enqueuing, uow):
    results = enqueuing.enqueue_many(PRODUCER, [request(idempotency_key="k"),
                                                request(idempotency_key="k"),
                                                request(unique={"key": "u"}),
                                                request(unique={"key": "u"})])
    assert [r.created for r in results] == [True, False, True, False]
    assert results[1].replayed and results[1].job == results[0].job
    assert results[3].deduplicated is Deduplicated.RETURNED
    assert uow.told == [("enqueued", 2)]


def test_a_slot_with_its_job_is_none_and_a_reject_still_refuses(enqueuing, uow):
    def slot_job(slot: int, **fields: Any) -> Any:
        new = new_job(enqueuing.intake, PRODUCER, request(**fields), None, 1)
        return dataclasses.replace(new, values={**new.values, "schedule": "daily",
                                                "scheduled_for": slot})

    stored = uow.run(lambda tx: enqueuing.enqueue_in(tx, slot_job(1), actor="schedule:daily"))
    assert stored is not None and stored.created
    assert uow.run(lambda tx: enqueuing.enqueue_in(tx, slot_job(1),
                                                   actor="schedule:daily")) is None
    unique = {"key": "u", "on_conflict": "reject"}
    uow.run(lambda tx: enqueuing.enqueue_in(tx, slot_job(2, unique=unique), actor="s"))
    with pytest.raises(UniqueConflict):
        uow.run(lambda tx: enqueuing.enqueue_in(tx, slot_job(3, unique=unique), actor="s"))
    assert len(uow.jobs.rows) == 2
