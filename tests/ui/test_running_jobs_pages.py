"""Running jobs on the dashboard (contract §17): a job's progress as a bar on its page and a
share in the jobs list, its timeout and expiry, and the Cancel button of a running job, which
asks its worker to stop rather than stopping it."""

from __future__ import annotations

import re

from flask.testing import FlaskClient
from markupsafe import escape

from app.core.clock import MICROS, ManualClock, parse_rfc3339, to_rfc3339
from tests.conftest import Api, Key
from tests.ui.conftest import post_form


def _running(api: Api, producer: Key, worker: Key, **body: object) -> tuple[int, str]:
    """A job enqueued with `body` and claimed by `worker`: (its id, its lease token)."""
    job_id = int(api.enqueue(producer, payload={}, **body).get_json()["id"])
    claimed = api.claim(worker).get_json()
    assert claimed["id"] == job_id
    return job_id, claimed["lease_token"]


def _row_of(page: str, job_id: int) -> str:
    """The jobs list's row of `job_id`."""
    row = page[page.index(f'<a href="/ui/jobs/{job_id}">'):]
    return row[:row.index("</tr>")]


def test_a_running_jobs_page_shows_its_progress_as_a_bar_once_it_reports(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key) -> None:
    job_id, token = _running(api, producer, worker)
    page = signed_in.get(f"/ui/jobs/{job_id}").text
    assert "No progress reported." in page and "<progress" not in page

    beat = api.heartbeat(worker, job_id, lease_token=token, progress={"done": 42, "total": 120},
                         message="<b>rows</b> of invoices.csv")
    assert beat.status_code == 200, beat.get_json()
    reported = beat.get_json()["progress"]["at"]

    page = signed_in.get(f"/ui/jobs/{job_id}").text
    assert '<progress id="job-progress" value="42" max="120"' in page
    assert '<span id="progress-count" data-live="progress_count">42 / 120</span>' in page
    assert "(35 %)" in page
    # The worker's message is text, never markup.
    message = escape("<b>rows</b> of invoices.csv")
    assert f'<p id="progress-message" data-live="progress_message">{message}</p>' in page
    assert "<b>rows</b>" not in page
    assert f'Reported <span data-live="progress_at"><time datetime="{reported}">' in page
    assert "No progress reported." not in page


def test_a_finished_job_keeps_its_last_progress_and_a_message_alone_draws_no_bar(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key) -> None:
    job_id, token = _running(api, producer, worker)
    api.heartbeat(worker, job_id, lease_token=token, progress={"done": 7, "total": 7})
    api.complete(worker, job_id, result={}, lease_token=token)
    page = signed_in.get(f"/ui/jobs/{job_id}").text
    assert '<progress id="job-progress" value="7" max="7"' in page and "(100 %)" in page
    assert "the last report before the job ended" in page

    talker, token = _running(api, producer, worker)
    api.heartbeat(worker, talker, lease_token=token, message="warming up")
    page = signed_in.get(f"/ui/jobs/{talker}").text
    assert '<p id="progress-message" data-live="progress_message">warming up</p>' in page
    assert "<progress" not in page and "progress-count" not in page


def test_progress_left_by_an_attempt_that_failed_is_said_to_be_an_earlier_attempts(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key) -> None:
    job_id, token = _running(api, producer, worker, max_retries=2)
    api.heartbeat(worker, job_id, lease_token=token, progress={"done": 3, "total": 10})
    assert api.fail(worker, job_id, lease_token=token).get_json()["status"] == "pending"
    page = signed_in.get(f"/ui/jobs/{job_id}").text
    assert '<progress id="job-progress" value="3" max="10"' in page
    assert ", by an earlier attempt." in page and "before the job ended" not in page


def test_a_job_that_never_ran_shows_no_progress_at_all(
        signed_in: FlaskClient, api: Api, producer: Key) -> None:
    job_id = api.enqueue(producer, payload={}).get_json()["id"]
    page = signed_in.get(f"/ui/jobs/{job_id}").text
    assert "<progress" not in page and "Progress</h2>" not in page
    assert "No progress reported." not in page


def test_the_jobs_list_shows_each_jobs_progress(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key) -> None:
    busy, token = _running(api, producer, worker)
    api.heartbeat(worker, busy, lease_token=token, progress={"done": 999, "total": 1000})
    quiet, _token = _running(api, producer, worker)
    empty, token = _running(api, producer, worker)
    api.heartbeat(worker, empty, lease_token=token, progress={"done": 0, "total": 0})
    waiting = api.enqueue(producer, payload={}).get_json()["id"]

    page = signed_in.get("/ui/jobs").text
    assert '<th scope="col">Progress</th>' in page
    row = _row_of(page, busy)
    # Rounded down: 99.9 % is not yet done.
    assert '<progress value="999" max="1000"' in row and "99 %" in row
    assert "0 / 0" in _row_of(page, empty) and "<progress" not in _row_of(page, empty)
    for silent in (quiet, waiting):
        assert "<progress" not in _row_of(page, silent) and "%" not in _row_of(page, silent)


