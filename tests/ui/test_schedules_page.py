"""The dashboard's schedules (contract section 14): on the overview with their next and last
run, and on /ui/schedules with Pause, Resume and Delete forms that go through the schedule
service as PATCH and DELETE /schedules do."""

from __future__ import annotations

import html
from typing import Any

from flask import Flask
from flask.testing import FlaskClient

from app.core.clock import ManualClock
from tests.conftest import Key
from tests.ui.conftest import csrf_of, post_form, sign_in, without_live_script

HOSTILE = "<script>alert('schedule')</script>"


def _create(client: FlaskClient, admin: Key, name: str = "nightly", **body: Any) -> Any:
    body = {"name": name, "cron": "*/5 * * * *", "timezone": "Europe/Berlin",
            "job": {"type": "email", "payload": {"to": "ops@example.com"}}} | body
    answer = client.post("/schedules", json=body, headers=admin.headers)
    assert answer.status_code == 201, answer.get_json()
    return answer.get_json()


def _shown(client: FlaskClient, admin: Key, name: str) -> Any:
    return client.get(f"/schedules/{name}", headers=admin.headers)


def test_the_overview_shows_each_schedule_with_its_next_and_last_run_and_last_job(
        signed_in: FlaskClient, client: FlaskClient, admin: Key, app: Flask,
        clock: ManualClock) -> None:
    _create(client, admin, "nightly")
    _create(client, admin, "weekly.digest", cron="@weekly", timezone="UTC", paused=True)
    clock.advance(300)
    assert app.extensions["queuelog"].schedules.fire_due() == 1
    job_id = _shown(client, admin, "nightly").get_json()["last_job_id"]
    clock.advance(60)
    page = signed_in.get("/ui/").text
    assert '<h2 id="schedules-heading">Schedules</h2>' in page
    nightly = page.split('<th scope="row">nightly</th>')[1].split("</tr>")[0]
    assert "<code>*/5 * * * *</code>" in nightly and "Europe/Berlin" in nightly
    assert "<td>email</td>" in nightly and "active" in nightly
    assert "(in 4 min)" in nightly  # the next slot, 4 minutes ahead
    assert "(1 min ago)" in nightly  # the last run
    assert f'<a href="/ui/jobs/{job_id}">{job_id}</a>' in nightly
    weekly = page.split('<th scope="row">weekly.digest</th>')[1].split("</tr>")[0]
    assert "paused" in weekly and "<td>—</td>" in weekly  # never ran: no last run, no job
    assert "Pause" not in page  # the buttons are on the schedules page
    # Navigation names the new page.
    assert '<a href="/ui/schedules">Schedules</a>' in page


def test_the_schedules_page_lists_them_with_their_job_and_buttons(
        signed_in: FlaskClient, client: FlaskClient, admin: Key) -> None:
    assert "No schedules" in signed_in.get("/ui/schedules").text
    _create(client, admin, "nightly")
    _create(client, admin, "hourly", cron="@hourly", paused=True)
    answer = signed_in.get("/ui/schedules")
    assert answer.status_code == 200
    page = answer.text
    assert 'aria-current="page">Schedules</a>' in page
    assert page.index('<th scope="row">hourly</th>') < page.index('<th scope="row">nightly</th>')
    assert "ops@example.com" in page
    for action in ("/ui/schedules/nightly/pause", "/ui/schedules/nightly/delete",
                   "/ui/schedules/hourly/resume", "/ui/schedules/hourly/delete"):
        assert f'action="{action}"' in page, action
    assert 'action="/ui/schedules/nightly/resume"' not in page


def test_pause_resume_and_delete_change_the_schedule(
        signed_in: FlaskClient, client: FlaskClient, admin: Key) -> None:
    _create(client, admin, "nightly")
    answer = post_form(signed_in, "/ui/schedules", "/ui/schedules/nightly/pause")
    assert answer.status_code == 302 and answer.headers["Location"] == "/ui/schedules"
    assert _shown(client, admin, "nightly").get_json()["paused"] is True
    assert "nightly: paused." in signed_in.get("/ui/schedules").text

    post_form(signed_in, "/ui/schedules", "/ui/schedules/nightly/resume")
    assert _shown(client, admin, "nightly").get_json()["paused"] is False
    assert "nightly: resumed." in signed_in.get("/ui/schedules").text

    post_form(signed_in, "/ui/schedules", "/ui/schedules/nightly/delete")
    assert _shown(client, admin, "nightly").status_code == 404
    page = signed_in.get("/ui/schedules").text
    assert "nightly: deleted" in page and '<th scope="row">nightly</th>' not in page


