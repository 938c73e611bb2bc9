"""GET /jobs and GET /jobs/{id}: filters, cursor pagination, 404s."""

from __future__ import annotations

import pytest


def test_list_pages_through_every_job_in_id_order_with_a_cursor(api, producer):
    ids = [api.enqueue(producer).json["id"] for _ in range(7)]
    seen, cursor = [], None
    while True:
        query = {"limit": 3} | ({"cursor": cursor} if cursor else {})
        page = api.list(producer, **query).json
        seen += [job["id"] for job in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids


def test_list_last_page_has_no_cursor(api, producer):
    for _ in range(2):
        api.enqueue(producer)
    assert api.list(producer, limit=2).json["next_cursor"] is None


def test_list_filters_by_status_and_type(api, producer, worker, admin):
    email = api.enqueue(producer, type="email").json["id"]
    pdf = api.enqueue(producer, type="pdf").json["id"]
    api.claim(worker, types=["pdf"])
    assert [j["id"] for j in api.list(admin, status="pending").json["jobs"]] == [email]
    assert [j["id"] for j in api.list(admin, status="running").json["jobs"]] == [pdf]
    assert [j["id"] for j in api.list(admin, type="email").json["jobs"]] == [email]
    assert api.list(admin, type="pdf", status="pending").json["jobs"] == []


@pytest.mark.parametrize("query", [
    {"limit": 0}, {"limit": 501}, {"limit": "ten"}, {"limit": "1.5"},
    {"status": "stuck"}, {"cursor": "not-a-cursor"}, {"cursor": "djI6MQ"},
    {"unknown": "1"}, {"type": ""},
])
def test_list_refuses_bad_filters_limits_and_cursors_with_422(api, producer, query):
    response = api.list(producer, **query)
    assert response.status_code == 422
    assert response.content_type == "application/problem+json"
    assert set(response.json["errors"]) == set(query)


def test_list_refuses_a_parameter_given_twice(client, producer):
    response = client.get("/jobs?limit=1&limit=2", headers=producer.headers)
    assert response.status_code == 422


def test_list_default_limit_is_50(api, admin):
    for _ in range(51):
        api.enqueue(admin)
    page = api.list(admin).json
    assert len(page["jobs"]) == 50 and page["next_cursor"] is not None


@pytest.mark.parametrize("path", ["/jobs/999", "/jobs/abc", "/jobs/1.5", "/jobs/-1",
                                  "/jobs/99999999999999999999999", f"/jobs/{2**63}"])
def test_unknown_or_non_integer_ids_answer_404_problems(client, producer, path):
    response = client.get(path, headers=producer.headers)
    assert response.status_code == 404
    assert response.content_type == "application/problem+json"


@pytest.mark.parametrize("action", ["complete", "fail", "heartbeat"])
def test_worker_routes_on_unknown_or_huge_ids_answer_404(client, worker, action):
    for job_id in (12345, 2**63, 10**30):
        body = {"error": "x"} if action == "fail" else {}
        response = client.post(f"/jobs/{job_id}/{action}", json=body, headers=worker.headers)
        assert response.status_code == 404, job_id
