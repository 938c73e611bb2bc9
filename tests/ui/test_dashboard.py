"""The dashboard through Flask's test client: who gets in, what the pages show (as text,
never markup), and what the forms change."""

from __future__ import annotations

import html
from typing import Any

from flask import Flask
from flask.testing import FlaskClient

from app.core.clock import ManualClock
from app.core.limits import RATE, TYPE_LIMIT
from tests.conftest import Api, Key
from tests.ui.conftest import csrf_of, post_form, sign_in, without_live_script

HOSTILE = "<script>alert(1)</script>"


def _failed_job(api: Api, producer: Key, worker: Key, **payload: Any) -> int:
    job_id = api.enqueue(producer, type="email", payload=payload or {"to": "a@example.com"},
                         max_retries=0).get_json()["id"]
    claimed = api.claim(worker).get_json()
    api.fail(worker, job_id, error="smtp said no", lease_token=claimed["lease_token"])
    return int(job_id)


def test_a_page_without_a_session_redirects_to_sign_in(client: FlaskClient) -> None:
    for page in ("/ui/", "/ui/jobs", "/ui/jobs/1", "/ui/types", "/ui/schedules"):
        answer = client.get(page)
        assert answer.status_code == 302, page
        assert answer.headers["Location"] == "/ui/sign-in"


def test_an_admin_token_signs_in_to_a_strict_httponly_session_that_holds_no_token(
        client: FlaskClient, admin: Key) -> None:
    answer = sign_in(client, admin)
    assert answer.status_code == 302
    cookie = answer.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui" in cookie
    assert "Secure" not in cookie  # plain http here
    assert admin.token not in cookie
    assert client.get("/ui/").status_code == 200


def test_the_session_cookie_is_secure_over_https(client: FlaskClient, admin: Key) -> None:
    page = client.get("/ui/sign-in", base_url="https://localhost")
    answer = client.post("/ui/sign-in", base_url="https://localhost",
                         data={"token": admin.token, "csrf_token": csrf_of(page.text)})
    assert answer.status_code == 302
    assert "Secure" in answer.headers["Set-Cookie"]


def test_producer_and_worker_tokens_are_refused_with_a_clear_message(
        client: FlaskClient, producer: Key, worker: Key) -> None:
    for key, role in ((producer, "producer"), (worker, "worker")):
        answer = sign_in(client, key)
        assert answer.status_code == 403
        assert f"A {role} key may not use the dashboard" in answer.text
        assert client.get("/ui/").status_code == 302


def test_an_unknown_token_is_refused(client: FlaskClient) -> None:
    answer = sign_in(client, Key("nobody", "ql_not-a-token"))
    assert answer.status_code == 401
    assert "unknown or revoked" in answer.text


def test_a_revoked_keys_session_ends_at_its_next_page(app: Flask, signed_in: FlaskClient) -> None:
    assert signed_in.get("/ui/").status_code == 200
    app.extensions["queuelog"].keys.revoke_key("admin-1")
    answer = signed_in.get("/ui/jobs")
    assert answer.status_code == 302 and answer.headers["Location"] == "/ui/sign-in"


def test_a_session_older_than_eight_hours_ends(signed_in: FlaskClient,
                                               clock: ManualClock) -> None:
    clock.advance(8 * 3600 - 1)
    assert signed_in.get("/ui/").status_code == 200
    clock.advance(1)
    assert signed_in.get("/ui/").headers["Location"] == "/ui/sign-in"


def test_sign_out_is_a_post_with_its_csrf_token_and_ends_the_session(
        signed_in: FlaskClient) -> None:
    assert signed_in.get("/ui/sign-out").status_code == 405
    answer = post_form(signed_in, "/ui/", "/ui/sign-out")
    assert answer.headers["Location"] == "/ui/sign-in?signed_out=1"
    assert "Signed out." in signed_in.get(answer.headers["Location"]).text
    assert signed_in.get("/ui/").status_code == 302


def test_a_form_posted_without_its_csrf_token_is_refused(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key) -> None:
    job_id = _failed_job(api, producer, worker)
    for action in (f"/ui/jobs/{job_id}/retry", "/ui/types/email/pause", "/ui/sign-out"):
        answer = signed_in.post(action, data={})
        assert answer.status_code == 400, action
        assert "CSRF" in answer.text
        answer = signed_in.post(action, data={"csrf_token": "forged"})
        assert answer.status_code == 400, action
    assert signed_in.get(f"/ui/jobs/{job_id}").status_code == 200  # still signed in
    assert "failed" in signed_in.get(f"/ui/jobs/{job_id}").text


def test_sign_in_without_a_csrf_token_is_refused(client: FlaskClient, admin: Key) -> None:
    assert client.post("/ui/sign-in", data={"token": admin.token}).status_code == 400


def test_the_json_api_asks_for_no_csrf_token(client: FlaskClient, api: Api, producer: Key,
                                             admin: Key) -> None:
    assert api.enqueue(producer, type="email", payload={}).status_code == 201
    assert client.post("/jobs/1/cancel", headers=admin.headers, json={}).status_code == 200
    assert "Set-Cookie" not in client.get("/types", headers=admin.headers).headers


