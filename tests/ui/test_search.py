"""Finding a job from the dashboard: the search box on every page (a job's id jumps to its
page, other text lists the jobs whose errors hold it) and the jobs list's error filter,
which matches the text against the failure groups and lists their jobs through the attempts'
fingerprint index; bad input a 4xx with a message; the plans of the new statements on both
engines."""

from __future__ import annotations

import re
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import event

from app.core.clock import ManualClock
from app.jobs.sql.repository import JobRepository
from app.jobs.timeline.failure_repository import FailureRepository
from app.storage.engine import Database, make_engine
from tests.conftest import Api, Key

TIMEOUT = "TimeoutError: read timed out after {ms} ms"
REFUSED = "ConnectionRefusedError: connection refused by mail.example.com:25"


def _fail(api: Api, producer: Key, worker: Key, error: str, *, job_type: str = "email",
          **enqueued: Any) -> int:
    job_id = int(api.enqueue(producer, type=job_type, payload={}, max_retries=0,
                             **enqueued).get_json()["id"])
    claimed = api.claim(worker, types=[job_type]).get_json()
    assert claimed["id"] == job_id
    assert api.fail(worker, job_id, lease_token=claimed["lease_token"],
                    error=error).status_code == 200
    return job_id


def _listed(page: str) -> list[int]:
    """The ids the jobs list shows, in order."""
    return [int(job_id) for job_id in re.findall(r'<th scope="row"><a href="/ui/jobs/(\d+)">',
                                                 page)]


def _fingerprint(client: FlaskClient, admin: Key, job_type: str, word: str) -> str:
    groups = client.get("/failures", headers=admin.headers).get_json()["groups"]
    [found] = [group["fingerprint"] for group in groups
               if group["type"] == job_type and word in group["sample"]]
    return str(found)


# -- the search box ----------------------------------------------------------------------------

@pytest.mark.parametrize("page", ["/ui/", "/ui/jobs", "/ui/failures", "/ui/types",
                                  "/ui/nosuchpage"])
def test_every_page_has_the_search_box_in_its_header(signed_in: FlaskClient, page: str) -> None:
    text = signed_in.get(page).text
    header = text[text.index("<header>"):text.index("</header>")]
    assert '<form class="search" role="search" method="get" action="/ui/search">' in header
    assert '<input type="search" id="search-q" name="q"' in header


@pytest.mark.parametrize("typed", ["{id}", "#{id}", "  {id} ", "00{id}"])
def test_a_job_s_id_jumps_to_its_page(signed_in: FlaskClient, api: Api, producer: Key,
                                      typed: str) -> None:
    job_id = api.enqueue(producer, payload={}).get_json()["id"]
    answer = signed_in.get("/ui/search", query_string={"q": typed.format(id=job_id)})
    assert answer.status_code == 302 and answer.headers["Location"] == f"/ui/jobs/{job_id}"


@pytest.mark.parametrize("number", ["4242", "9223372036854775808", "1" * 150, "0"])
def test_an_id_no_job_has_says_so_with_a_404(signed_in: FlaskClient, number: str) -> None:
    answer = signed_in.get("/ui/search", query_string={"q": number})
    assert answer.status_code == 404
    assert f"No job {int(number)}" in answer.text
    assert 'id="search-q"' in answer.text  # the box, to try again


def test_other_text_lists_the_jobs_whose_errors_hold_it_and_nothing_lists_every_job(
        signed_in: FlaskClient) -> None:
    answer = signed_in.get("/ui/search", query_string={"q": " timed out "})
    assert answer.status_code == 302
    assert answer.headers["Location"] == "/ui/jobs?error=timed+out"
    for nothing in ({}, {"q": ""}, {"q": "   "}):
        answer = signed_in.get("/ui/search", query_string=nothing)
        assert answer.status_code == 302 and answer.headers["Location"] == "/ui/jobs"


@pytest.mark.parametrize("query,said", [
    ({"q": "x" * 201}, "Length must be between 1 and 200."),
    ({"q": "time\x00out"}, "Must not contain control characters."),
    ({"q": "line\nbreak"}, "Must not contain control characters."),
    ({"q": "bell\x07"}, "Must not contain control characters."),
    ({"q": "1", "other": "2"}, "Unknown field."),
])
def test_search_text_it_cannot_use_is_a_400_saying_why(signed_in: FlaskClient,
                                                       query: dict[str, str], said: str) -> None:
    answer = signed_in.get("/ui/search", query_string=query)
    assert answer.status_code == 400
    assert said in answer.text


