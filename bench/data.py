"""The data the benchmarks start from: scratch directories, migrated SQLite files and
PostgreSQL databases, keys, and the jobs the HTTP benchmarks send."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
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
    from app.migrations import upgrade

    url = sqlite_url(Path(directory) / name)
    upgrade(url)
    return url


def create_keys(url: str, keys: Mapping[str, str]) -> dict[str, str]:
    """Create keys {name: role} in the database and return {name: token}."""
    from app import create_app
    from app.keys.models import Role

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


@contextlib.contextmanager
def postgres_database(server_url: str) -> Iterator[str]:
    """A fresh, migrated database on the PostgreSQL server at `server_url`, dropped after."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from app.migrations import upgrade

    name = f"queuelog_bench_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    try:
        upgrade(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


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
