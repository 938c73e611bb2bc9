"""The dashboard's workflow pages (contract §15 with §14's rules): the list with its status
filter and pages, a workflow's drawing with one linked box per job and an arrow per
dependency, its table, its Cancel button behind CSRF, a job's page with what it waits for
and its workflow, and the waiting status wherever statuses are listed."""

from __future__ import annotations

import html
import re
from typing import Any

from flask.testing import FlaskClient
from markupsafe import escape

from app.ui.graph_drawing import MAX_DRAWN_JOBS
from tests.conftest import Api, Key
from tests.ui.conftest import post_form, sign_in, without_live_script

HOSTILE = "<script>alert('name')</script>"
ORDER: list[dict[str, Any]] = [
    {"ref": "charge", "type": "email", "payload": {"order": 1001}},
    {"ref": "mail", "type": "email", "depends_on": ["charge"]},
    {"ref": "ship", "type": "pdf", "depends_on": ["charge"]},
    {"ref": "done", "type": "sync", "depends_on": ["mail", "ship"],
     "on_dependency_failure": "run"},
]


def _create(client: FlaskClient, key: Key, jobs: list[dict[str, Any]],
            name: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"jobs": jobs} | ({"name": name} if name is not None else {})
    answer = client.post("/workflows", json=body, headers=key.headers)
    assert answer.status_code == 201, answer.text
    created: dict[str, Any] = answer.get_json()
    return created


def _drawing(page: str) -> str:
    match = re.search(r'<svg class="graph".*?</svg>', page, re.DOTALL)
    assert match is not None, "the page has no drawing"
    return match.group(0)


def _linked_boxes(svg: str) -> list[int]:
    return [int(found) for found in re.findall(r'<a href="/ui/jobs/(\d+)" class="node ', svg)]


def _listed(page: str) -> list[int]:
    return [int(found) for found in
            re.findall(r'<th scope="row"><a href="/ui/workflows/(\d+)">', page)]


def test_the_navigation_leads_to_the_workflows(signed_in: FlaskClient) -> None:
    assert '<a href="/ui/workflows">Workflows</a>' in signed_in.get("/ui/").text
    page = signed_in.get("/ui/workflows").text
    assert '<a href="/ui/workflows" aria-current="page">Workflows</a>' in page
    assert "No workflows." in page


def test_the_list_shows_each_workflow_with_its_status_and_counts(
        signed_in: FlaskClient, client: FlaskClient, producer: Key, admin: Key) -> None:
    first = _create(client, producer, ORDER, name="order-1001")
    second = _create(client, producer, [{"ref": "only", "type": "pdf"}])
    client.post(f"/workflows/{second['id']}/cancel", headers=admin.headers, json={})
    page = signed_in.get("/ui/workflows").text
    assert _listed(page) == [first["id"], second["id"]]
    row = page[page.index(f'/ui/workflows/{first["id"]}"'):]
    row = row[:row.index("</tr>")]
    assert "order-1001" in row and ">running<" in row
    assert "3 waiting · 1 pending" in row and " UTC</time>" in row
    assert "—" in page[page.index(f'/ui/workflows/{second["id"]}"'):]  # no name


def test_the_list_is_filtered_by_status_and_paginated(
        signed_in: FlaskClient, client: FlaskClient, producer: Key, admin: Key) -> None:
    ids = [_create(client, producer, [{"ref": "a", "type": "email"}])["id"] for _ in range(52)]
    for cancelled in ids[:2]:
        client.post(f"/workflows/{cancelled}/cancel", headers=admin.headers, json={})
    assert _listed(signed_in.get("/ui/workflows?status=cancelled").text) == ids[:2]
    first = signed_in.get("/ui/workflows?status=running").text
    assert _listed(first) == ids[2:52]
    assert 'rel="next"' not in first
    everything = signed_in.get("/ui/workflows").text
    assert _listed(everything) == ids[:50] and "First page" not in everything
    next_link = re.search(r'href="([^"]+)" rel="next"', everything)
    assert next_link is not None
    following = html.unescape(next_link.group(1))
    second = signed_in.get(following).text
    assert _listed(second) == ids[50:] and "First page" in second
    assert 'rel="next"' not in second