def test_the_search_needs_a_session(client: FlaskClient) -> None:
    answer = client.get("/ui/search?q=1")
    assert answer.status_code == 302 and answer.headers["Location"] == "/ui/sign-in"


# -- the error filter ---------------------------------------------------------------------------

def test_the_error_filter_lists_the_jobs_of_the_groups_whose_error_holds_the_text(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key) -> None:
    timeouts = [_fail(api, producer, worker, TIMEOUT.format(ms=ms)) for ms in (30012, 29876)]
    refused = _fail(api, producer, worker, REFUSED)
    pdf_timeout = _fail(api, producer, worker, TIMEOUT.format(ms=500), job_type="pdf")
    api.enqueue(producer, payload={})  # never failed

    page = signed_in.get("/ui/jobs?error=TIMED+OUT").text
    assert _listed(page) == [pdf_timeout, *reversed(timeouts)]  # newest first
    said = re.search(r'<p class="error-match" id="error-match">(.*?)</p>', page, re.DOTALL)
    assert said is not None
    assert "Error text “TIMED OUT”: 2 failure groups match" in said.group(1)
    assert 'value="TIMED OUT"' in page  # the form shows the filter
    assert "(filtered)" in page
    # With the type filter, that type's groups only.
    page = signed_in.get("/ui/jobs?error=timed+out&type=email").text
    assert _listed(page) == list(reversed(timeouts))
    assert "1 failure group matches" in page
    assert _listed(signed_in.get("/ui/jobs?error=mail.example").text) == [refused]