def test_a_running_jobs_cancel_button_requests_the_cancel_of_its_worker(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key, admin: Key,
        clock: ManualClock) -> None:
    job_id, token = _running(api, producer, worker, max_retries=3)
    page = f"/ui/jobs/{job_id}"
    assert ">Request cancel</button>" in signed_in.get(page).text

    answer = post_form(signed_in, page, f"{page}/cancel")
    assert answer.status_code == 302 and answer.headers["Location"] == page
    shown = api.get(admin, job_id).get_json()
    assert (shown["status"], shown["cancel_requested"]) == ("running", True)
    after = signed_in.get(page).text
    asked = to_rfc3339(clock.now_us())
    assert "Cancel requested (by admin-1, " in after
    assert "the worker will be told at its next heartbeat" in after
    assert "Cancelled." not in after
    assert (f'Cancel requested by <strong>admin-1</strong>, <time datetime="{asked}">'
            in after)
    # Asked once: the page offers no second request, and the list says so too.
    assert "Request cancel</button>" not in after
    assert "(cancel requested)" in _row_of(signed_in.get("/ui/jobs").text, job_id)

    beat = api.heartbeat(worker, job_id, lease_token=token).get_json()
    assert (beat["status"], beat["cancel_requested"]) == ("running", True)
    api.fail(worker, job_id, lease_token=token, error="stopped on request")
    ended = signed_in.get(page).text
    assert api.get(admin, job_id).get_json()["status"] == "cancelled"
    assert 'id="cancel-requested"' not in ended and "Request cancel" not in ended


def test_a_pending_jobs_cancel_button_cancels_it_at_once(
        signed_in: FlaskClient, api: Api, producer: Key, admin: Key) -> None:
    job_id = api.enqueue(producer, payload={}).get_json()["id"]
    page = f"/ui/jobs/{job_id}"
    assert ">Cancel</button>" in signed_in.get(page).text
    post_form(signed_in, page, f"{page}/cancel")
    assert api.get(admin, job_id).get_json()["status"] == "cancelled"
    after = signed_in.get(page).text
    assert "Cancelled." in after and "Cancel requested" not in after


def test_a_running_jobs_cancel_needs_its_csrf_token(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key, admin: Key) -> None:
    job_id, _token = _running(api, producer, worker)
    refused = signed_in.post(f"/ui/jobs/{job_id}/cancel", data={"csrf_token": "forged"})
    assert refused.status_code == 400
    assert api.get(admin, job_id).get_json()["cancel_requested"] is False


def test_a_jobs_timeout_and_expiry_are_shown(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key, admin: Key) -> None:
    job_id = api.enqueue(producer, payload={}, timeout_seconds=300,
                         expires_in_seconds=3600).get_json()["id"]
    expires = api.get(admin, job_id).get_json()["expires_at"]
    page = signed_in.get(f"/ui/jobs/{job_id}").text
    timeout = re.search(r'<td id="timeout">(.*?)</td>', page, re.S)
    assert timeout is not None and timeout.group(1) == "5 min an attempt (300 s)"
    assert f'<td id="expires"><time datetime="{expires}">' in page
    assert "cancelled if no worker has claimed it by then" in page

    claimed = api.claim(worker).get_json()
    deadline = to_rfc3339(parse_rfc3339(claimed["claimed_at"]) + 300 * MICROS)
    page = signed_in.get(f"/ui/jobs/{job_id}").text
    assert f"this attempt's deadline: <time datetime=\"{deadline}\">" in page

    plain = api.enqueue(producer, payload={}).get_json()["id"]
    page = signed_in.get(f"/ui/jobs/{plain}").text
    assert 'id="timeout"' not in page and 'id="expires"' not in page


def test_a_reserved_jobs_page_offers_its_release(
        signed_in: FlaskClient, api: Api, producer: Key, admin: Key) -> None:
    job_id = api.enqueue(producer, reserve={"confirm_within_seconds": 60}).get_json()["id"]
    page = f"/ui/jobs/{job_id}"
    shown = signed_in.get(page).text
    assert ">Release</button>" in shown and "Reserved: it waits for its producer" in shown
    post_form(signed_in, page, f"{page}/cancel")
    assert api.get(admin, job_id).get_json()["status"] == "cancelled"
    assert "Released." in signed_in.get(page).text