def test_a_filter_or_cursor_the_list_cannot_use_is_an_error_page(
        signed_in: FlaskClient) -> None:
    answer = signed_in.get("/ui/workflows?status=waiting")  # a job's status, no workflow's
    assert answer.status_code == 400 and "status: Must be one of" in answer.text
    assert signed_in.get("/ui/workflows?cursor=not-ours").status_code == 422


def test_a_workflows_page_draws_one_linked_box_per_job_and_an_arrow_per_dependency(
        signed_in: FlaskClient, client: FlaskClient, producer: Key) -> None:
    created = _create(client, producer, ORDER, name="order-1001")
    ids = created["jobs"]
    page = signed_in.get(f"/ui/workflows/{created['id']}").text
    assert "Workflow" in page and "order-1001" in page and "3 waiting · 1 pending" in page
    svg = _drawing(page)
    assert sorted(_linked_boxes(svg)) == sorted(ids.values())
    arrows = set(re.findall(r'data-from="(\d+)" data-to="(\d+)"', svg))
    assert arrows == {(str(ids[a]), str(ids[b])) for a, b in (
        ("charge", "mail"), ("charge", "ship"), ("mail", "done"), ("ship", "done"))}
    assert svg.count('marker-end="url(#arrowhead)"') == 4
    box = svg[svg.index(f'<a href="/ui/jobs/{ids["charge"]}"'):]
    box = box[:box.index("</a>")]
    assert 'class="node status-pending"' in box and ">charge</text>" in box
    assert "pending · #" in box
    # No style attribute anywhere (the CSP allows none): colours are the status classes'.
    assert "style=" not in page
    # The table: every job with its ref, linked id, type, status and dependencies by ref.
    table = page[page.index('<table id="workflow-jobs">'):]
    done_row = table[table.index('<th scope="row">done</th>'):]
    done_row = done_row[:done_row.index("</tr>")]
    assert f'<a href="/ui/jobs/{ids["done"]}">{ids["done"]}</a>' in done_row
    assert (f'<a href="/ui/jobs/{ids["mail"]}">mail</a>, '
            f'<a href="/ui/jobs/{ids["ship"]}">ship</a>') in done_row
    assert "<td>sync</td>" in done_row and ">waiting</span>" in done_row


def test_a_producers_name_is_shown_as_text_on_the_pages(
        signed_in: FlaskClient, client: FlaskClient, producer: Key) -> None:
    created = _create(client, producer, ORDER, name=HOSTILE)
    for path in (f"/ui/workflows/{created['id']}", "/ui/workflows"):
        page = signed_in.get(path).text
        assert "<script" not in without_live_script(page), path
        assert str(escape(HOSTILE)) in page, path


def test_a_workflow_past_the_cap_is_listed_but_not_drawn(
        signed_in: FlaskClient, client: FlaskClient, producer: Key) -> None:
    jobs = [{"ref": f"step-{n}", "type": "email"} for n in range(MAX_DRAWN_JOBS + 1)]
    created = _create(client, producer, jobs)
    page = signed_in.get(f"/ui/workflows/{created['id']}").text
    assert '<svg class="graph"' not in page
    assert f"Not drawn: {MAX_DRAWN_JOBS + 1} jobs" in page
    assert page.count('<th scope="row">step-') == MAX_DRAWN_JOBS + 1


def test_cancel_cancels_the_waiting_and_pending_jobs_and_needs_the_csrf_token(
        signed_in: FlaskClient, client: FlaskClient, api: Api, producer: Key, worker: Key,
        admin: Key) -> None:
    created = _create(client, producer, ORDER)
    ids = created["jobs"]
    assert api.claim(worker).get_json()["id"] == ids["charge"]
    page, action = f"/ui/workflows/{created['id']}", f"/ui/workflows/{created['id']}/cancel"
    assert signed_in.post(action, data={}).status_code == 400
    assert signed_in.post(action, data={"csrf_token": "forged"}).status_code == 400
    assert api.get(admin, ids["mail"]).get_json()["status"] == "waiting"
    answer = post_form(signed_in, page, action)
    assert answer.status_code == 302 and answer.headers["Location"] == page
    statuses = {ref: api.get(admin, job_id).get_json()["status"] for ref, job_id in ids.items()}
    assert statuses == {"charge": "running", "mail": "cancelled", "ship": "cancelled",
                        "done": "cancelled"}
    shown = signed_in.get(page).text
    assert "Cancelled its waiting and pending jobs." in shown
    # Nothing left to cancel: no button (the running job finishes).
    assert f'action="{action}"' not in shown
    # The job's timeline says who cancelled it, and as part of which workflow.
    events = signed_in.get(f"/ui/jobs/{ids['mail']}").text
    events = events[events.index('<table id="events">'):]
    assert "<td>admin-1</td>" in events
    assert f"&#34;workflow&#34;: {created['id']}" in events


