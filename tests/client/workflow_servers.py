"""A live server for the workflow tests: conftest's LiveServer (gunicorn, this checkout,
loopback) over the `db_url` fixture's database, so on SQLite and on PostgreSQL, serving the
job types of docs/WORKFLOWS.md's order example (LiveServer is SQLite with email,pdf,sync)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app import create_app
from app.core.callers import Role
from tests.client.conftest import LiveServer
from tests.servers import (
    UNCONFIGURED,
    WORKER_CLASS,
    GunicornServer,
    free_port,
    gunicorn_argv,
    server_environment,
)

# charge → (email, ship) → notify: the order example's jobs.
ORDER_TYPES = "charge,email,ship,notify"


class WorkflowServer(LiveServer):
    """LiveServer, but over a database of either engine and with the order's job types."""

    def __init__(self, directory: Path, db_url: str, job_types: str = ORDER_TYPES) -> None:
        # LiveServer.__init__ copies a SQLite template and fixes its types: set up here
        # what it would, over the given database.
        self.directory = directory
        self.db_url = db_url
        self.job_types = job_types
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = GunicornServer(
            gunicorn_argv(*UNCONFIGURED, "--workers", "2", "--worker-class", WORKER_CLASS,
                          "--threads", "8", "--bind", f"127.0.0.1:{self.port}"),
            server_environment(directory, QUEUELOG_DATABASE_URL=db_url,
                               QUEUELOG_JOB_TYPES=job_types),
            port=self.port, logs=directory)
        self.admin_token = self.create_key("admin", "admin")

    def create_key(self, name: str, role: str, **limits: Any) -> str:
        app = create_app({"DATABASE_URL": self.db_url, "JOB_TYPES": self.job_types})
        try:
            return app.extensions["queuelog"].keys.create_key(name, Role(role), **limits)
        finally:
            app.extensions["queuelog"].db.engine.dispose()
