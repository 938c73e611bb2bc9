"""Schedules at scale: 2,000 every-minute schedules (and 1,500 paused ones beside them) fired by
the tickers of a real gunicorn with 4 workers; how late each slot's job is enqueued (its
created_at after its scheduled_for), over two minute boundaries. The goal: every slot's job
within 2 s.

    PYTHONPATH=. python bench/schedules_scale.py [--active N] [--paused N] [--postgres URL]

SQLite always (a file in a scratch directory); PostgreSQL as well with --postgres (or
QUEUELOG_BENCH_POSTGRES_URL), in a database of its own, dropped afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/schedules_scale.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import create_engine, select

from bench.data import (
    JOB_TYPES,
    POSTGRES_VARIABLE,
    migrated_database,
    postgres_database,
    scratch_directory,
)
from bench.servers import queuelog_server
from bench.stats import percentile

GOAL_SECONDS = 2.0
BOUNDARIES = 2


def create_schedules(url: str, active: int, paused: int) -> None:
    """Every-minute schedules through the service (as POST /schedules stores them)."""
    from app import create_app
    from app.schedules.schemas import ScheduleCreateSchema

    app = create_app({"DATABASE_URL": url, "JOB_TYPES": JOB_TYPES})
    service = app.extensions["queuelog"].schedules
    schema = ScheduleCreateSchema()
    try:
        for n in range(active + paused):
            service.create_schedule(schema.load({
                "name": f"every-minute-{n:05d}", "cron": "* * * * *",
                "job": {"type": "email", "payload": {"n": n}}, "paused": n >= active}))
    finally:
        app.extensions["queuelog"].db.engine.dispose()


def lateness_by_slot(url: str) -> dict[int, list[float]]:
    """{slot: [seconds from the slot to its job's created_at, …]} of the schedule jobs."""
    from app.storage.schema import jobs

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(jobs.c.scheduled_for, jobs.c.created_at)
                                .where(jobs.c.schedule.is_not(None))).all()
    finally:
        engine.dispose()
    slots: dict[int, list[float]] = {}
    for slot, created in rows:
        slots.setdefault(slot, []).append((created - slot) / 1e6)
    return slots


def measure(engine_name: str, url: str, directory: str, active: int, paused: int) -> bool:
    started = time.monotonic()
    create_schedules(url, active, paused)
    print(f"{engine_name}: {active} active + {paused} paused schedules created in "
          f"{time.monotonic() - started:.1f} s", flush=True)
    with queuelog_server(directory, url, GUNICORN_WORKERS="4", QUEUELOG_SCHEDULER="1"):
        # The first boundary after the server answers, and the one after it, both whole.
        now = time.time()
        first = (int(now // 60) + 1) * 60
        if first - now < 3:  # too close: the workers may still be starting their tickers
            first += 60
        last = first + 60 * (BOUNDARIES - 1)
        time.sleep(max(0.0, last + 5 - time.time()))
        # A slot fired very late is still counted: wait (up to a minute more) for all of it.
        while (len(lateness_by_slot(url).get(last * 1_000_000, [])) < active
               and time.time() < last + 65):
            time.sleep(2)
    slots = lateness_by_slot(url)
    met = True
    for boundary in range(first, last + 1, 60):
        late = sorted(slots.get(boundary * 1_000_000, []))
        if not late:
            print(f"  slot {time.strftime('%H:%M', time.gmtime(boundary))}: no jobs")
            met = False
            continue
        p50, worst = percentile(late, 50), late[-1]
        met = met and len(late) == active and worst <= GOAL_SECONDS
        print(f"  slot {time.strftime('%H:%M', time.gmtime(boundary))}: {len(late)} jobs "
              f"(of {active}), lateness p50 {p50:.2f} s, max {worst:.2f} s "
              f"(goal: all within {GOAL_SECONDS:.0f} s)", flush=True)
    return met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--active", type=int, default=2000)
    parser.add_argument("--paused", type=int, default=1500)
    parser.add_argument("--postgres", default=os.environ.get(POSTGRES_VARIABLE))
    parser.add_argument("--skip-sqlite", action="store_true")
    args = parser.parse_args()
    met = True
    with scratch_directory("queuelog-schedules-") as directory:
        if not args.skip_sqlite:
            met &= measure("SQLite", migrated_database(directory), directory, args.active,
                           args.paused)
        if args.postgres:
            with contextlib.ExitStack() as stack:
                url = stack.enter_context(postgres_database(args.postgres))
                met &= measure("PostgreSQL", url, directory, args.active, args.paused)
    print("met" if met else "NOT met")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