def test_a_refused_change_is_a_message_not_a_server_error(signed_in: FlaskClient) -> None:
    for name in ("gone", "no%20such", "nul%00", "%3Cb%3Ebold%3C%5Cb%3E", "x" * 150):
        for verb in ("pause", "resume", "delete"):
            answer = post_form(signed_in, "/ui/schedules", f"/ui/schedules/{name}/{verb}")
            assert answer.status_code == 302, (name, verb)
            page = signed_in.get("/ui/schedules").text
            assert '<li class="error">No such schedule.</li>' in page, (name, verb)
            assert "<b>" not in page


def test_schedule_forms_without_their_csrf_token_are_refused(
        signed_in: FlaskClient, client: FlaskClient, admin: Key) -> None:
    _create(client, admin, "nightly")
    for verb in ("pause", "resume", "delete"):
        for data in ({}, {"csrf_token": "forged"}):
            answer = signed_in.post(f"/ui/schedules/nightly/{verb}", data=data)
            assert answer.status_code == 400, verb
            assert "CSRF" in answer.text
    shown = _shown(client, admin, "nightly")
    assert shown.status_code == 200 and shown.get_json()["paused"] is False


def test_only_an_admin_session_reaches_the_schedules(
        client: FlaskClient, admin: Key, producer: Key, worker: Key) -> None:
    _create(client, admin, "nightly")
    for key in (producer, worker):
        assert sign_in(client, key).status_code == 403
        assert client.get("/ui/schedules").headers["Location"] == "/ui/sign-in"
        # A form posted with a valid CSRF token but no admin session changes nothing.
        token = csrf_of(client.get("/ui/sign-in").text)
        for verb in ("pause", "delete"):
            answer = client.post(f"/ui/schedules/nightly/{verb}", data={"csrf_token": token})
            assert answer.status_code == 302 and answer.headers["Location"] == "/ui/sign-in"
    shown = _shown(client, admin, "nightly")
    assert shown.status_code == 200 and shown.get_json()["paused"] is False


def test_a_schedules_job_is_shown_as_text(signed_in: FlaskClient, client: FlaskClient,
                                          admin: Key) -> None:
    # Schedule names are plain ([A-Za-z0-9._-]); the job template a client sent is not.
    _create(client, admin, "marked-up",
            job={"type": "email", "payload": {"html": HOSTILE, "to": '"><img src=x>'}})
    for page in ("/ui/schedules", "/ui/"):
        text = signed_in.get(page).text
        assert "<script" not in without_live_script(text) and "<img" not in text, page
    text = signed_in.get("/ui/schedules").text
    assert html.escape(HOSTILE, quote=False) in text or "&lt;script&gt;" in text


def test_a_schedule_type_named_like_markup_is_shown_as_text(app_config: dict[str, Any],
                                                            admin: Key) -> None:
    from app import create_app

    hostile_type = '"><img src=x onerror=alert(1)>'
    built = create_app({**app_config, "JOB_TYPES": frozenset({"email", hostile_type})})
    client = built.test_client()
    created = client.post("/schedules", headers=admin.headers, json={
        "name": "odd", "cron": "@daily", "job": {"type": hostile_type, "payload": {}}})
    assert created.status_code == 201
    sign_in(client, admin)
    for page in ("/ui/", "/ui/schedules"):
        text = client.get(page).text
        assert "<img" not in text, page
        assert "&lt;img src=x onerror=alert(1)&gt;" in text, page
    built.extensions["queuelog"].db.engine.dispose()


def test_a_workflow_schedule_shows_its_workflow_and_links_the_last_one_it_made(
        signed_in: FlaskClient, client: FlaskClient, admin: Key, app: Flask,
        clock: ManualClock) -> None:
    created = client.post("/schedules", headers=admin.headers, json={
        "name": "orders", "cron": "*/5 * * * *", "workflow": {"name": HOSTILE, "jobs": [
            {"ref": "charge", "type": "email"},
            {"ref": "mail", "type": "pdf", "depends_on": ["charge"]}]}})
    assert created.status_code == 201, created.get_json()
    clock.advance(300)
    assert app.extensions["queuelog"].schedules.fire_due() == 1
    workflow_id = _shown(client, admin, "orders").get_json()["last_workflow_id"]
    page = signed_in.get("/ui/schedules").text
    row = page.split('<th scope="row">orders</th>')[1].split("</tr>")[0]
    assert "<td>workflow of 2 jobs</td>" in row
    assert f'<a href="/ui/workflows/{workflow_id}">workflow {workflow_id}</a>' in row
    assert HOSTILE not in page and html.escape(HOSTILE).replace("&#x27;", "&#39;") in row
