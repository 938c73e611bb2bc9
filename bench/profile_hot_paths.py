"""Where a request's CPU time goes: enqueue, and claim + complete, through the Flask test
client (no network, no gunicorn), under cProfile, summed by layer.

    PYTHONPATH=. python bench/profile_hot_paths.py [--jobs N] [--synchronous FULL|OFF]
        [--database-url postgresql+psycopg://…/an_empty_database]

On PostgreSQL (an empty database, migrated here) the driver's layer includes the time spent
waiting for the server's answers.

cProfile inflates the cost of many small calls, so read the shares, not the microseconds.
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import pstats
import tempfile
from collections import defaultdict
from pathlib import Path

from app import create_app
from app.core.callers import Role
from app.storage.migrations import upgrade

LAYERS = [
    ("the test client (absent under gunicorn)", ("/werkzeug/test.py", "/flask/testing.py",
                                                  "/werkzeug/wsgi.py")),
    ("queuelog: request log and metrics", ("/app/ops/",)),
    ("queuelog: auth and keys", ("/app/web/auth.py", "/app/keys/")),
    ("queuelog: group commit", ("/app/storage/engine.py", "/app/storage/group_commit.py")),
    ("queuelog: jobs (routes, service, repository, schemas)", ("/app/",)),
    ("marshmallow", ("/marshmallow/",)),
    ("sqlalchemy", ("/sqlalchemy/",)),
    ("sqlite3 driver (incl. fsync)", ("sqlite3.Cursor", "sqlite3.Connection")),
    ("psycopg driver (incl. waiting for PostgreSQL)", ("/psycopg/", "/psycopg_binary/",
                                                       "psycopg_binary.")),
    ("flask and werkzeug", ("/flask/", "/werkzeug/")),
    ("json", ("/json/",)),
    ("logging", ("/logging/",)),
    ("prometheus_client", ("/prometheus_client/",)),
]


def layer_of(filename: str, function: str) -> str:
    where = f"{filename}:{function}"
    for name, markers in LAYERS:
        if any(marker in where for marker in markers):
            return name
    return "other (stdlib, test client)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--synchronous", default="FULL")
    parser.add_argument("--database-url", default=None,
                        help="an empty PostgreSQL database (default: a SQLite file)")
    args = parser.parse_args()
    logging.disable(logging.INFO)  # the request log's lines, not its cost, are muted here
    with tempfile.TemporaryDirectory() as tmp:
        url = args.database_url or f"sqlite:///{Path(tmp) / 'profile.sqlite3'}"
        upgrade(url)
        app = create_app({"DATABASE_URL": url, "JOB_TYPES": {"email"},
                          "SQLITE_SYNCHRONOUS": args.synchronous})
        keys = app.extensions["queuelog"].keys
        producer = {"Authorization": f"Bearer {keys.create_key('p', Role.PRODUCER)}"}
        worker = {"Authorization": f"Bearer {keys.create_key('w', Role.WORKER)}"}
        client = app.test_client()
        body = {"type": "email", "payload": {"to": "someone@example.com", "n": 1}}

        def enqueue() -> None:
            for _ in range(args.jobs):
                client.post("/jobs", json=body, headers=producer)

        def claim_and_complete() -> None:
            for _ in range(args.jobs):
                job = client.post("/jobs/claim", headers=worker).json
                client.post(f"/jobs/{job['id']}/complete",
                            json={"lease_token": job["lease_token"], "result": {"ok": 1}},
                            headers=worker)

        for name, run in (("enqueue", enqueue), ("claim + complete", claim_and_complete)):
            profiler = cProfile.Profile()
            profiler.runcall(run)
            stats = pstats.Stats(profiler)
            by_layer: dict[str, float] = defaultdict(float)
            for (filename, _line, function), row in stats.stats.items():  # type: ignore[attr-defined]
                by_layer[layer_of(filename, function)] += row[2]  # own time
            total = sum(by_layer.values())
            print(f"\n{name}: {total / args.jobs * 1e6:.0f} µs of profiled time per operation")
            for layer, seconds in sorted(by_layer.items(), key=lambda item: -item[1]):
                print(f"  {seconds / total:6.1%}  {layer}")
        app.extensions["queuelog"].db.engine.dispose()


if __name__ == "__main__":
    main()