def test_an_unknown_workflow_is_the_dashboards_404_page(signed_in: FlaskClient) -> None:
    answer = signed_in.get("/ui/workflows/999")
    assert answer.status_code == 404 and "No such workflow." in answer.text
    answer = post_form(signed_in, "/ui/workflows", "/ui/workflows/999/cancel")
    assert answer.status_code == 302
    assert "No such workflow." in signed_in.get("/ui/workflows").text


def test_only_a_signed_in_admin_sees_or_cancels_a_workflow(
        client: FlaskClient, api: Api, producer: Key, admin: Key) -> None:
    created = _create(client, producer, ORDER)
    page = f"/ui/workflows/{created['id']}"
    for path in ("/ui/workflows", page):
        answer = client.get(path, headers=producer.headers)  # a bearer key is no session
        assert answer.status_code == 302 and answer.headers["Location"] == "/ui/sign-in"
    assert sign_in(client, producer).status_code == 403
    assert client.get(page).status_code == 302
    # Without a session there is no CSRF token to send: the post is refused before all else.
    assert client.post(f"{page}/cancel", data={"csrf_token": "x"}).status_code == 400
    assert api.get(admin, created["jobs"]["mail"]).get_json()["status"] == "waiting"


def test_a_jobs_page_shows_what_it_waits_for_and_links_its_workflow(
        signed_in: FlaskClient, client: FlaskClient, api: Api, producer: Key) -> None:
    created = _create(client, producer, ORDER)
    ids = created["jobs"]
    page = signed_in.get(f"/ui/jobs/{ids['done']}").text
    assert (f'<a href="/ui/workflows/{created["id"]}">workflow {created["id"]}</a>') in page
    depends = page[page.index('<td id="depends-on">'):]
    depends = depends[:depends.index("</td>")]
    assert re.findall(r'href="/ui/jobs/(\d+)"', depends) == [str(ids["mail"]),
                                                             str(ids["ship"])]
    assert "2 unfinished of 2" in page and "run anyway" in page
    assert 'class="status-waiting">waiting<' in page
    assert "Cancel</button>" in page  # an admin may cancel a waiting job
    # A job of no workflow, depending on nothing.
    alone = api.enqueue(producer, type="email", payload={}).get_json()["id"]
    page = signed_in.get(f"/ui/jobs/{alone}").text
    assert "/ui/workflows/" not in page.replace('href="/ui/workflows"', "")
    assert '<td id="depends-on">—</td>' in page and "Waiting on" not in page


def test_waiting_is_offered_wherever_job_statuses_are(
        signed_in: FlaskClient, client: FlaskClient, producer: Key) -> None:
    ids = _create(client, producer, ORDER)["jobs"]
    jobs = signed_in.get("/ui/jobs").text
    assert '<option value="waiting">waiting</option>' in jobs
    waiting = signed_in.get("/ui/jobs?status=waiting").text
    assert sorted(int(n) for n in re.findall(r'<th scope="row"><a href="/ui/jobs/(\d+)"',
                                              waiting)) == sorted(
        ids[ref] for ref in ("mail", "ship", "done"))
    assert "Cancel every waiting, pending or suspended job" in waiting
    confirm = signed_in.get("/ui/jobs/cancel-many?status=waiting").text
    assert "<strong>waiting</strong>" in confirm
    overview = signed_in.get("/ui/").text
    assert '<th scope="col">Waiting</th>' in overview
    email = overview[overview.index('<a href="/ui/jobs?type=email">email</a>'):]
    email = email[:email.index("</tr>")]
    assert 'href="/ui/jobs?type=email&amp;status=waiting">1</a>' in email
