"""A bulk retry over cancelled jobs whose unique keys pending twins hold (docs/SCALING.md),
on SQLite: the longest write transaction it holds, and how long a concurrent enqueue waits
meanwhile.

    PYTHONPATH=. python bench/bulk_retry.py [--jobs N]

The jobs are built through the service (enqueue_many, cancel_many), the twins too; then
retry-many takes all of them (each is skipped: its key is held). Write transactions are timed
from their BEGIN IMMEDIATE to the end of their COMMIT by the engine's own events.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/bulk_retry.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import event

from app import create_app
from app.core.callers import Role
from app.jobs.web.requests import EnqueueSchema
from bench.data import migrated_database, scratch_directory

ENQUEUE_BATCH = 1000
_enqueue = EnqueueSchema()


def build(app: Any, jobs: int) -> tuple[Any, Any]:
    services = app.extensions["queuelog"]
    keys = services.keys
    producer = keys.caller_for_token(keys.create_key("producer", Role.PRODUCER))
    admin = keys.caller_for_token(keys.create_key("admin", Role.ADMIN))
    for start in range(0, jobs, ENQUEUE_BATCH):
        requests = [_enqueue.load({"type": "email", "payload": {"n": n},
                                   "unique": {"key": f"k{n}"}})
                    for n in range(start, min(jobs, start + ENQUEUE_BATCH))]
        services.jobs.enqueue_many(producer, requests)
    cancelled = 0
    while cancelled < jobs:
        cancelled += len(services.jobs.cancel_many(admin, {"limit": 10_000}))
    for start in range(0, jobs, ENQUEUE_BATCH):
        requests = [_enqueue.load({"type": "email", "payload": {"n": n, "twin": True},
                                   "unique": {"key": f"k{n}"}})
                    for n in range(start, min(jobs, start + ENQUEUE_BATCH))]
        services.jobs.enqueue_many(producer, requests)
    return producer, admin


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=10_000)
    args = parser.parse_args()
    with scratch_directory("queuelog-bulk-") as directory:
        app = create_app({"DATABASE_URL": migrated_database(directory),
                          "JOB_TYPES": {"email"}, "SCHEDULER": False})
        services = app.extensions["queuelog"]
        producer, admin = build(app, args.jobs)

        holds: list[float] = []
        opened: dict[int, float] = {}
        engine = services.db.engine

        def on_begin(conn: Any) -> None:
            if conn.get_execution_options().get("queuelog_write"):
                opened[id(conn)] = time.perf_counter()

        def on_end(conn: Any) -> None:
            started = opened.pop(id(conn), None)
            if started is not None:
                holds.append(time.perf_counter() - started)

        # Registered after the engine's own "begin" hook, which sends BEGIN IMMEDIATE: the
        # clock starts once the lock is held. "commit" fires just before the COMMIT.
        event.listen(engine, "begin", on_begin)
        event.listen(engine, "commit", on_end)
        event.listen(engine, "rollback", on_end)

        waits: list[float] = []
        done = threading.Event()

        def enqueue_meanwhile() -> None:
            n = 0
            while not done.is_set():
                started = time.perf_counter()
                services.jobs.enqueue(producer, _enqueue.load({"type": "email",
                                                              "payload": {"other": n}}))
                waits.append(time.perf_counter() - started)
                n += 1
                time.sleep(0.005)

        writer = threading.Thread(target=enqueue_meanwhile)
        writer.start()
        time.sleep(0.1)
        started = time.perf_counter()
        retried = services.jobs.retry_many(admin, {"limit": 10_000})
        elapsed = time.perf_counter() - started
        done.set()
        writer.join()
        bulk_holds = sorted(holds)
        print(f"== Bulk retry: {args.jobs} cancelled jobs, each key held by a pending twin "
              "(SQLite)")
        print(f"retried {len(retried)} (all skipped: keys held), in {elapsed:.2f} s")
        print(f"write transactions during the run: {len(bulk_holds)}; longest held "
              f"{bulk_holds[-1] * 1000:.0f} ms")
        print(f"concurrent enqueues: {len(waits)}, longest {max(waits) * 1000:.0f} ms")
        engine.dispose()


if __name__ == "__main__":
    main()
