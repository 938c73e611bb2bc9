"""The data the benchmarks start from: scratch directories, migrated SQLite files and
PostgreSQL databases, keys, and the jobs the HTTP benchmarks send."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from bench.load import Client

JOB_TYPES = "email,report"
# With this set to a PostgreSQL server URL, the benchmarks that compare engines measure
# PostgreSQL too, each in databases of its own, dropped afterwards.
POSTGRES_VARIABLE = "QUEUELOG_BENCH_POSTGRES_URL"


def sqlite_url(path: str | Path) -> str:
    return f"sqlite:///{path}"


def migrated_database(directory: str | Path, name: str = "queuelog.sqlite3") -> str:
    """A fresh SQLite file at the newest migration; returns its URL."""
    from app.storage.migrations import upgrade

    url = sqlite_url(Path(directory) / name)
    upgrade(url)
    return url


def create_keys(url: str, keys: Mapping[str, str]) -> dict[str, str]:
    """Create keys {name: role} in the database and return {name: token}."""
    from app import create_app
    from app.core.callers import Role

    app = create_app({"DATABASE_URL": url, "JOB_TYPES": JOB_TYPES})
    services = app.extensions["queuelog"]
    try:
        return {name: services.keys.create_key(name, Role(role)) for name, role in keys.items()}
    finally:
        services.db.engine.dispose()


@contextlib.contextmanager
def scratch_directory(prefix: str) -> Iterator[str]:
    """A temporary directory beside the others, removed however the run ends."""
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# The tables a queue churns (migration 0011 sets their storage parameters).
CHURNED_TABLES = ("jobs", "job_attempts", "job_events")


class StandInAutovacuum:
    """What autovacuum would do, for a server that runs with autovacuum = off (test servers
    often do; production ones must not). Every naptime it applies autovacuum's own rule to
    each churned table, with the table's storage parameters or the server's defaults:
    VACUUM once dead rows exceed threshold + scale factor x rows, ANALYZE once rows changed
    since the last analyze exceed its pair; and it runs them throttled as autovacuum does
    (autovacuum_vacuum_cost_delay and _cost_limit), not at a manual VACUUM's full speed. A
    server with autovacuum on is left alone."""

    def __init__(self, url: str) -> None:
        from sqlalchemy import create_engine, text

        self.engine = create_engine(url, isolation_level="AUTOCOMMIT")
        with self.engine.connect() as conn:
            self.active = conn.execute(text("SHOW autovacuum")).scalar() == "off"
            settings = {name: float(value) for name, value in conn.execute(text(
                "SELECT name, setting FROM pg_settings WHERE name IN"
                " ('autovacuum_vacuum_scale_factor', 'autovacuum_vacuum_threshold',"
                " 'autovacuum_analyze_scale_factor', 'autovacuum_analyze_threshold',"
                " 'autovacuum_naptime', 'autovacuum_vacuum_cost_delay',"
                " 'autovacuum_vacuum_cost_limit', 'vacuum_cost_limit')"))}
        self.naptime = settings.pop("autovacuum_naptime")
        # As autovacuum reads them: -1 means "the manual VACUUM's setting".
        limit = settings.pop("autovacuum_vacuum_cost_limit")
        manual_limit = settings.pop("vacuum_cost_limit")
        self.cost_limit = int(manual_limit if limit < 0 else limit)
        self.cost_delay_ms = settings.pop("autovacuum_vacuum_cost_delay")
        self.defaults = settings
        self.vacuums = self.analyzes = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def __enter__(self) -> StandInAutovacuum:
        if self.active:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        if self.active:
            self.thread.join()
        self.engine.dispose()

    def due(self, options: list[str] | None, rows: float, dead: int,
            changed: int) -> tuple[bool, bool]:
        """(vacuum, analyze): autovacuum's rule with these storage parameters."""
        own = dict(option.split("=", 1) for option in options or [])

        def setting(key: str) -> float:
            return float(own.get(key, self.defaults[key]))

        rows = max(rows, 0)
        return (dead > setting("autovacuum_vacuum_threshold")
                + setting("autovacuum_vacuum_scale_factor") * rows,
                changed > setting("autovacuum_analyze_threshold")
                + setting("autovacuum_analyze_scale_factor") * rows)

    def due_now(self, conn: Any) -> dict[str, tuple[bool, bool]]:
        """Each churned table autovacuum would vacuum or analyze now: {name: (vacuum,
        analyze)}."""
        from sqlalchemy import text

        rows = conn.execute(text(
            "SELECT c.relname, c.reltuples, s.n_dead_tup, s.n_mod_since_analyze,"
            " c.reloptions FROM pg_class c JOIN pg_stat_user_tables s"
            " ON s.relid = c.oid WHERE c.relname = ANY(:names)"),
            {"names": list(CHURNED_TABLES)}).all()
        return {name: verdict for name, tuples, dead, changed, options in rows
                if any(verdict := self.due(options, tuples, dead, changed))}

    def wait_until_vacuumed(self, timeout: float, *, analyzed: bool = False) -> float:
        """Wait until no churned table has more dead rows than autovacuum lets stand (and,
        if `analyzed`, none has changed more than it lets stand unanalyzed), by this stand-in
        or the server's own autovacuum; returns the seconds waited."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            with self.engine.connect() as conn:
                if not any(vacuum or (analyzed and analyze)
                           for vacuum, analyze in self.due_now(conn).values()):
                    break
            time.sleep(1)
        return time.monotonic() - started

    def run(self) -> None:
        from sqlalchemy import text

        while not self.stopped.wait(self.naptime):
            with self.engine.connect() as conn:
                conn.execute(text(f"SET vacuum_cost_delay = {self.cost_delay_ms}"))
                conn.execute(text(f"SET vacuum_cost_limit = {self.cost_limit}"))
                for name, (vacuum, analyze) in self.due_now(conn).items():
                    verb = ("VACUUM (ANALYZE)" if vacuum and analyze
                            else "VACUUM" if vacuum else "ANALYZE")
                    conn.execute(text(f"{verb} {name}"))
                    self.vacuums += vacuum
                    self.analyzes += analyze


# The stand-in of each database postgres_database() made, by URL, while it exists.
STAND_INS: dict[str, StandInAutovacuum] = {}


@contextlib.contextmanager
def postgres_database(server_url: str, *, stand_in: bool = True) -> Iterator[str]:
    """A fresh, migrated database on the PostgreSQL server at `server_url`, dropped after;
    vacuumed and analyzed as autovacuum would, even where the server runs without it (unless
    not `stand_in`: a count of the statements it receives would count the stand-in's)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from app.storage.migrations import upgrade

    name = f"queuelog_bench_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    try:
        upgrade(url)
        if not stand_in:
            yield url
            return
        with StandInAutovacuum(url) as vacuum:
            STAND_INS[url] = vacuum
            yield url
    finally:
        STAND_INS.pop(url, None)
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextlib.contextmanager
def engine_database(engine: str, directory: str, name: str, *,
                    stand_in: bool = True) -> Iterator[str]:
    """A fresh migrated database of `engine` ("SQLite": the file `name` under `directory`;
    "PostgreSQL": a database of its own on POSTGRES_VARIABLE's server, dropped after, with
    the stand-in autovacuum unless not `stand_in`)."""
    if engine == "PostgreSQL":
        with postgres_database(os.environ[POSTGRES_VARIABLE], stand_in=stand_in) as url:
            yield url
    else:
        yield migrated_database(directory, name)


def engine_databases(directory: str, stack: contextlib.ExitStack,
                     name: str = "queuelog.sqlite3") -> dict[str, str]:
    """{engine: url} of fresh migrated databases: SQLite always, PostgreSQL as well when
    POSTGRES_VARIABLE is set (dropped when `stack` closes)."""
    urls = {"SQLite": migrated_database(directory, name)}
    server = os.environ.get(POSTGRES_VARIABLE)
    if server:
        urls["PostgreSQL"] = stack.enter_context(postgres_database(server))
    return urls


# -- the job bodies the HTTP benchmarks send -----------------------------------------------------

def job_body(n: int) -> dict[str, Any]:
    """A typical small job: about 130 bytes of JSON."""
    return {"type": "email", "priority": "medium",
            "payload": {"to": f"user-{n}@example.com", "template": "welcome-v2",
                        "locale": "en-GB"}}


RESULT = {"message_id": "0123456789abcdef"}


def fill_queue(port: int, token: str, count: int, batch: int = 1000) -> None:
    """Enqueue `count` jobs through /jobs/batch (set-up, not measured)."""
    client = Client(port, token)
    try:
        done = 0
        while done < count:
            size = min(batch, count - done)
            client.call("POST", "/jobs/batch", {"jobs": [job_body(done + i)
                                                         for i in range(size)]})
            done += size
    finally:
        client.close()


def engines_option(parser: Any) -> None:
    """The --engines option of the scripts that measure PostgreSQL beside SQLite."""
    parser.add_argument("--engines", default=None,
                        help="comma-separated: sqlite, postgresql (default: both when "
                             f"{POSTGRES_VARIABLE} is set)")


def chosen_engines(options: Any) -> list[str]:
    """SQLite, and PostgreSQL when its server is given, narrowed by --engines."""
    engines = ["SQLite"] + (["PostgreSQL"] if os.environ.get(POSTGRES_VARIABLE) else [])
    if options.engines:
        engines = [e for e in engines if e.lower() in options.engines.lower().split(",")]
    return engines