def test_dashboard_responses_forbid_inline_scripts_framing_referrers_and_caching(
        client: FlaskClient, signed_in: FlaskClient) -> None:
    for page in ("/ui/sign-in", "/ui/", "/ui/static/ui.css", "/ui/static/live.js",
                 "/ui/live/overview"):
        headers = signed_in.get(page).headers
        policy = headers["Content-Security-Policy"]
        directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
        assert directives["default-src"] == "'none'" and directives["frame-ancestors"] == "'none'"
        # Scripts from our own files only, asking only our own origin: never inline, never
        # eval, never HTML written by a script (Trusted Types with no policy at all).
        assert directives["script-src"] == "'self'" and directives["connect-src"] == "'self'"
        assert directives["require-trusted-types-for"] == "'script'"
        assert directives["trusted-types"] == "'none'"
        assert "unsafe" not in policy and "data:" not in policy and "*" not in policy
        assert headers["X-Frame-Options"] == "DENY"
        assert headers["Referrer-Policy"] == "no-referrer"
        assert headers["Cache-Control"] == "no-store"


def test_the_overview_shows_each_type_its_counts_and_the_workers(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key, clock: ManualClock) -> None:
    _failed_job(api, producer, worker)
    clock.advance(180)
    page = signed_in.get("/ui/").text
    assert 'href="/ui/jobs?type=email&amp;status=failed">1</a>' in page
    for name in ("email", "pdf", "sync", "worker-1"):
        assert f'<th scope="row">{name}' in page or f">{name}</a></th>" in page
    assert " UTC</time>" in page and "(3 min ago)" in page


def test_what_producers_and_workers_sent_is_shown_as_text(
        signed_in: FlaskClient, app: Flask, api: Api, make_key: Any) -> None:
    producer = make_key("p-x", "producer")  # key names are plain; payloads and errors not
    worker = make_key("w-1", "worker")
    job_id = api.enqueue(producer, type="email", payload={"html": HOSTILE},
                         concurrency_key=HOSTILE[:30].replace(" ", "_"),
                         max_retries=0).get_json()["id"]
    claimed = api.claim(worker).get_json()
    api.fail(worker, job_id, error=HOSTILE, lease_token=claimed["lease_token"])
    for page in (f"/ui/jobs/{job_id}", "/ui/jobs", "/ui/jobs?producer=p-x"):
        text = signed_in.get(page).text
        assert "<script" not in without_live_script(text), page
        assert html.escape(HOSTILE, quote=False) in text or "&lt;script&gt;" in text, page


def test_job_page_shows_payload_error_attempts_events_and_explanation(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key) -> None:
    job_id = _failed_job(api, producer, worker, to="ada@example.com")
    page = signed_in.get(f"/ui/jobs/{job_id}").text
    assert "ada@example.com" in page and "smtp said no" in page
    assert '<table id="attempts">' in page and "worker-1" in page
    for event in ("enqueued", "claimed", "failed"):
        assert f"<td>{event}</td>" in page
    assert "<strong>finished</strong>" in page
    assert "Retry" in page


def test_retry_and_cancel_buttons_move_the_job(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key, admin: Key) -> None:
    job_id = _failed_job(api, producer, worker)
    page = f"/ui/jobs/{job_id}"
    answer = post_form(signed_in, page, f"{page}/retry")
    assert answer.headers["Location"] == page
    assert api.get(admin, job_id).get_json()["status"] == "pending"
    assert "Sent back to pending." in signed_in.get(page).text
    post_form(signed_in, page, f"{page}/cancel")
    assert api.get(admin, job_id).get_json()["status"] == "cancelled"
    # A second cancel is the service's 409: a message on the page, not an error page.
    post_form(signed_in, page, f"{page}/cancel")
    assert "error" in signed_in.get(page).text


def test_an_unknown_job_is_a_404_page(signed_in: FlaskClient) -> None:
    answer = signed_in.get("/ui/jobs/999")
    assert answer.status_code == 404 and "No such job." in answer.text


def test_jobs_are_filtered_and_paginated(signed_in: FlaskClient, api: Api, producer: Key,
                                         make_key: Any) -> None:
    other = make_key("producer-2", "producer")
    for n in range(60):
        api.enqueue(producer if n % 2 else other, type="email" if n < 55 else "pdf",
                    payload={"n": n})
    first = signed_in.get("/ui/jobs").text
    assert first.count('<th scope="row"><a href="/ui/jobs/') == 50
    assert 'rel="next"' in first
    next_link = first.split('<a href="')[-1]
    assert "cursor=" in first
    assert next_link
    pdf = signed_in.get("/ui/jobs?type=pdf&status=pending").text
    assert pdf.count('<th scope="row"><a href="/ui/jobs/') == 5
    mine = signed_in.get("/ui/jobs?producer=producer-2&type=").text
    assert mine.count('<th scope="row"><a href="/ui/jobs/') == 30



