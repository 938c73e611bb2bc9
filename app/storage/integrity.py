"""Database integrity errors, named by the unique index that raised them and translated
into the domain's errors (app/core/errors.py) at the storage boundary.

PostgreSQL names the constraint (`diag.constraint_name`). SQLite names the columns in its
message ("UNIQUE constraint failed: jobs.producer, jobs.idempotency_key"); they are mapped
back to the index through the schema's metadata, so no message text is written here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, Index, PrimaryKeyConstraint, UniqueConstraint
from sqlalchemy.exc import IntegrityError

from app.core.errors import (
    IdempotencyKeyTaken,
    ScheduleNameTaken,
    SlotTaken,
    UniqueIndexRefused,
    UniqueScopeHeld,
)
from app.storage.schema import metadata

# The unique indexes a domain error stands for, by name.
_REFUSED_BY: dict[str, type[UniqueIndexRefused]] = {
    "uq_jobs_producer_idempotency_key": IdempotencyKeyTaken,
    "uq_jobs_producer_unique_scope": UniqueScopeHeld,
    "uq_jobs_schedule_scheduled_for": SlotTaken,
    "pk_schedules": ScheduleNameTaken,
}

_SQLITE_UNIQUE = "UNIQUE constraint failed: "


def _names_by_columns() -> dict[tuple[str, ...], str]:
    """Every named unique index or constraint (primary keys included) of the schema, by its
    "table.column"s."""
    named: dict[tuple[str, ...], str] = {}
    for table in metadata.tables.values():
        uniques: list[Index | UniqueConstraint | PrimaryKeyConstraint] = [
            index for index in table.indexes if index.unique]
        uniques += [constraint for constraint in table.constraints
                    if isinstance(constraint, UniqueConstraint | PrimaryKeyConstraint)]
        for unique in uniques:
            if isinstance(unique.name, str):
                named[tuple(f"{table.name}.{column.name}" for column in unique.columns)] = \
                    unique.name
    return named


_NAMES_BY_COLUMNS = _names_by_columns()


def constraint_name(error: IntegrityError) -> str | None:
    """The unique index or constraint `error` names; None for any other integrity error (a
    foreign key, NOT NULL) or one not of the schema."""
    name = getattr(getattr(error.orig, "diag", None), "constraint_name", None)
    if isinstance(name, str):
        return name
    message = str(error.orig)
    if not message.startswith(_SQLITE_UNIQUE):
        return None
    columns = tuple(column.strip() for column in message[len(_SQLITE_UNIQUE):].split(","))
    return _NAMES_BY_COLUMNS.get(columns)


def translated(error: IntegrityError) -> Exception:
    """The domain error for `error` (raise it `from error`), or `error` itself when no domain
    error stands for the index it names."""
    refused = _REFUSED_BY.get(constraint_name(error) or "")
    return error if refused is None else refused(str(error.orig).splitlines()[0])


@contextmanager
def unique_indexes_translated() -> Iterator[None]:
    """Raise the domain error for an IntegrityError a unique index of the schema raises."""
    try:
        yield
    except IntegrityError as error:
        refused = translated(error)
        if refused is error:
            raise
        raise refused from error


@contextmanager
def refused_in_savepoint(conn: Connection) -> Iterator[None]:
    """Run the block in a savepoint, so that a unique index's refusal undoes the block alone
    and the transaction goes on; the refusal is raised as its domain error."""
    with unique_indexes_translated(), conn.begin_nested():
        yield
