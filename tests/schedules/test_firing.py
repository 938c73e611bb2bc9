"""Firing with a clock the test moves (the app's ManualClock), on both engines: daylight
saving in two zones, catch-up after a gap, paused and edited schedules, who sees the jobs,
and one job per slot when processes race."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from flask import Flask

from app import create_app
from app.core.callers import Caller, Role
from app.core.clock import ManualClock
from app.core.errors import SlotTaken
from app.core.priorities import Priority
from app.jobs.domain.intake import new_job
from app.jobs.sql.repository import JobRepository
from tests.schedules.conftest import Schedules, micros, set_clock, utc


def test_spring_forward_in_berlin_fires_at_the_first_instant_after_the_gap(
        schedules: Schedules, clock: ManualClock) -> None:
    set_clock(clock, "2026-03-28T12:00:00Z")
    schedules.create(cron="30 2 * * *", timezone="Europe/Berlin")
    schedules.run_until(clock, "2026-03-31T12:00:00Z", step_seconds=600)
    # 02:30 does not exist on 29 March: 03:00 CEST (01:00Z) is the first instant after it.
    assert schedules.slots() == ["2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z",
                                 "2026-03-31T00:30:00Z"]


def test_fall_back_in_berlin_fires_a_repeated_time_once(schedules: Schedules,
                                                        clock: ManualClock) -> None:
    set_clock(clock, "2026-10-24T12:00:00Z")
    schedules.create(cron="30 2 * * *", timezone="Europe/Berlin")
    schedules.run_until(clock, "2026-10-26T12:00:00Z", step_seconds=600)
    # 02:30 happens twice on 25 October (CEST, then CET): only the first fires.
    assert schedules.slots() == ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]


def test_spring_forward_in_new_york(schedules: Schedules, clock: ManualClock) -> None:
    set_clock(clock, "2026-03-07T12:00:00Z")
    schedules.create(cron="30 2 * * *", timezone="America/New_York")
    schedules.run_until(clock, "2026-03-09T12:00:00Z", step_seconds=600)
    assert schedules.slots() == ["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]


def test_fall_back_in_new_york(schedules: Schedules, clock: ManualClock) -> None:
    set_clock(clock, "2026-10-31T12:00:00Z")
    schedules.create(cron="30 1 * * *", timezone="America/New_York")
    schedules.run_until(clock, "2026-11-02T12:00:00Z", step_seconds=600)
    # 01:30 EDT (05:30Z) fires; 01:30 EST an hour later does not.
    assert schedules.slots() == ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]


def test_an_hourly_schedule_follows_real_time_through_the_change(
        schedules: Schedules, clock: ManualClock) -> None:
    set_clock(clock, "2026-10-31T23:30:00Z")
    schedules.create(cron="0 * * * *", timezone="America/New_York")
    schedules.run_until(clock, "2026-11-01T09:30:00Z", step_seconds=600)
    # 01:00 happens twice in New York that night; an hourly job runs every real hour.
    assert schedules.slots() == [f"2026-11-01T{hour:02d}:00:00Z" for hour in range(10)]


def _gap(schedules: Schedules, clock: ManualClock, catch_up: str) -> list[str]:
    """A schedule every 10 minutes fires once, then the service is down for two hours."""
    set_clock(clock, "2027-01-15T08:00:00Z")
    schedules.create(cron="*/10 * * * *", catch_up=catch_up)
    set_clock(clock, "2027-01-15T08:10:00.300Z")
    assert schedules.fire() == 1
    set_clock(clock, "2027-01-15T10:15:00Z")  # 08:20 … 10:10 were missed
    schedules.fire()
    assert schedules.get("nightly").get_json()["next_run_at"] == "2027-01-15T10:20:00.000000Z"
    return schedules.slots()


def test_catch_up_latest_enqueues_the_newest_missed_slot(schedules: Schedules,
                                                         clock: ManualClock) -> None:
    assert _gap(schedules, clock, "latest") == ["2027-01-15T08:10:00Z", "2027-01-15T10:10:00Z"]


def test_catch_up_none_skips_the_missed_slots(schedules: Schedules,
                                              clock: ManualClock) -> None:
    assert _gap(schedules, clock, "none") == ["2027-01-15T08:10:00Z"]


def test_catch_up_all_enqueues_every_missed_slot_oldest_first(schedules: Schedules,
                                                              clock: ManualClock) -> None:
    slots = _gap(schedules, clock, "all")
    assert slots == ["2027-01-15T08:10:00Z"] + [
        utc(micros("2027-01-15T08:20:00Z") + n * 600_000_000) for n in range(12)]


def test_catch_up_all_is_capped_at_the_newest_100_slots(schedules: Schedules,
                                                        clock: ManualClock) -> None:
    set_clock(clock, "2027-01-15T08:00:30Z")
    schedules.create(cron="* * * * *", catch_up="all")
    set_clock(clock, "2027-01-15T13:00:30Z")  # 300 minutes missed
    assert schedules.fire() == 100
    slots = schedules.slots()
    assert slots[0] == "2027-01-15T11:21:00Z" and slots[-1] == "2027-01-15T13:00:00Z"
    assert len(set(slots)) == 100
    # In slot order: ids, and so claim order among equals, follow the slots.
    assert slots == sorted(slots)


def test_a_slot_a_little_late_is_not_missed(schedules: Schedules, clock: ManualClock) -> None:
    set_clock(clock, "2027-01-15T08:00:00Z")
    schedules.create(cron="*/10 * * * *", catch_up="none")
    set_clock(clock, "2027-01-15T08:10:45Z")  # within the 60 s grace
    assert schedules.fire() == 1
    job = schedules.jobs()[0]
    assert job["scheduled_for"] == "2027-01-15T08:10:00.000000Z"
    assert job["created_at"] == "2027-01-15T08:10:45.000000Z"


def test_a_paused_schedule_skips_its_slots_and_resumes_without_a_backlog(
        schedules: Schedules, clock: ManualClock) -> None:
    set_clock(clock, "2027-01-15T08:00:00Z")
    schedules.create(cron="*/10 * * * *", catch_up="all")
    assert schedules.patch("nightly", paused=True).get_json()["paused"] is True
    schedules.run_until(clock, "2027-01-15T09:05:00Z", step_seconds=60)
    assert schedules.slots() == []
    assert schedules.get("nightly").get_json()["next_run_at"] == "2027-01-15T09:10:00.000000Z"
    resumed = schedules.patch("nightly", paused=False).get_json()
    assert resumed["next_run_at"] == "2027-01-15T09:10:00.000000Z"
    schedules.run_until(clock, "2027-01-15T09:25:00Z", step_seconds=60)
    assert schedules.slots() == ["2027-01-15T09:10:00Z", "2027-01-15T09:20:00Z"]


def test_a_schedule_edited_between_slots_fires_on_its_new_expression(
        schedules: Schedules, clock: ManualClock) -> None:
    set_clock(clock, "2027-01-15T07:59:00Z")
    schedules.create(cron="0 * * * *")
    schedules.run_until(clock, "2027-01-15T08:20:00Z", step_seconds=30)
    edited = schedules.patch("nightly", cron="30 * * * *", job={"type": "pdf"}).get_json()
    assert edited["next_run_at"] == "2027-01-15T08:30:00.000000Z"
    schedules.run_until(clock, "2027-01-15T09:40:00Z", step_seconds=30)
    jobs = schedules.jobs()
    assert [(job["scheduled_for"][11:16], job["type"]) for job in jobs] == [
        ("08:00", "email"), ("08:30", "pdf"), ("09:30", "pdf")]
    shown = schedules.get("nightly").get_json()
    assert shown["last_run_at"] == "2027-01-15T09:30:00.000000Z"
    assert shown["last_job_id"] == jobs[-1]["id"]


def test_schedule_jobs_are_the_admins_to_see(schedules: Schedules, clock: ManualClock,
                                             producer: Any, api: Any) -> None:
    set_clock(clock, "2027-01-15T08:00:00Z")
    schedules.create(cron="*/10 * * * *")
    set_clock(clock, "2027-01-15T08:10:00Z")
    schedules.fire()
    api.enqueue(producer, payload={"mine": True})
    (job,) = schedules.jobs()
    assert job["schedule"] == "nightly"
    listed = api.list(producer).get_json()["jobs"]
    assert [j["payload"] for j in listed] == [{"mine": True}]
    assert listed[0]["schedule"] is None and listed[0]["scheduled_for"] is None
    assert api.get(producer, job["id"]).status_code == 404
    events = schedules.client.get(f"/jobs/{job['id']}/events",
                                  headers=schedules.admin.headers).get_json()["events"]
    assert events[0]["event"] == "enqueued" and events[0]["actor"] == "schedule:nightly"


def test_firings_are_counted_with_their_lateness(schedules: Schedules,
                                                 clock: ManualClock) -> None:
    set_clock(clock, "2027-01-15T08:00:00Z")
    schedules.create(cron="*/10 * * * *")
    set_clock(clock, "2027-01-15T08:10:00.400Z")
    schedules.fire()
    text = schedules.client.get("/metrics", headers=schedules.admin.headers).get_data(True)
    # One total, no series per schedule name (names come and go without bound).
    assert "queuelog_schedule_firings_total 1.0" in text
    assert 'schedule="nightly"' not in text
    assert 'queuelog_schedule_lateness_seconds_bucket{le="0.5"} 1.0' in text
    assert 'queuelog_schedule_lateness_seconds_bucket{le="0.25"} 0.0' in text


def test_processes_racing_for_a_slot_enqueue_one_job(schedules: Schedules, clock: ManualClock,
                                                     app_config: dict[str, Any]) -> None:
    set_clock(clock, "2027-01-15T08:00:00Z")
    schedules.create(cron="* * * * *", catch_up="all")
    # Four apps on one database stand for four server processes, each with its own engine.
    apps: list[Flask] = [create_app(app_config) for _ in range(4)]
    errors: list[BaseException] = []
    try:
        for minute in range(1, 6):
            set_clock(clock, f"2027-01-15T08:{minute:02d}:00.100Z")
            barrier = threading.Barrier(len(apps))

            def fire(app: Flask, barrier: threading.Barrier = barrier) -> None:
                barrier.wait()
                try:
                    app.extensions["queuelog"].schedules.fire_due()
                except BaseException as exc:  # told to the test below, not lost in a thread
                    errors.append(exc)

            threads = [threading.Thread(target=fire, args=(app,)) for app in apps]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        for app in apps:
            app.extensions["queuelog"].db.engine.dispose()
    assert errors == []
    assert schedules.slots() == [f"2027-01-15T08:{minute:02d}:00Z" for minute in range(1, 6)]


def test_the_database_holds_one_job_per_schedule_and_slot(app: Flask) -> None:
    services = app.extensions["queuelog"]
    caller = Caller(name="schedule:nightly", role=Role.ADMIN, max_priority=Priority.CRITICAL,
                    allowed_types=None)
    body = {"type": "email", "payload": {}, "max_retries": 3}
    values = {**new_job(services.schedules.intake, caller, body, None, 1).values,
              "schedule": "nightly", "scheduled_for": 1_000_000}
    with services.db.write() as conn:
        first = JobRepository(conn).insert_job(values)
        with pytest.raises(SlotTaken):
            JobRepository(conn).insert_job({**values, "created_at": 2})
        other_slot = JobRepository(conn).insert_job({**values, "scheduled_for": 2_000_000})
    assert first.scheduled_for == 1_000_000 and other_slot.scheduled_for == 2_000_000


def test_a_slot_whose_job_type_is_no_longer_configured_is_skipped_and_said(
        schedules: Schedules, clock: ManualClock, app_config: dict[str, Any],
        caplog: Any) -> None:
    set_clock(clock, "2027-01-15T08:00:00Z")
    schedules.create(cron="*/10 * * * *")
    narrowed = create_app({**app_config, "JOB_TYPES": {"pdf"}})
    set_clock(clock, "2027-01-15T08:10:00Z")
    try:
        assert narrowed.extensions["queuelog"].schedules.fire_due() == 0
    finally:
        narrowed.extensions["queuelog"].db.engine.dispose()
    assert "slot skipped, its job does not validate" in caplog.text
    assert schedules.slots() == []
    # The schedule moved on: the next slot fires once the type is configured again.
    assert schedules.get("nightly").get_json()["next_run_at"] == "2027-01-15T08:20:00.000000Z"
    set_clock(clock, "2027-01-15T08:20:00Z")
    assert schedules.fire() == 1