def test_running_jobs_are_listed_by_producer_in_id_order(signed_in: FlaskClient, api: Api,
                                                         producer: Key, worker: Key,
                                                         make_key: Any) -> None:
    other = make_key("producer-2", "producer")
    ids = [api.enqueue(producer if n % 2 else other, type="email",
                       payload={"n": n}).get_json()["id"] for n in range(6)]
    claimed = [api.claim(worker).get_json()["id"] for _ in range(4)]
    page = signed_in.get("/ui/jobs?status=running&producer=producer-1&order=oldest").text
    shown = [int(part.split('"', 1)[0]) for part in page.split('<a href="/ui/jobs/')[1:]]
    assert shown == sorted(i for i in claimed if ids.index(i) % 2)


def test_a_bad_filter_is_a_message_not_a_server_error(signed_in: FlaskClient) -> None:
    # NUL cannot reach PostgreSQL's text: a message, not a 500 from the database.
    for query in ("status=lost", "cursor=not-ours", "colour=red", "type=em%00ail",
                  "producer=a%00b"):
        answer = signed_in.get(f"/ui/jobs?{query}")
        assert answer.status_code in (400, 422), query
        assert 'class="error"' in answer.text, query


def test_types_are_paused_resumed_and_their_limits_changed(
        signed_in: FlaskClient, admin: Key, client: FlaskClient) -> None:
    post_form(signed_in, "/ui/types", "/ui/types/email/pause")
    assert client.get("/types/email", headers=admin.headers).get_json()["paused"] is True
    post_form(signed_in, "/ui/types", "/ui/types/email/resume")
    assert client.get("/types/email", headers=admin.headers).get_json()["paused"] is False
    post_form(signed_in, "/ui/types", "/ui/types/email/limits",
              {"max_running": "5", "max_running_per_key": "", "rate_per_second": "2.5",
               "burst": "4"})
    shown = client.get("/types/email", headers=admin.headers).get_json()
    assert (shown["max_running"], shown["rate_per_second"], shown["burst"]) == (5, 2.5, 4)
    assert "email: limits changed." in signed_in.get("/ui/types").text


def test_the_limits_form_offers_the_bounds_the_api_enforces(signed_in: FlaskClient) -> None:
    page = signed_in.get("/ui/types").text
    assert f'name="max_running" min="{TYPE_LIMIT.min}" max="{TYPE_LIMIT.max}"' in page
    assert f'name="burst" min="{TYPE_LIMIT.min}" max="{TYPE_LIMIT.max}"' in page
    assert f'name="rate_per_second" min="{RATE.min}" max="{RATE.max}"' in page


def test_a_bad_limit_is_a_message_and_changes_nothing(
        signed_in: FlaskClient, admin: Key, client: FlaskClient) -> None:
    # Other scripts' digits and underscores, which int() and float() take: ASCII digits
    # only, as the API's query strings.
    for form in ({"max_running": "0"}, {"max_running": "lots"}, {"rate_per_second": "nan"},
                 {"burst": "1e9"}, {"max_running": "\u0663"}, {"burst": "\uff17"},
                 {"max_running_per_key": "1_000"}, {"rate_per_second": "2_5"},
                 {"rate_per_second": "\u0662.5"}, {"rate_per_second": "-1"}):
        answer = post_form(signed_in, "/ui/types", "/ui/types/email/limits", form)
        assert answer.status_code == 302, form
        page = signed_in.get("/ui/types").text
        assert 'class="error"' in page and "email: " in page, form
    shown = client.get("/types/email", headers=admin.headers).get_json()
    assert (shown["max_running"], shown["max_running_per_key"], shown["rate_per_second"]) \
        == (None, None, None)
    answer = post_form(signed_in, "/ui/types", "/ui/types/nosuch/pause")
    assert "not in QUEUELOG_JOB_TYPES" in signed_in.get("/ui/types").text


def test_a_session_is_the_same_in_every_process(app_config: dict[str, Any],
                                                admin: Key) -> None:
    from app import create_app

    first, second = create_app(app_config), create_app(app_config)
    a, b = first.test_client(), second.test_client()
    assert sign_in(a, admin).status_code == 302
    cookie = a.get_cookie("queuelog_session", path="/ui")
    assert cookie is not None
    b.set_cookie("queuelog_session", cookie.value, path="/ui")
    assert b.get("/ui/").status_code == 200  # the other "process" reads the same row
    assert post_form(b, "/ui/", "/ui/sign-out").status_code == 302
    assert a.get("/ui/").status_code == 302  # and signed out there, it is over here
    for built in (first, second):
        built.extensions["queuelog"].db.engine.dispose()


def test_a_type_named_like_markup_is_shown_as_text(app_config: dict[str, Any],
                                                   admin: Key) -> None:
    from app import create_app

    hostile_type = '"><img src=x onerror=alert(1)>'
    built = create_app({**app_config, "JOB_TYPES": frozenset({"email", hostile_type})})
    client = built.test_client()
    sign_in(client, admin)
    for page in ("/ui/", "/ui/types", "/ui/jobs"):
        text = client.get(page).text
        assert "<img" not in text, page
        assert "&lt;img src=x onerror=alert(1)&gt;" in text, page
    built.extensions["queuelog"].db.engine.dispose()
