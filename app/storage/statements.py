"""Hot statements run on SQLite's driver cursor, compiled once per shape.

On SQLite every write of the server runs one after another (one writer,
app/storage/group_commit.py), so what each statement costs in Python is the serial section
of the whole server. SQLAlchemy Core spends 65-100 µs per execution around a statement that
sqlite3 runs in 30-45 µs (the execution context, parameter processing, the result's
metadata). A repository wraps its hottest statements in `DriverStatement`: the statement
stays defined once, in its repository, as Core; this module only compiles it once per shape
of parameters, the way Core itself would (same dialect, same column keys), and hands the SQL
and the values to the driver.

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

Many rows at once (a batch's jobs, their events and attempts): `execute_many` hands a write
without RETURNING to the driver's executemany, and `insert_many` sends an INSERT … RETURNING
as multi-row VALUES, the way Core's "insertmanyvalues" batches it. Core compiles a
multi-row INSERT built with `.values([...])` afresh for every call (its SQL depends on the
number of rows), and sends an INSERT … RETURNING that must keep its rows' order one row per
statement on SQLite: on a 1,000-job batch the two cost more than everything else the
request does.

On PostgreSQL, many rows of a plain INSERT go as one JSON document in one statement
(`INSERT … SELECT … FROM json_populate_recordset(NULL::table, :rows) WITH ORDINALITY ORDER
BY ordinality`, written once per shape of rows): Core's insertmanyvalues sends the rows as
VALUES with a sentinel column to keep their order, which PostgreSQL plans and runs five
times slower for 1,000 jobs (183 ms against 34 ms, measured in turns), an executemany sends
a statement per row, and an array per column (unnest) spends as long again in psycopg's
Python quoting each element as the JSON encoder, in C, spends on the whole document (56
against 31 ms). The rows go in in the document's order, so a sequence numbers them in that
order.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, TextClause, text
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

    __slots__ = ("slots", "sql", "values_group")

    def __init__(self, sql: str, slots: list[_Slot], values_group: str | None) -> None:
        self.sql = sql
        self.slots = slots
        # An INSERT's one parenthesised group of VALUES, found once in `sql` (None for other
        # statements): repeated, it makes the multi-row form.
        self.values_group = values_group


class DriverStatement:
    """A Core statement of a repository, run on the driver's cursor where that changes
    nothing but the cost (see the module's docstring). `rows` returns its rows (RETURNING
    or SELECT) as tuples in the statement's column order, or [] for a plain write."""

    __slots__ = ("_lock", "_plans", "_row_documents", "statement")

    def __init__(self, statement: ClauseElement) -> None:  # an Executable one
        self.statement: Any = statement
        # Shapes by the parameters' names; None: this shape runs through Core.
        self._plans: dict[tuple[str, ...], _Plan | None] = {}
        # PostgreSQL's form of a plain INSERT of many rows, by shape (see the module's
        # docstring).
        self._row_documents: dict[tuple[str, ...], TextClause] = {}
        self._lock = threading.Lock()

    def rows(self, conn: Connection, params: Mapping[str, Any]) -> Sequence[Sequence[Any]]:
        plan = self._driver_plan(conn, params)
        if plan is None:
            return self._through_core(conn, params)
        values = tuple(params[value] if named else value for named, value in plan.slots)
        return _fetch_all(conn, plan.sql, values)

    def execute_many(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run the statement (a write without RETURNING) once for each row of parameters,
        all of one shape (the same names), as Core's executemany would."""
        if not rows:
            return
        document = self._document_insert(conn, rows[0])
        if document is not None:
            conn.execute(document, {"rows": _document_of(rows)})
            return
        plan = self._driver_plan(conn, rows[0])
        if plan is None:
            conn.execute(self.statement, [dict(row) for row in rows])
            return
        slots = plan.slots
        values = [tuple(row[value] if named else value for named, value in slots)
                  for row in rows]
        _on_driver(conn, plan.sql, values,
                   lambda driver: driver.executemany(plan.sql, values))

    def insert_many(self, conn: Connection,
                    rows: Sequence[Mapping[str, Any]]) -> list[Sequence[Any]] | None:
        """The statement (an INSERT … RETURNING of one row's VALUES) for every row of
        parameters, all of one shape: on PostgreSQL as one INSERT of a JSON document; on SQLite as
        multi-row VALUES on the driver, in as few statements as the dialect's limits allow
        (insertmanyvalues_page_size rows, and insertmanyvalues_max_parameters values, per
        statement). Returns the RETURNING rows in no particular order (SQLite promises none),
        or None when the rows must go through Core (see the module's docstring), for the
        caller to run them there. Either engine numbers the rows in `rows`' order."""
        if not rows:
            return []
        document = self._document_insert(conn, rows[0])
        if document is not None:
            return list(conn.execute(document, {"rows": _document_of(rows)}).all())
        plan = self._driver_plan(conn, rows[0])
        if plan is None or plan.values_group is None:
            return None
        slots = plan.slots
        dialect = conn.dialect
        per_statement = max(1, min(dialect.insertmanyvalues_page_size,
                                   dialect.insertmanyvalues_max_parameters // len(slots)))
        returned: list[Sequence[Any]] = []
        for first in range(0, len(rows), per_statement):
            chunk = rows[first:first + per_statement]
            sql = plan.sql.replace(plan.values_group,
                                   ", ".join([plan.values_group] * len(chunk)), 1)
            values = tuple(row[value] if named else value
                           for row in chunk for named, value in slots)
            returned += _fetch_all(conn, sql, values)
        return returned

    def _document_insert(self, conn: Connection, params: Mapping[str, Any]) -> TextClause | None:
        """On PostgreSQL, the statement (a plain INSERT: no ON CONFLICT, no SELECT) as one
        INSERT of the rows of a JSON document (`rows`), of `params`' shape, in the document's
        order, with the statement's RETURNING; None otherwise."""
        statement = self.statement
        if (conn.dialect.name != "postgresql" or not statement.is_insert
                or statement._post_values_clause is not None or statement.select is not None):
            return None
        shape = tuple(params)
        try:
            return self._row_documents[shape]
        except KeyError:
            pass
        if not set(shape) <= set(statement.table.c.keys()):
            return None  # Core refuses a name that is no column; let it say so
        # Only the table's own names, quoted, go into the text; every value is in `rows`.
        quote = conn.dialect.identifier_preparer.quote
        table = quote(statement.table.name)
        columns = ", ".join(quote(name) for name in shape)
        sql = (f"INSERT INTO {table} ({columns}) SELECT "  # noqa: S608
               + ", ".join(f"r.{quote(name)}" for name in shape)
               + f" FROM json_populate_recordset(NULL::{table}, CAST(:rows AS json))"
               " WITH ORDINALITY AS r ORDER BY r.ordinality")
        if statement._returning:
            sql += " RETURNING " + ", ".join(quote(column.name)
                                             for column in statement._returning)
        built = text(sql)
        with self._lock:
            self._row_documents[shape] = built
        return built

    def _driver_plan(self, conn: Connection, params: Mapping[str, Any]) -> _Plan | None:
        """The driver plan for `params`' shape, or None when the statement must run through
        Core (see the module's docstring)."""
        dispatch = conn.dispatch
        if (conn.dialect.name != "sqlite" or dispatch.before_cursor_execute
                or dispatch.after_cursor_execute or not conn.in_transaction()):
            return None
        shape = tuple(params)
        try:
            return self._plans[shape]
        except KeyError:
            return self._compile(conn.dialect, params, shape)

    def first(self, conn: Connection, params: Mapping[str, Any]) -> Sequence[Any] | None:
        rows = self.rows(conn, params)
        return rows[0] if rows else None

    def _through_core(self, conn: Connection, params: Mapping[str, Any]) -> Sequence[Any]:
        result = conn.execute(self.statement, dict(params))
        return result.all() if result.returns_rows else []

    def _compile(self, dialect: Dialect, params: Mapping[str, Any],
                 shape: tuple[str, ...]) -> _Plan | None:
        # Core compiles with the sorted names of the parameters as the column keys. An INSERT
        # is compiled as for an executemany, which gives the same SQL and also names its group
        # of VALUES (for insert_many).
        compiled = self.statement.compile(dialect=dialect, column_keys=sorted(params),
                                          for_executemany=bool(self.statement.is_insert))
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
    values_group = None
    many = compiled._insertmanyvalues
    if many is not None and compiled.string.count(f"({many.single_values_expr})") == 1:
        values_group = f"({many.single_values_expr})"
    return _Plan(compiled.string, slots, values_group)


def _document_of(rows: Sequence[Mapping[str, Any]]) -> str:
    """Rows as the JSON document a row-document INSERT reads (their values are text,
    integers and NULLs)."""
    return json.dumps([dict(row) for row in rows], separators=(",", ":"))


def _fetch_all(conn: Connection, sql: str, values: tuple[Any, ...]) -> list[Sequence[Any]]:
    rows: list[Sequence[Any]] = _on_driver(conn, sql, values,
                                           lambda driver: driver.execute(sql, values).fetchall())
    return rows


def _on_driver(conn: Connection, sql: str, values: Any, call: Callable[[Any], Any]) -> Any:
    """`call` on the connection's driver connection; driver errors raised as Core raises
    them (SQLAlchemy's classes)."""
    driver = conn.connection.driver_connection
    error_class = conn.dialect.loaded_dbapi.Error
    try:
        return call(driver)
    except error_class as error:
        raise DBAPIError.instance(sql, values, error, error_class,
                                  dialect=conn.dialect) from error
