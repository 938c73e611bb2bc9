"""The live pages (the overview, a type's page, a job's page, the failures page): each carries
the dashboard's one script and marks its figures; each has a JSON twin under /ui/live/ that
answers those figures as the page writes them, read no heavier than the page, behind the
same session (401 without one, so the script stops), under the same strict headers."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import event

from app.core.clock import ManualClock
from app.ui.security import CONTENT_SECURITY_POLICY
from tests.conftest import Api, Key
from tests.ui.conftest import LIVE_SCRIPT, sign_in

SCRIPT = Path(__file__).resolve().parents[2] / "app" / "ui" / "static" / "live.js"


class _Marks(HTMLParser):
    """A page's live marks: each data-live element's text (whitespace collapsed) and
    attributes, and the status line's attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.marks: dict[str, dict[str, Any]] = {}
        self.status: dict[str, str | None] = {}
        self._open: list[tuple[str, str, list[str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id") == "live":
            self.status = found
        key = found.get("data-live")
        if key is not None:
            assert key not in self.marks, f"{key} marked twice"
            self.marks[key] = {"attrs": found}
            self._open.append((tag, key, []))
        elif self._open and tag == self._open[-1][0]:
            self._open.append((tag, "", []))  # the same tag nested: closes first

    def handle_endtag(self, tag: str) -> None:
        if self._open and self._open[-1][0] == tag:
            _tag, key, texts = self._open.pop()
            if key:
                self.marks[key]["text"] = " ".join("".join(texts).split())

    def handle_data(self, data: str) -> None:
        for _tag, _key, texts in self._open:
            texts.append(data)


def _marks(page: str) -> _Marks:
    parser = _Marks()
    parser.feed(page)
    return parser


def _said(figure: Any) -> str:
    """A figure's text as the page shows it."""
    if figure is None:
        return "—"
    if isinstance(figure, str):
        return " ".join(figure.split())
    if "time" in figure:
        return f"{figure['text']} {figure['age']}"
    return str(figure["text"])


def _twin(client: FlaskClient, url: str) -> dict[str, Any]:
    answer = client.get(url)
    assert answer.status_code == 200, answer.text
    assert answer.mimetype == "application/json"
    found: dict[str, Any] = answer.get_json()
    return found


def _same_as_the_page(client: FlaskClient, page_url: str, twin_url: str) -> dict[str, Any]:
    """The page and its twin, read one after the other: the twin's URL and shape are the
    page's, and every figure is the text of the element marked with its key (no mark without
    a figure, no figure without a mark)."""
    page = _marks(client.get(page_url).text)
    twin = _twin(client, twin_url)
    assert page.status["data-live-src"] == twin_url
    assert page.status["data-live-shape"] == twin["shape"]
    assert "hidden" in page.status  # shown by the script alone
    figures = twin["figures"]
    assert set(page.marks) == set(figures)
    for key, mark in page.marks.items():
        assert mark["text"] == _said(figures[key]), key
        if isinstance(figures[key], dict) and "max" in figures[key]:
            assert (mark["attrs"]["value"], mark["attrs"]["max"]) == (
                str(figures[key]["value"]), str(figures[key]["max"]))
        if isinstance(figures[key], dict) and "class" in figures[key]:
            assert mark["attrs"]["class"] == figures[key]["class"], key
        if isinstance(figures[key], dict) and figures[key].get("href"):
            assert f'href="{figures[key]["href"]}"'.replace("&", "&amp;") in client.get(
                page_url).text
    return twin


def _fail(api: Api, producer: Key, worker: Key, error: str, job_type: str = "email") -> int:
    job_id = int(api.enqueue(producer, type=job_type, payload={},
                             max_retries=0).get_json()["id"])
    claimed = api.claim(worker, types=[job_type]).get_json()
    assert api.fail(worker, job_id, lease_token=claimed["lease_token"],
                    error=error).status_code == 200
    return job_id


@pytest.fixture
def app_config(app_config: dict[str, Any]) -> dict[str, Any]:
    # The counts read now, not from a snapshot up to 10 s old: a change is seen at once.
    return {**app_config, "TYPE_COUNTS_MAX_AGE_SECONDS": 0}


@pytest.fixture
def busy(api: Api, producer: Key, worker: Key, clock: ManualClock) -> dict[str, int]:
    """A failed job, a running one with progress, a pending one; ten seconds on."""
    failed = _fail(api, producer, worker, "SMTP 550: mailbox unavailable")
    running = int(api.enqueue(producer, type="pdf", payload={}).get_json()["id"])
    claimed = api.claim(worker, types=["pdf"]).get_json()
    assert api.heartbeat(worker, running, lease_token=claimed["lease_token"],
                         progress={"done": 42, "total": 120},
                         message="rendering page 42").status_code == 200
    pending = int(api.enqueue(producer, type="email", payload={}).get_json()["id"])
    clock.advance(10)
    return {"failed": failed, "running": running, "pending": pending,
            "lease": claimed["lease_token"]}


# -- the pages ------------------------------------------------------------------------------------

def test_the_live_pages_carry_the_script_and_the_others_none(
        signed_in: FlaskClient, busy: dict[str, int]) -> None:
    for page in ("/ui/", "/ui/?period=day", "/ui/types/email", f"/ui/jobs/{busy['failed']}",
                 "/ui/failures", "/ui/failures?type=email"):
        text = signed_in.get(page).text
        assert text.count(LIVE_SCRIPT) == 1, page
        assert '<p class="live" id="live"' in text, page
        assert "data-live=" in text, page
    for page in ("/ui/jobs", "/ui/types", "/ui/schedules", "/ui/workflows", "/ui/sign-in"):
        assert "<script" not in signed_in.get(page).text, page


def test_each_twin_answers_what_its_page_shows(
        signed_in: FlaskClient, busy: dict[str, int]) -> None:
    overview = _same_as_the_page(signed_in, "/ui/", "/ui/live/overview")
    figures = overview["figures"]
    assert figures["type/email/failed"] == {
        "text": "1", "href": "/ui/jobs?type=email&status=failed"}
    assert figures["type/email/waiting"] == {"text": "0", "href": None}
    assert (figures["type/email/pending"], figures["type/pdf/running"]) == ("1", "1")
    assert figures["type/email/oldest"] == "10 s"
    assert figures["type/pdf/last_claim"]["age"] == "(10 s ago)"
    assert figures["type/sync/last_claim"] is None
    # The period does not change the figures: the twin is the same.
    _same_as_the_page(signed_in, "/ui/?period=day&refresh=on", "/ui/live/overview")

    typed = _same_as_the_page(signed_in, "/ui/types/email", "/ui/live/types/email")
    assert typed["figures"]["jobs"] == {"text": "1 pending · 1 failed",
                                        "href": "/ui/jobs?type=email"}

    running = _same_as_the_page(signed_in, f"/ui/jobs/{busy['running']}",
                                f"/ui/live/jobs/{busy['running']}")["figures"]
    assert running["status"] == {"text": "running", "class": "status-running"}
    assert running["progress"] == {"value": 42, "max": 120, "text": "35 %"}
    assert running["progress_count"] == "42 / 120"
    assert running["progress_message"] == "rendering page 42"
    failed = _same_as_the_page(signed_in, f"/ui/jobs/{busy['failed']}",
                               f"/ui/live/jobs/{busy['failed']}")["figures"]
    assert failed["retries"] == "0 of 0" and "progress" not in failed

    failures = _same_as_the_page(signed_in, "/ui/failures", "/ui/live/failures")["figures"]
    [count] = [figure for key, figure in failures.items() if key.endswith("/count")]
    assert count == "1"
    _same_as_the_page(signed_in, "/ui/failures?type=pdf", "/ui/live/failures?type=pdf")


def test_a_circuit_s_state_is_a_figure_of_its_type_s_page(
        signed_in: FlaskClient, admin: Key) -> None:
    changed = signed_in.patch("/types/email", headers=admin.headers, json={"circuit": {
        "failure_ratio": 0.5, "min_attempts": 5, "window_seconds": 60,
        "cooldown_seconds": 30}})
    assert changed.status_code == 200, changed.get_json()
    figures = _same_as_the_page(signed_in, "/ui/types/email", "/ui/live/types/email")["figures"]
    assert figures["circuit_state"] == {"text": "closed", "class": "circuit-closed"}
    # Opened by hand: the overview's state says it, a link to the type's page.
    assert signed_in.patch("/types/email", headers=admin.headers,
                           json={"circuit_state": "open"}).status_code == 200
    overview = _same_as_the_page(signed_in, "/ui/", "/ui/live/overview")["figures"]
    assert overview["type/email/state"] == {"text": "circuit open", "class": "paused",
                                            "href": "/ui/types/email"}
    assert overview["type/pdf/state"] == {"text": "active", "class": "", "href": None}


# -- what changes ---------------------------------------------------------------------------------

def test_the_twins_follow_a_job_through_claim_and_complete(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key) -> None:
    job_id = int(api.enqueue(producer, type="pdf", payload={}).get_json()["id"])
    overview = _twin(signed_in, "/ui/live/overview")
    job_page = _marks(signed_in.get(f"/ui/jobs/{job_id}").text).status["data-live-shape"]
    assert overview["figures"]["type/pdf/pending"] == "1"

    claimed = api.claim(worker, types=["pdf"]).get_json()
    after_claim = _twin(signed_in, "/ui/live/overview")
    assert (after_claim["figures"]["type/pdf/pending"],
            after_claim["figures"]["type/pdf/running"]) == ("0", "1")
    assert after_claim["figures"]["type/pdf/last_claim"] is not None

    assert api.complete(worker, job_id, lease_token=claimed["lease_token"],
                        result={"ok": True}).status_code == 200
    done = _twin(signed_in, "/ui/live/overview")
    assert (done["figures"]["type/pdf/running"], done["figures"]["type/pdf/completed"]) == (
        "0", "1")
    # Counts moved in place: the page's shape (its rows) is the same.
    assert done["shape"] == overview["shape"]
    # The job's page: its status follows, and the page it was is no longer its shape (other
    # buttons, a result): the script offers the reload.
    twin = _twin(signed_in, f"/ui/live/jobs/{job_id}")
    assert twin["figures"]["status"] == {"text": "completed", "class": "status-completed"}
    assert twin["shape"] != job_page


def test_a_new_failure_group_changes_the_failures_page_s_shape_a_count_does_not(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key) -> None:
    _fail(api, producer, worker, "TimeoutError: timed out after 30 ms")
    before = _twin(signed_in, "/ui/live/failures")
    _fail(api, producer, worker, "TimeoutError: timed out after 31 ms")
    again = _twin(signed_in, "/ui/live/failures")
    assert again["shape"] == before["shape"]
    [(key, count)] = [(key, f) for key, f in again["figures"].items() if key.endswith("/count")]
    assert count == "2" and before["figures"][key] == "1"
    assert "31 ms" in again["figures"][key.replace("/count", "/sample")]
    _fail(api, producer, worker, "KeyError: 'address'")
    assert _twin(signed_in, "/ui/live/failures")["shape"] != before["shape"]
    # Another type's group is not on a page filtered to email.
    email = _twin(signed_in, "/ui/live/failures?type=email")
    _fail(api, producer, worker, "boom", job_type="pdf")
    assert _twin(signed_in, "/ui/live/failures?type=email")["shape"] == email["shape"]


# -- who may ask ----------------------------------------------------------------------------------

TWINS = ("/ui/live/overview", "/ui/live/types/email", "/ui/live/jobs/1", "/ui/live/failures")


@pytest.mark.parametrize("twin", TWINS)
def test_without_a_session_a_twin_answers_401_never_the_sign_in_page(
        client: FlaskClient, admin: Key, twin: str) -> None:
    answer = client.get(twin)
    assert answer.status_code == 401 and answer.mimetype == "application/json"
    assert answer.get_json()["sign_in"] == "/ui/sign-in"
    # An API key is no session: the twins read the dashboard's cookie alone.
    assert client.get(twin, headers=admin.headers).status_code == 401


@pytest.mark.parametrize("role", ["producer", "worker"])
def test_a_non_admin_key_gets_no_session_so_no_figures(client: FlaskClient, make_key: Any,
                                                       role: str) -> None:
    key = make_key(f"{role}-x", role)
    assert sign_in(client, key).status_code == 403
    for twin in TWINS:
        assert client.get(twin).status_code == 401, twin


def test_a_revoked_keys_session_gets_401_from_the_twins(app: Flask,
                                                        signed_in: FlaskClient) -> None:
    assert signed_in.get("/ui/live/overview").status_code == 200
    app.extensions["queuelog"].keys.revoke_key("admin-1")
    assert signed_in.get("/ui/live/overview").status_code == 401
    # The session is over for the pages too.
    assert signed_in.get("/ui/").headers["Location"] == "/ui/sign-in"


def test_a_signed_out_session_gets_401_from_the_twins(signed_in: FlaskClient) -> None:
    page = signed_in.get("/ui/").text
    token = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert token is not None
    signed_in.post("/ui/sign-out", data={"csrf_token": token.group(1)})
    assert signed_in.get("/ui/live/failures").status_code == 401


# -- refusals and headers -------------------------------------------------------------------------

@pytest.mark.parametrize("twin,status", [
    ("/ui/live/jobs/4242", 404), ("/ui/live/types/nosuchtype", 404),
    ("/ui/live/failures?type=" + "x" * 101, 400), ("/ui/live/failures?other=1", 400),
    ("/ui/live/failures?type=%00", 400),
])
def test_a_twin_refuses_in_json(signed_in: FlaskClient, twin: str, status: int) -> None:
    answer = signed_in.get(twin)
    assert answer.status_code == status and answer.mimetype == "application/json"
    assert answer.get_json()["title"]


def test_a_twin_answers_only_get(signed_in: FlaskClient) -> None:
    assert signed_in.post("/ui/live/overview").status_code in (400, 405)


@pytest.mark.parametrize("path", [*TWINS[:2], "/ui/static/live.js"])
def test_the_twins_and_the_script_carry_the_dashboard_s_headers(signed_in: FlaskClient,
                                                                path: str) -> None:
    answer = signed_in.get(path)
    assert answer.status_code == 200
    assert answer.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert answer.headers["Cache-Control"] == "no-store"
    assert answer.headers["X-Content-Type-Options"] == "nosniff"


def test_the_script_is_served_as_javascript_and_writes_no_html() -> None:
    source = SCRIPT.read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(",
                 "Function(", "setTimeout(\"", "setInterval(\""):
        assert sink not in source, sink


def test_the_script_is_a_static_file_anyone_may_fetch(client: FlaskClient) -> None:
    answer = client.get("/ui/static/live.js")
    assert answer.status_code == 200
    assert answer.mimetype in ("text/javascript", "application/javascript")


# -- cost -----------------------------------------------------------------------------------------

def _statements(app: Flask, client: FlaskClient, url: str) -> list[str]:
    seen: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    engine = app.extensions["queuelog"].db.engine
    event.listen(engine, "before_cursor_execute", count)
    try:
        assert client.get(url).status_code == 200
    finally:
        event.remove(engine, "before_cursor_execute", count)
    return seen


@pytest.mark.parametrize("page,twin", [
    ("/ui/", "/ui/live/overview"), ("/ui/types/email", "/ui/live/types/email"),
    ("/ui/jobs/{failed}", "/ui/live/jobs/{failed}"), ("/ui/failures", "/ui/live/failures")])
def test_a_twin_reads_less_than_its_page(app: Flask, signed_in: FlaskClient,
                                         busy: dict[str, int], page: str, twin: str) -> None:
    read_by_page = _statements(app, signed_in, page.format(**busy))
    read_by_twin = _statements(app, signed_in, twin.format(**busy))
    assert len(read_by_twin) < len(read_by_page), (read_by_twin, read_by_page)
    # A poll writes nothing: not the session (its expiry is fixed at sign-in), nor anything.
    assert not [statement for statement in read_by_twin
                if statement.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE"))]


def test_the_failures_twin_reads_as_much_for_one_group_as_for_many(
        app: Flask, signed_in: FlaskClient, api: Api, producer: Key, worker: Key) -> None:
    _fail(api, producer, worker, "first problem")
    one = _statements(app, signed_in, "/ui/live/failures")
    for problem in ("second", "third", "fourth"):
        _fail(api, producer, worker, f"{problem} problem()")
    # Each group's count, failed ever and sample.
    assert len(_twin(signed_in, "/ui/live/failures")["figures"]) == 4 * 3
    assert len(_statements(app, signed_in, "/ui/live/failures")) == len(one)


def test_a_twin_s_answer_holds_figures_and_no_payload(signed_in: FlaskClient, api: Api,
                                                      producer: Key) -> None:
    job_id = api.enqueue(producer, payload={"secret": "s3cr3t-value"}).get_json()["id"]
    answer = signed_in.get(f"/ui/live/jobs/{job_id}")
    assert "s3cr3t-value" not in answer.text
    assert set(json.loads(answer.text)) == {"shape", "figures", "read_at"}
