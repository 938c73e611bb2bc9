"""POST /jobs/complete-many completes the items a lone complete would complete in its one
statement together, in one statement, and the others one by one
(app/jobs/usecases/bulk_complete.py): each item answered as a single complete answers it."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import event, text

from tests.conftest import Api


def claim_many(client: Any, key: Any, **body: Any) -> Any:
    return client.post("/jobs/claim-many", json=body, headers=key.headers)


def complete_many(client: Any, key: Any, items: list[dict[str, Any]]) -> Any:
    return client.post("/jobs/complete-many", json={"items": items}, headers=key.headers)


def _single(client: Any, key: Any, item: dict[str, Any]) -> Any:
    body = {name: value for name, value in item.items() if name != "id"}
    return client.post(f"/jobs/{item['id']}/complete", json=body, headers=key.headers)


def test_a_mixed_batch_is_answered_item_by_item_as_singles(client, api, producer, worker,
                                                           make_key, admin):
    other = make_key("worker-2", "worker")
    assert client.patch("/types/pdf", headers=admin.headers,
                        json={"ordering": "key"}).status_code == 200
    plain = [api.enqueue(producer).json["id"] for _ in range(3)]
    gate = api.enqueue(producer).json["id"]
    child = api.enqueue(producer, depends_on=[gate]).json["id"]
    keyed = api.enqueue(producer, type="pdf", concurrency_key="k").json["id"]
    behind = api.enqueue(producer, type="pdf", concurrency_key="k").json["id"]
    cancelled = api.enqueue(producer).json["id"]
    replayed = api.enqueue(producer).json["id"]
    held = {job["id"]: job["lease_token"]
            for job in claim_many(client, worker, max_jobs=20).json["jobs"]}
    assert set(held) == {*plain, gate, keyed, cancelled, replayed}
    theirs = api.enqueue(producer).json["id"]
    assert api.claim(other).json["id"] == theirs
    assert api.cancel(admin, cancelled).status_code in (200, 202)
    assert api.complete(worker, replayed, lease_token=held[replayed],
                        result={"r": 1}).status_code == 200

    def mine(job_id: int, **extra: Any) -> dict[str, Any]:
        return {"id": job_id, "lease_token": held[job_id], **extra}

    items = [mine(plain[2], result={"n": 2}), {"id": theirs, "lease_token": "not-theirs"},
             mine(plain[0]), mine(gate), {"id": 999_999, "lease_token": "x"}, mine(keyed),
             mine(cancelled), mine(plain[0]), mine(replayed, result={"r": 1}),
             mine(plain[1], result={"n": 1}), mine(plain[1], result={"n": -1})]
    response = complete_many(client, worker, items)

    assert response.status_code == 200
    results = response.json["results"]
    assert [(r["id"], r["status"]) for r in results] == [
        (plain[2], 200), (theirs, 409), (plain[0], 200), (gate, 200), (999_999, 404),
        (keyed, 200), (cancelled, 200), (plain[0], 200), (replayed, 200), (plain[1], 200),
        (plain[1], 409)]
    assert [r["job"]["status"] for r in results if r["status"] == 200] == [
        "completed", "completed", "completed", "completed", "cancelled", "completed",
        "completed", "completed"]
    assert results[0]["job"]["result"] == {"n": 2}
    # Each item sent again alone is a replay of what the batch did, or the same refusal.
    for item, result in zip(items, results, strict=True):
        single = _single(client, worker, item)
        assert single.status_code == result["status"], (item, single.json)
        if single.status_code == 200:
            assert single.json == result["job"], item
        else:
            assert {name: single.json[name] for name in ("type", "title", "detail")} == {
                name: result["problem"][name] for name in ("type", "title", "detail")}, item
    # What the ends entailed: the dependent released, the key's turn passed on.
    assert api.get(admin, child).json["status"] == "pending"
    assert api.get(admin, behind).json["status"] == "pending"
    assert api.get(other, theirs).json["status"] == "running"
    events = api.client.get(f"/jobs/{theirs}/events", headers=admin.headers).json["events"]
    assert "report_refused" in {e["event"] for e in events}


def test_a_batch_of_plain_jobs_is_completed_with_each_result(client, api, producer, worker):
    ids = [api.enqueue(producer).json["id"] for _ in range(5)]
    jobs = claim_many(client, worker, max_jobs=5).json["jobs"]
    items = [{"id": job["id"], "lease_token": job["lease_token"], "result": {"n": job["id"]}}
             for job in reversed(jobs)]
    response = complete_many(client, worker, items)
    results = response.json["results"]
    assert [r["id"] for r in results] == [item["id"] for item in items]
    assert all(r["status"] == 200 and r["job"]["status"] == "completed"
               and r["job"]["result"] == {"n": r["id"]} for r in results)
    assert sorted(ids) == sorted(r["id"] for r in results)


@pytest.mark.parametrize("engine_name", ["postgresql"], indirect=True)
def test_overlapping_batches_on_two_threads_never_deadlock(app, admin, worker, engine_name):
    """Two requests completing overlapping sets of the same jobs, in opposite orders: the
    one statement locks its jobs in id order, so neither waits for the other in a circle
    (PostgreSQL would break the circle by undoing one: counted here, it never happens)."""
    api = Api(app.test_client())
    engine = app.extensions["queuelog"].db.engine
    deadlocks: list[str] = []

    def seen_error(context: Any) -> None:
        if "deadlock" in str(context.original_exception).lower():
            deadlocks.append(str(context.original_exception))

    event.listen(engine, "handle_error", seen_error)
    try:
        for _round in range(5):
            ids = [api.enqueue(admin).json["id"] for _ in range(60)]
            jobs = claim_many(app.test_client(), worker, max_jobs=60).json["jobs"]
            items = sorted(({"id": job["id"], "lease_token": job["lease_token"]}
                            for job in jobs), key=lambda item: item["id"])
            assert [item["id"] for item in items] == ids
            batches = [items[:40], list(reversed(items[20:]))]
            answers: list[Any] = [None, None]
            start = threading.Barrier(2)

            def complete(at: int, start: threading.Barrier, answers: list[Any],
                         batch: list[dict[str, Any]]) -> None:
                client = app.test_client()
                start.wait()
                answers[at] = complete_many(client, worker, batch)

            threads = [threading.Thread(target=complete,
                                        args=(at, start, answers, batches[at]))
                       for at in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=120)
            for response in answers:
                assert response.status_code == 200, response.json
                assert {r["status"] for r in response.json["results"]} == {200}
            assert {api.get(admin, job_id).json["status"] for job_id in ids} == {"completed"}
    finally:
        event.remove(engine, "handle_error", seen_error)
    assert deadlocks == []


def test_postgresql_the_one_statement_looks_each_job_up_by_id_whatever_the_statistics(
        postgres_server):
    """200,000 of a worker's finished jobs purged and vacuumed, then 3,000 running ones:
    until the next ANALYZE the statistics count `jobs` nearly empty. Completing 100 of them
    reads those 100 by id, not every job the worker holds (a join to the items was planned
    as a read of all of them through ix_jobs_worker_id_id, where a worker's finished jobs
    stay too)."""
    import json

    from app.jobs.domain.transitions import Transition
    from app.jobs.sql.complete_many import _complete_held
    from app.storage.engine import make_engine

    engine = make_engine(postgres_server.create_database())
    insert = ("INSERT INTO jobs (type, payload, priority, status, retry_count, max_retries,"
              " producer, run_at, created_at, updated_at, worker_id, lease_expires_at) SELECT"
              " 'email', '{}', 10, :status, 0, 3, 'p', n, n, n, 'w', 10000000000"
              " FROM generate_series(1, :count) AS n")
    try:
        with engine.begin() as conn:
            conn.execute(text(insert), {"status": "completed", "count": 200_000})
            conn.exec_driver_sql("DELETE FROM jobs")
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
                "VACUUM ANALYZE jobs")
        with engine.connect() as conn:
            conn.execute(text(insert), {"status": "running", "count": 3000})
            conn.exec_driver_sql("UPDATE jobs SET lease_token = 't.' || id")
            ids = [row[0] for row in conn.exec_driver_sql(
                "SELECT id FROM jobs ORDER BY id LIMIT 100")]
            compiled = _complete_held("postgresql", True, False, False).compile(
                dialect=conn.dialect)
            values = Transition.COMPLETE.values(now_us=1, result=None)
            params = {**compiled.params, "ids": ids, "worker": "w", "now": 1,
                      "items": json.dumps([{"id": job_id, "lease_token": f"t.{job_id}",
                                            "result": None} for job_id in ids]),
                      **{f"new_{name}": value for name, value in values.items()
                         if name != "result"}}
            [(plan,)] = conn.exec_driver_sql(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + compiled.string, params).all()
            conn.rollback()
    finally:
        engine.dispose()

    def nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
        return [node, *(child for sub in node.get("Plans", []) for child in nodes(sub))]

    top = plan[0]["Plan"]
    assert top["Actual Rows"] == 100  # every item completed
    read = [node["Actual Rows"] * node["Actual Loops"] for node in nodes(top)
            if node.get("Relation Name") == "jobs" and "Scan" in node["Node Type"]]
    assert read and max(read) <= 100, read


def test_hostile_items_are_refused_whole_and_odd_results_stored_as_sent(client, api, producer,
                                                                         worker):
    """What the one statement is handed comes from the request: a body the schema refuses
    (look-alike digits, huge numbers, unknown fields, a NUL in a token, a result nested 100
    deep) is a 4xx problem and completes nothing of the batch; a result with a NUL, control
    characters, look-alike digits and a huge number is stored and answered as sent (the
    items reach SQL as one bound JSON document, never as SQL text)."""
    ids = [api.enqueue(producer).json["id"] for _ in range(2)]
    held = {job["id"]: job["lease_token"]
            for job in claim_many(client, worker, max_jobs=2).json["jobs"]}
    first, second = ({"id": job_id, "lease_token": held[job_id]} for job_id in ids)
    refused = [
        [first, {**second, "id": "١٢"}],  # Arabic-Indic digits
        [first, {**second, "id": 2**70}],
        [first, {**second, "id": 1.0e300}],
        [first, {**second, "unknown": 1}],
        [first, {**second, "lease_token": held[ids[1]] + "\u0000"}],
        [first, {**second, "lease_token": "t" * 100_000}],
        [first, {**second, "result": []}],
    ]
    for items in refused:
        answer = complete_many(client, worker, items)
        assert 400 <= answer.status_code < 500, (items, answer.status_code)
        assert answer.content_type == "application/problem+json"
    assert [api.get(producer, job_id).json["status"] for job_id in ids] == ["running"] * 2

    deep: Any = "bottom"
    for _ in range(100):
        deep = {"d": deep}
    answer = complete_many(client, worker, [second, {**first, "result": deep}])
    assert answer.status_code == 422, answer.json  # nested past the limit (64)
    assert [api.get(producer, job_id).json["status"] for job_id in ids] == ["running"] * 2

    odd = {"nul": "a\u0000b", "ctl\u0007": "\u202e\u0661\u0662", "big": 2**70}
    answer = complete_many(client, worker, [{**first, "result": odd}, second])
    assert answer.status_code == 200, answer.json
    assert [r["status"] for r in answer.json["results"]] == [200, 200]
    assert answer.json["results"][0]["job"]["result"] == odd
    assert api.get(producer, ids[0]).json["result"] == odd