def test_the_error_filter_composes_with_status_order_and_paging(
        app: Flask, signed_in: FlaskClient, api: Api, producer: Key, worker: Key,
        admin: Key, monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = [_fail(api, producer, worker, TIMEOUT.format(ms=ms), tags=["vip"] if ms % 2 else [])
            for ms in range(100, 105)]
    assert api.retry(admin, jobs[0]).status_code == 200  # pending again, its attempt stays
    page = signed_in.get("/ui/jobs?error=timed+out&status=failed&order=oldest").text
    assert _listed(page) == jobs[1:]
    assert _listed(signed_in.get("/ui/jobs?error=timed+out&status=pending").text) == [jobs[0]]
    assert _listed(signed_in.get("/ui/jobs?error=timed+out&tag=vip").text) == [
        jobs[3], jobs[1]]
    # Every filter is kept in the paging links.
    monkeypatch.setattr("app.ui.routes.JOBS_PER_PAGE", 2)
    first = signed_in.get("/ui/jobs?error=timed+out&order=oldest").text
    assert _listed(first) == jobs[:2]
    following = re.search(r'<a href="([^"]+)" rel="next">', first)
    assert following is not None
    link = following.group(1).replace("&amp;", "&")
    assert "error=timed+out" in link and "order=oldest" in link
    second = signed_in.get(link).text
    assert _listed(second) == jobs[2:4]
    back = re.search(r'<a href="([^"]+)" rel="prev">', second)
    assert back is not None and "error=timed+out" in back.group(1)
    assert _listed(signed_in.get(back.group(1).replace("&amp;", "&")).text) == jobs[:2]
    # No bulk action takes an error text: none is offered.
    assert "Retry every failed" not in second and "an error text" in second


def test_a_fingerprint_names_its_group_and_the_failures_page_links_to_its_jobs(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key, admin: Key) -> None:
    timeout = _fail(api, producer, worker, TIMEOUT.format(ms=1))
    _fail(api, producer, worker, REFUSED)
    fingerprint = _fingerprint(signed_in, admin, "email", "Timeout")
    link = f'href="/ui/jobs?type=email&amp;error={fingerprint}">All its jobs</a>'
    page = signed_in.get("/ui/failures").text
    assert link in page
    # Beside the group's retry, not among its newest jobs (a cell of job ids alone).
    newest = re.findall(r'<td class="newest-jobs">(.*?)</td>', page, re.DOTALL)
    assert newest and not any("All its jobs" in cell for cell in newest)
    page = signed_in.get(f"/ui/jobs?type=email&error={fingerprint}").text
    assert _listed(page) == [timeout] and "1 failure group matches" in page


def test_a_type_matched_with_only_some_fingerprints_lists_only_its_jobs_in_them(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key, admin: Key) -> None:
    # One fingerprint in two types ("lost <str>"), its text matching in pdf only: email's
    # job with that fingerprint is in a group that did not match.
    email_needle = _fail(api, producer, worker, "needle snapped")
    _fail(api, producer, worker, "lost 'thread'")
    pdf_needle = _fail(api, producer, worker, "lost 'needle'", job_type="pdf")
    assert (_fingerprint(signed_in, admin, "email", "thread")
            == _fingerprint(signed_in, admin, "pdf", "needle"))
    page = signed_in.get("/ui/jobs?error=needle").text
    assert "2 failure groups match" in page
    assert _listed(page) == [pdf_needle, email_needle]


def test_text_no_group_holds_lists_no_job_and_says_so(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key) -> None:
    _fail(api, producer, worker, REFUSED)
    # LIKE's own characters are text to find, not patterns.
    for text in ("no such error", "%", "_", "refused%by"):
        page = signed_in.get("/ui/jobs", query_string={"error": text}).text
        assert _listed(page) == [], text
        assert "no failure group's error holds it" in page, text
    page = signed_in.get("/ui/jobs", query_string={"error": "mail", "type": "pdf"}).text
    assert "no failure group's error holds it in type pdf" in page


@pytest.mark.parametrize("error,said", [
    ("x" * 201, "error: Length must be between 1 and 200."),
    ("tab\there", "error: Must not contain control characters."),
    ("\x9b31m", "error: Must not contain control characters."),
])
def test_an_error_text_it_cannot_use_is_a_400_with_the_form(signed_in: FlaskClient,
                                                            error: str, said: str) -> None:
    answer = signed_in.get("/ui/jobs", query_string={"error": error})
    assert answer.status_code == 400 and said in answer.text


def test_many_matching_groups_are_capped_and_the_page_says_so(
        signed_in: FlaskClient, api: Api, producer: Key, worker: Key, clock: ManualClock,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("app.ui.search.MATCHED_GROUPS_MAX", 2)
    jobs = []
    for name in ("alpha", "beta", "gamma"):
        jobs.append(_fail(api, producer, worker, f"broken {name}()"))
        clock.advance(1)
    page = signed_in.get("/ui/jobs?error=broken").text
    assert "2 failure groups match" in page and "More groups match" in page
    assert _listed(page) == [jobs[2], jobs[1]]  # the two seen most recently


def test_the_error_filter_never_searches_the_jobs_or_the_attempts_for_the_text(
        app: Flask, signed_in: FlaskClient, api: Api, producer: Key, worker: Key) -> None:
    _fail(api, producer, worker, REFUSED)
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    engine = app.extensions["queuelog"].db.engine
    event.listen(engine, "before_cursor_execute", seen)
    try:
        assert signed_in.get("/ui/jobs?error=refused").status_code == 200
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    searched = [statement for statement in statements if "LIKE" in statement.upper()]
    assert len(searched) == 1, statements
    assert "FROM failure_groups" in searched[0] and "job_attempts" not in searched[0]
    assert not re.search(r"\bjobs\b", searched[0].split("FROM", 1)[1])


# -- plans -----------------------------------------------------------------------------------

def _list_statement(conn: Any, **options: Any) -> tuple[str, Any]:
    """The statement (and parameters) JobRepository.list_jobs runs with these options."""
    statements: list[tuple[str, Any]] = []

    def seen(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        statements.append((statement, parameters))

    event.listen(conn, "before_cursor_execute", seen)
    try:
        JobRepository(conn).list_jobs(limit=51, **{"after_id": 0, **options})
    finally:
        event.remove(conn, "before_cursor_execute", seen)
    return statements[-1]


ONE_TYPE = [("email", "0000000000000007")]
# Two types, pdf matched with one of the two fingerprints: a branch per type.
TWO_TYPES = [("email", "0000000000000007"), ("email", "0000000000000008"),
             ("pdf", "0000000000000008")]
LISTINGS = [
    {"failure_groups": ONE_TYPE, "descending": True},
    {"failure_groups": ONE_TYPE, "descending": True, "after_id": 10_000},
    {"failure_groups": ONE_TYPE, "after_id": 10},
    {"failure_groups": ONE_TYPE, "status": "failed", "descending": True},
    {"failure_groups": ONE_TYPE, "status": "running", "descending": True},
    {"failure_groups": ONE_TYPE, "tag": "vip", "producer": "p", "descending": True},
    {"failure_groups": TWO_TYPES, "descending": True},
]


@pytest.mark.parametrize("options", LISTINGS)
def test_sqlite_error_filter_reads_the_groups_attempts_through_their_index(
        sqlite_template: str, options: dict[str, Any]) -> None:
    database = Database(make_engine(f"sqlite:///{sqlite_template}"))
    with database.read() as conn:
        statement, parameters = _list_statement(conn, **options)
        plan = [row[-1] for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement,
                                                        parameters).all()]
    database.engine.dispose()
    assert any("job_attempts USING" in step and "ix_job_attempts_fingerprint_ended_at"
               " (fingerprint=?" in step for step in plan), plan
    # Each job then by its id: never a walk over the jobs or the attempts.
    assert any(step.startswith("SEARCH jobs USING INTEGER PRIMARY KEY (rowid=?)")
               for step in plan), plan
    assert not any(step.startswith(("SCAN jobs", "SCAN job_attempts")) and "INDEX" not in step
                   for step in plan), plan


def test_sqlite_matching_groups_reads_the_groups_alone(sqlite_template: str) -> None:
    database = Database(make_engine(f"sqlite:///{sqlite_template}"))
    statements: list[tuple[str, Any]] = []
    with database.read() as conn:
        event.listen(conn, "before_cursor_execute",
                     lambda *args: statements.append((args[2], args[3])))
        FailureRepository(conn).matching("timed out", job_type=None, limit=51)
        statement, parameters = statements[-1]
        plan = [row[-1] for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement,
                                                        parameters).all()]
    database.engine.dispose()
    assert all("failure_groups" in step or "TEMP B-TREE" in step for step in plan), plan


def test_postgresql_error_filter_reads_the_groups_attempts_through_their_index(
        postgres_server: Any) -> None:
    """With 20,000 jobs and as many failed attempts in 2,000 groups, and their statistics,
    each listing reads the matched groups' attempts through the fingerprint index and each
    job by its id: no sequential scan of the jobs or the attempts."""
    engine = make_engine(postgres_server.create_database())
    plans = []
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO jobs (type, payload, priority, status, retry_count, max_retries,"
                " producer, run_at, created_at, updated_at)"
                " SELECT CASE WHEN mod(n, 2) = 0 THEN 'email' ELSE 'pdf' END, '{}', 10,"
                " CASE WHEN mod(n, 3) = 0 THEN 'failed' ELSE 'completed' END, 0, 3, 'p',"
                " n, n, n FROM generate_series(1, 20000) AS n")
            conn.exec_driver_sql(
                "INSERT INTO job_attempts (job_id, number, worker_id, claimed_at, ended_at,"
                " outcome, fingerprint) SELECT n, 1, 'w', n, n, 'failed',"
                " lpad(to_hex(mod(n, 2000)), 16, '0') FROM generate_series(1, 20000) AS n")
            conn.exec_driver_sql("ANALYZE jobs")
            conn.exec_driver_sql("ANALYZE job_attempts")
            for options in LISTINGS:
                statement, parameters = _list_statement(conn, **options)
                [(plan,)] = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement,
                                                 parameters).all()
                plans.append(plan[0]["Plan"])
    finally:
        engine.dispose()

    def nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
        return [node, *(child for sub in node.get("Plans", []) for child in nodes(sub))]

    for plan in plans:
        found = nodes(plan)
        kinds = [(node["Node Type"], node.get("Relation Name"), node.get("Index Name"))
                 for node in found]
        assert any(node.get("Index Name") == "ix_job_attempts_fingerprint_ended_at"
                   for node in found), kinds
        assert not any(node["Node Type"] == "Seq Scan"
                       and node.get("Relation Name") in ("jobs", "job_attempts")
                       for node in found), kinds
