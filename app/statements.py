"""Hot statements run on SQLite's driver cursor, compiled once per shape.

On SQLite every write of the server runs one after another (one writer, app/writer.py), so
what each statement costs in Python is the serial section of the whole server. SQLAlchemy
Core spends 65-100 µs per execution around a statement that sqlite3 runs in 30-45 µs (the
execution context, parameter processing, the result's metadata). A repository wraps its
hottest statements in `DriverStatement`: the statement stays defined once, in its repository,
as Core; this module only compiles it once per shape of parameters, the way Core itself
would (same dialect, same column keys), and hands the SQL and the values to the driver.

It takes the driver path only where that gives the very same result as Core:
- on SQLite, inside a transaction already begun through SQLAlchemy (so SQLAlchemy still owns
  BEGIN, SAVEPOINT and COMMIT);
- when the compiled statement needs nothing Core would add at execution: no bind or result
  processors, no values computed at execution (Python-side defaults), no parameters
  expanded at execution (IN lists);
- when nobody listens to the connection's cursor events (tests and the storage benchmark
  catch statements that way): they then see every statement, through Core.
Otherwise, and always on PostgreSQL, it runs the statement through Core. Driver errors are
raised as SQLAlchemy's own exception classes, as Core raises them.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement

# (True, name): the caller's parameter `name`; (False, value): a constant SQLAlchemy binds
# itself (a literal in the expression).
_Slot = tuple[bool, Any]


class _Plan:
    """One compiled shape: its SQL and where each positional value comes from (None when the
    shape must run through Core)."""

    __slots__ = ("slots", "sql")

    def __init__(self, sql: str, slots: list[_Slot]) -> None:
        self.sql = sql
        self.slots = slots


class DriverStatement:
    """A Core statement of a repository, run on the driver's cursor where that changes
    nothing but the cost (see the module's docstring). `rows` returns its rows (RETURNING
    or SELECT) as tuples in the statement's column order, or [] for a plain write."""

    __slots__ = ("_lock", "_plans", "statement")

    def __init__(self, statement: ClauseElement) -> None:  # an Executable one
        self.statement: Any = statement
        # Shapes by the parameters' names; None: this shape runs through Core.
        self._plans: dict[tuple[str, ...], _Plan | None] = {}
        self._lock = threading.Lock()

    def rows(self, conn: Connection, params: Mapping[str, Any]) -> Sequence[Sequence[Any]]:
        dispatch = conn.dispatch
        if (conn.dialect.name != "sqlite" or dispatch.before_cursor_execute
                or dispatch.after_cursor_execute or not conn.in_transaction()):
            return self._through_core(conn, params)
        shape = tuple(params)
        try:
            plan = self._plans[shape]
        except KeyError:
            plan = self._compile(conn.dialect, params, shape)
        if plan is None:
            return self._through_core(conn, params)
        values = tuple(params[value] if named else value for named, value in plan.slots)
        driver = conn.connection.driver_connection
        error_class = conn.dialect.loaded_dbapi.Error
        try:
            rows: list[Any] = driver.execute(plan.sql, values).fetchall()  # type: ignore[union-attr]
        except error_class as error:
            raise DBAPIError.instance(plan.sql, values, error, error_class,
                                      dialect=conn.dialect) from error
        return rows

    def first(self, conn: Connection, params: Mapping[str, Any]) -> Sequence[Any] | None:
        rows = self.rows(conn, params)
        return rows[0] if rows else None

    def _through_core(self, conn: Connection, params: Mapping[str, Any]) -> Sequence[Any]:
        result = conn.execute(self.statement, dict(params))
        return result.all() if result.returns_rows else []

    def _compile(self, dialect: Dialect, params: Mapping[str, Any],
                 shape: tuple[str, ...]) -> _Plan | None:
        # Core compiles with the sorted names of the parameters as the column keys.
        compiled = self.statement.compile(dialect=dialect, column_keys=sorted(params))
        plan = _plan_of(compiled, dialect, params) if isinstance(compiled, SQLCompiler) else None
        with self._lock:
            self._plans[shape] = plan
        return plan


def _plan_of(compiled: SQLCompiler, dialect: Dialect, params: Mapping[str, Any]) -> _Plan | None:
    """The driver plan of a compiled shape, or None when Core would add something of its own
    at execution."""
    if (compiled.positiontup is None or compiled.insert_prefetch or compiled.update_prefetch
            or compiled.literal_execute_params or compiled.post_compile_params
            or compiled._bind_processors):
        return None
    for column in compiled._result_columns:
        if column.type._cached_result_processor(dialect, None) is not None:
            return None
    constants = compiled.construct_params(_check=False)
    slots: list[_Slot] = []
    for name in compiled.positiontup:
        if name in params:
            slots.append((True, name))
        elif name in constants and not compiled.binds[name].required:
            slots.append((False, constants[name]))
        else:
            return None  # a parameter Core would refuse as missing: let Core say so
    return _Plan(compiled.string, slots)
