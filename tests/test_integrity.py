"""app/storage/integrity.py: an IntegrityError named by its unique index, on either engine's
wording, and translated into the domain error that index stands for."""

from __future__ import annotations

import sqlite3
from types import SimpleNamespace

import pytest
from sqlalchemy.exc import IntegrityError

from app.core.errors import IdempotencyKeyTaken, ScheduleNameTaken, SlotTaken, UniqueScopeHeld
from app.storage.integrity import constraint_name, translated, unique_indexes_translated


def sqlite_error(message: str) -> IntegrityError:
    return IntegrityError("INSERT …", {}, sqlite3.IntegrityError(message))


def postgres_error(constraint: str) -> IntegrityError:
    orig = Exception(f'duplicate key value violates unique constraint "{constraint}"')
    orig.diag = SimpleNamespace(constraint_name=constraint)  # type: ignore[attr-defined]
    return IntegrityError("INSERT …", {}, orig)


@pytest.mark.parametrize(("columns", "index", "domain_error"), [
    ("jobs.producer, jobs.idempotency_key", "uq_jobs_producer_idempotency_key",
     IdempotencyKeyTaken),
    ("jobs.producer, jobs.unique_scope", "uq_jobs_producer_unique_scope", UniqueScopeHeld),
    ("jobs.schedule, jobs.scheduled_for", "uq_jobs_schedule_scheduled_for", SlotTaken),
    ("schedules.name", "pk_schedules", ScheduleNameTaken),
])
def test_each_engine_names_the_index_and_its_domain_error(columns, index, domain_error):
    for error in (sqlite_error(f"UNIQUE constraint failed: {columns}"), postgres_error(index)):
        assert constraint_name(error) == index
        assert isinstance(translated(error), domain_error)


def test_another_integrity_error_is_left_as_it_is():
    for error in (sqlite_error("FOREIGN KEY constraint failed"),
                  sqlite_error("UNIQUE constraint failed: nowhere.nothing"),
                  postgres_error("fk_job_events_job_id_jobs")):
        assert translated(error) is error
        with pytest.raises(IntegrityError), unique_indexes_translated():
            raise error


def test_the_domain_error_keeps_the_database_error_as_its_cause():
    error = sqlite_error("UNIQUE constraint failed: jobs.schedule, jobs.scheduled_for")
    with pytest.raises(SlotTaken) as raised, unique_indexes_translated():
        raise error
    assert raised.value.__cause__ is error
