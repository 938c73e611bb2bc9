"""Schedules at scale, on both engines with a clock the test moves:
many schedules fired in batches by racing processes, each slot once; paused schedules cost no
write; GET /schedules and the dashboard page by name; catch-up coalesced after an outage; a
template's payload as deep as POST /jobs takes; a slot its unique key skips is said."""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import event, select

from app import create_app, stop_maintenance
from app.core.clock import ManualClock
from app.schedules import service as schedule_service
from app.storage.schema import schedules as schedules_table
from app.web.http import MAX_JSON_DEPTH
from tests.conftest import Key
from tests.schedules.conftest import Schedules, micros, set_clock, utc
from tests.ui.conftest import sign_in


def _nested(depth: int) -> dict[str, Any]:
    """A JSON object `depth` levels deep (`{}` is 1)."""
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


@contextmanager
def _statements(app: Flask) -> Iterator[list[str]]:
    """The SQL the app's engine runs meanwhile."""
    seen: list[str] = []
    engine = app.extensions["queuelog"].db.engine

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


# -- many schedules, racing processes ------------------------------------------------------


def test_racing_apps_fire_every_slot_of_many_schedules_exactly_once(
        schedules: Schedules, clock: ManualClock, app_config: dict[str, Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Batches of 4, so that 2 racing processes take 23 schedules in many batches each (on
    # PostgreSQL skipping the rows the other holds) and every boundary needs several rounds.
    monkeypatch.setattr(schedule_service, "FIRE_BATCH", 4)
    set_clock(clock, "2027-01-15T08:00:30Z")
    names = [f"every-minute-{n:02d}" for n in range(23)]
    for name in names:
        assert schedules.create(name=name, cron="* * * * *").status_code == 201
    apps = [create_app(app_config) for _ in range(2)]
    errors: list[BaseException] = []
    fired: list[int] = []
    try:
        for minute in range(1, 4):
            set_clock(clock, f"2027-01-15T08:{minute:02d}:00.200Z")
            barrier = threading.Barrier(len(apps))

            def fire(app: Flask, barrier: threading.Barrier = barrier) -> None:
                barrier.wait()
                try:
                    fired.append(app.extensions["queuelog"].schedules.fire_due())
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
    jobs = schedules.jobs()
    assert sum(fired) == len(jobs) == 3 * len(names)
    per_slot = Counter((job["schedule"], job["scheduled_for"][:19]) for job in jobs)
    assert set(per_slot.values()) == {1}
    assert set(per_slot) == {(name, f"2027-01-15T08:{minute:02d}:00")
                             for name in names for minute in range(1, 4)}
    shown = schedules.get(names[-1]).get_json()
    assert shown["last_run_at"] == "2027-01-15T08:03:00.000000Z"
    assert shown["next_run_at"] == "2027-01-15T08:04:00.000000Z"
    assert shown["last_job_id"] == max(job["id"] for job in jobs if job["schedule"] == names[-1])


def test_every_enqueued_slot_has_its_history(schedules: Schedules, clock: ManualClock) -> None:
    set_clock(clock, "2027-01-15T08:00:30Z")
    for n in range(3):
        schedules.create(name=f"s{n}", cron="* * * * *")
    set_clock(clock, "2027-01-15T08:01:00.100Z")
    assert schedules.fire() == 3
    for job in schedules.jobs():
        events = schedules.client.get(f"/jobs/{job['id']}/events",
                                      headers=schedules.admin.headers).get_json()["events"]
        assert [(e["event"], e["actor"]) for e in events] == [
            ("enqueued", f"schedule:{job['schedule']}")]


# -- paused schedules ----------------------------------------------------------------------


def test_paused_schedules_are_neither_read_nor_written_per_slot(
        schedules: Schedules, clock: ManualClock, app: Flask) -> None:
    set_clock(clock, "2027-01-15T08:00:30Z")
    for n in range(3):
        schedules.create(name=f"paused-{n}", cron="* * * * *", paused=True)
    db = app.extensions["queuelog"].db
    with db.read() as conn:
        stored = conn.execute(select(schedules_table.c.name, schedules_table.c.next_run_at,
                                     schedules_table.c.updated_at)).all()
    stop_maintenance(app)  # the schedules' statements alone (moving the clock runs a round)
    with _statements(app) as seen:
        for minute in range(1, 6):
            set_clock(clock, f"2027-01-15T08:{minute:02d}:00.100Z")
            assert schedules.fire() == 0
    # One index probe a tick, nothing written: no transaction of the writer at all.
    verbs = [statement.split()[0].upper() for statement in seen]
    assert not {"INSERT", "UPDATE", "DELETE"} & set(verbs), seen
    assert verbs.count("SELECT") == 5, seen
    with db.read() as conn:
        assert conn.execute(select(schedules_table.c.name, schedules_table.c.next_run_at,
                                   schedules_table.c.updated_at)).all() == stored
    # Shown as it would fire if resumed now; resumed, it fires at its next slot, no backlog.
    assert schedules.get("paused-0").get_json()["next_run_at"] == "2027-01-15T08:06:00.000000Z"
    assert schedules.patch("paused-0", paused=False).get_json()["next_run_at"] == \
        "2027-01-15T08:06:00.000000Z"
    set_clock(clock, "2027-01-15T08:06:00.100Z")
    assert schedules.fire() == 1
    assert schedules.slots() == ["2027-01-15T08:06:00Z"]


# The plan read is SQLite's (EXPLAIN QUERY PLAN): this one runs on SQLite alone.
@pytest.mark.parametrize("engine_name", ["sqlite"], indirect=True)
def test_sqlite_due_query_reads_the_active_schedules_index(
        schedules: Schedules, clock: ManualClock, app: Flask) -> None:
    schedules.create(name="active", cron="* * * * *")
    set_clock(clock, "2027-01-15T08:01:00Z")
    plans: list[str] = []
    db = app.extensions["queuelog"].db
    with _statements(app) as seen:
        schedules.fire()
    due = [s for s in seen if s.lstrip().upper().startswith("SELECT")
           and "FROM schedules" in s and "next_run_at <=" in s]
    assert due
    with db.read() as conn:
        for statement in due:
            plans += [row[-1] for row in conn.exec_driver_sql(
                "EXPLAIN QUERY PLAN " + statement,
                tuple([0] * statement.count("?"))).all()]
    assert all("USING INDEX ix_schedules_due (paused=? AND next_run_at<?)" in p
               or "COVERING INDEX ix_schedules_due (paused=? AND next_run_at<?)" in p
               for p in plans), plans


# -- pagination ----------------------------------------------------------------------------


def test_get_schedules_pages_by_name_as_get_jobs_does(schedules: Schedules) -> None:
    names = sorted(f"s-{n}" for n in range(7))
    for name in reversed(names):
        schedules.create(name=name, cron="0 3 * * *")
    seen, cursor, pages = [], None, 0
    while True:
        query: dict[str, Any] = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        response = schedules.client.get("/schedules", query_string=query,
                                        headers=schedules.admin.headers)
        assert response.status_code == 200
        body = response.get_json()
        assert set(body) == {"schedules", "next_cursor"}
        seen += [schedule["name"] for schedule in body["schedules"]]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == names and pages == 3
    first = schedules.client.get("/schedules", headers=schedules.admin.headers).get_json()
    assert len(first["schedules"]) == 7 and first["next_cursor"] is None  # default limit 50


@pytest.mark.parametrize("query", [{"limit": 0}, {"limit": 501}, {"limit": "x"},
                                   {"cursor": "bm9wZQ"}, {"cursor": "djE6MTI"},
                                   {"status": "pending"}])
def test_get_schedules_refuses_a_bad_limit_cursor_or_parameter(schedules: Schedules,
                                                               query: dict[str, Any]) -> None:
    response = schedules.client.get("/schedules", query_string=query,
                                    headers=schedules.admin.headers)
    assert response.status_code == 422
    assert response.content_type == "application/problem+json"


def test_other_schedule_routes_still_take_no_query_parameters(schedules: Schedules) -> None:
    schedules.create(cron="0 3 * * *")
    response = schedules.client.get("/schedules/nightly?limit=3",
                                    headers=schedules.admin.headers)
    assert response.status_code == 422


def test_a_schedules_page_stops_short_of_the_byte_budget(
        schedules: Schedules, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.jobs.web import answers as job_answers

    for n in range(4):
        schedules.create(name=f"s-{n}", cron="0 3 * * *",
                         job={"type": "email", "payload": {"blob": "x" * 2000}})
    monkeypatch.setattr(job_answers.render_page, "__kwdefaults__", {"max_bytes": 5000})
    body = schedules.client.get("/schedules", headers=schedules.admin.headers).get_json()
    assert [s["name"] for s in body["schedules"]] == ["s-0", "s-1"]
    rest = schedules.client.get("/schedules", query_string={"cursor": body["next_cursor"]},
                                headers=schedules.admin.headers).get_json()
    assert [s["name"] for s in rest["schedules"]] == ["s-2", "s-3"]


def test_the_dashboard_schedules_page_is_paged(schedules: Schedules, admin: Key,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from app.ui import routes as ui_routes

    monkeypatch.setattr(ui_routes, "SCHEDULES_PER_PAGE", 2)
    for n in range(5):
        schedules.create(name=f"s-{n}", cron="0 3 * * *")
    client = schedules.client
    assert sign_in(client, admin).status_code == 302
    first = client.get("/ui/schedules").get_data(as_text=True)
    assert "s-0" in first and "s-1" in first and "s-2" not in first
    assert 'rel="next"' in first
    overview = client.get("/ui/").get_data(as_text=True)
    assert "s-1" in overview and "s-2" not in overview
    seen = []
    cursor: str | None = None
    for _ in range(3):
        page = client.get("/ui/schedules", query_string={"cursor": cursor} if cursor else {})
        text = page.get_data(as_text=True)
        seen += [f"s-{n}" for n in range(5) if f">s-{n}<" in text]
        marker = 'cursor='
        cursor = (text.split(marker, 1)[1].split('"', 1)[0]
                  if 'rel="next"' in text else None)
        if cursor is None:
            break
    assert seen == [f"s-{n}" for n in range(5)]
    assert client.get("/ui/schedules?cursor=nope").status_code == 422


# -- catch-up after an outage --------------------------------------------------------------


@pytest.fixture
def every_second(app_config: dict[str, Any]) -> Iterator[Flask]:
    """Schedules on an app that takes six-field (every-second) expressions."""
    app = create_app({**app_config, "SCHEDULE_SECONDS": True})
    try:
        yield app
    finally:
        app.extensions["queuelog"].db.engine.dispose()


def _outage(app: Flask, admin: Key, clock: ManualClock, catch_up: str) -> tuple[int, Any]:
    """An every-second schedule fires once, then no process runs for 60 of its slots."""
    seconds = Schedules(app, app.test_client(), admin)
    set_clock(clock, "2027-01-15T08:00:00.500Z")
    assert seconds.create(cron="* * * * * *", catch_up=catch_up).status_code == 201
    set_clock(clock, "2027-01-15T08:00:01.100Z")
    assert seconds.fire() == 1
    set_clock(clock, "2027-01-15T08:01:01.400Z")  # 08:00:02 … 08:01:01 are due: 60 slots
    return seconds.fire(), seconds


@pytest.mark.parametrize(("catch_up", "caught_up"), [
    ("latest", ["2027-01-15T08:01:00Z"]), ("none", [])])
def test_catch_up_after_an_outage_of_60_slots_coalesces(
        every_second: Flask, admin: Key, clock: ManualClock, catch_up: str,
        caught_up: list[str]) -> None:
    # 08:01:01 is on time (0.4 s old, the grace is 60 s) and enqueues under both; the 59
    # before it were missed (overtaken by newer slots, however young): latest enqueues one
    # job for the newest of them, none skips them all.
    fired, seconds = _outage(every_second, admin, clock, catch_up)
    assert fired == 1 + len(caught_up)
    assert seconds.slots() == ["2027-01-15T08:00:01Z", *caught_up, "2027-01-15T08:01:01Z"]
    text = seconds.client.get("/metrics", headers=admin.headers).get_data(as_text=True)
    skipped = 59 - len(caught_up)
    assert f'queuelog_schedule_skipped_slots_total{{reason="missed"}} {skipped}.0' in text


def test_catch_up_none_skips_a_newest_slot_past_the_grace(
        every_second: Flask, admin: Key, clock: ManualClock) -> None:
    seconds = Schedules(every_second, every_second.test_client(), admin)
    set_clock(clock, "2027-01-15T08:00:00Z")
    seconds.create(cron="*/10 * * * *", catch_up="none")
    set_clock(clock, "2027-01-15T08:11:30Z")  # 08:10 is 90 s old: missed
    assert seconds.fire() == 0
    assert seconds.get("nightly").get_json()["next_run_at"] == "2027-01-15T08:20:00.000000Z"


def test_catch_up_all_after_an_outage_enqueues_every_slot(
        every_second: Flask, admin: Key, clock: ManualClock) -> None:
    fired, seconds = _outage(every_second, admin, clock, "all")
    assert fired == 60
    assert seconds.slots()[1:] == [utc(micros("2027-01-15T08:00:02Z") + n * 1_000_000)
                                   for n in range(60)]


# -- the template's payload depth ----------------------------------------------------------


def test_a_payload_post_jobs_takes_is_taken_by_a_schedule(schedules: Schedules, api: Any,
                                                          producer: Key) -> None:
    deepest = _nested(MAX_JSON_DEPTH)
    assert api.enqueue(producer, payload=deepest).status_code == 201
    created = schedules.create(cron="0 3 * * *", job={"type": "email", "payload": deepest})
    assert created.status_code == 201, created.get_json().get("errors")
    assert created.get_json()["job"]["payload"] == deepest
    assert schedules.patch("nightly", job={"type": "email",
                                           "payload": deepest}).status_code == 200
    # One past the limit is refused alike, naming the same field under job.
    assert api.enqueue(producer, payload=_nested(MAX_JSON_DEPTH + 1)).status_code == 422
    refused = schedules.create(name="deeper", cron="0 3 * * *",
                               job={"type": "email", "payload": _nested(MAX_JSON_DEPTH + 1)})
    assert refused.status_code == 422
    assert list(refused.get_json()["errors"]) == ["job.payload"]


# -- slots a unique key skips ----------------------------------------------------------------


def test_a_slot_its_unique_key_rejects_is_logged_and_counted(
        schedules: Schedules, clock: ManualClock, caplog: pytest.LogCaptureFixture) -> None:
    set_clock(clock, "2027-01-15T08:00:30Z")
    secret = "payload-marker-7f3a"
    created = schedules.create(cron="* * * * *", job={
        "type": "email", "payload": {"to": secret},
        "unique": {"key": "nightly-report", "on_conflict": "reject"}})
    assert created.status_code == 201, created.get_json()
    set_clock(clock, "2027-01-15T08:01:00.100Z")
    assert schedules.fire() == 1  # nobody claims it: it is still pending at the next slot
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="app.schedules.service"):
        set_clock(clock, "2027-01-15T08:02:00.100Z")
        assert schedules.fire() == 0
    (first,) = schedules.jobs()
    said = [r.getMessage() for r in caplog.records if r.name == "app.schedules.service"]
    assert len(said) == 1 and "nightly" in said[0] and "2027-01-15T08:02:00" in said[0]
    assert str(first["id"]) in said[0]
    assert secret not in caplog.text
    text = schedules.client.get("/metrics", headers=schedules.admin.headers).get_data(True)
    assert 'queuelog_schedule_skipped_slots_total{reason="unique"} 1.0' in text
    assert "queuelog_schedule_firings_total 1.0" in text
    # The schedule moved on, and shows the slot that did enqueue.
    shown = schedules.get("nightly").get_json()
    assert shown["next_run_at"] == "2027-01-15T08:03:00.000000Z"
    assert shown["last_run_at"] == "2027-01-15T08:01:00.000000Z"
    assert json.dumps(shown).count(secret) == 1  # the template, shown to the admin as saved


def test_schedules_whose_zone_this_host_cannot_read_never_hold_up_the_others(
        schedules: Schedules, clock: ManualClock, app: Flask,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # Saved where the zone database knew a zone this one does not: more of them than a batch
    # takes, all more overdue than the readable one.
    monkeypatch.setattr(schedule_service, "FIRE_BATCH", 2)
    set_clock(clock, "2027-01-15T08:00:30Z")
    schedules.create(name="readable", cron="* * * * *")
    db = app.extensions["queuelog"].db
    with db.write() as conn:
        for n in range(3):
            conn.execute(schedules_table.insert().values(
                name=f"elsewhere-{n}", cron="* * * * *", timezone="Mars/Olympus_Mons",
                job='{"type":"email","payload":{}}', catch_up="latest", paused=False,
                next_run_at=micros("2027-01-15T07:00:00Z"), last_run_at=None,
                last_job_id=None, created_at=0, updated_at=0))
    with caplog.at_level(logging.WARNING, logger="app.schedules.service"):
        set_clock(clock, "2027-01-15T08:01:00.100Z")
        assert schedules.fire() == 1
        set_clock(clock, "2027-01-15T08:02:00.100Z")
        assert schedules.fire() == 1
    said = [r.getMessage() for r in caplog.records if "cannot compute its slots" in
            r.getMessage()]
    assert sorted(said) == [f"schedule elsewhere-{n}: cannot compute its slots (cron "
                            "'* * * * *', zone 'Mars/Olympus_Mons')" for n in range(3)]
    assert schedules.slots() == ["2027-01-15T08:01:00Z", "2027-01-15T08:02:00Z"]


@pytest.mark.parametrize("template", [
    {"type": "email", "payload": {"a": [1, 2.5, None]}},
    {"type": "email", "payload": {}, "priority": "HIGH", "max_retries": 0,
     "concurrency_key": "customer-1"},
    {"type": "email", "payload": {"x": 1},
     "unique": {"key": "k", "on_conflict": "replace"}},
])
def test_a_stored_template_loads_at_firing_as_the_template_schema_loads_it(
        template: dict[str, Any]) -> None:
    from app.jobs.web.fastload import load_batch
    from app.schedules.schemas import JobTemplateSchema

    excluded = set(JobTemplateSchema.Meta.exclude)
    fast = load_batch({"jobs": [template]})["jobs"][0]
    assert all(fast.get(name) is None for name in excluded)
    assert {k: v for k, v in fast.items() if k not in excluded} == \
        JobTemplateSchema().load(template)
