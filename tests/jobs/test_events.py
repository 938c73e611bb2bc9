"""The job service tells its event sink (metrics) what happened only once it is committed."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from app.storage.schema import jobs as jobs_table


def test_events_are_told_after_their_transaction_commits_and_once(app, api, producer, worker,
                                                                   clock):
    services = app.extensions["queuelog"]
    told: list[tuple[str, int, Any]] = []

    def rows() -> Any:
        # A connection of its own: it sees committed rows only.
        with services.db.read() as conn:
            return conn.execute(select(jobs_table.c.id, jobs_table.c.status,
                                       jobs_table.c.retry_count, jobs_table.c.lease_token)
                                .order_by(jobs_table.c.id)).all()

    services.jobs.uow.on_event = lambda name, count: told.append((name, count, rows()))

    first = api.enqueue(producer, max_retries=1).json["id"]
    lease = api.claim(worker, lease_seconds=1).json["lease_token"]
    api.enqueue(producer)
    told.clear()
    clock.advance(2)  # the first lease runs out: maintenance rescues it
    after_rescue = rows()
    assert sorted(name for name, _, _ in told) == ["rescued", "retried"]
    assert all(seen == after_rescue for _, _, seen in told)
    told.clear()
    again = api.claim(worker).json
    assert again["id"] == first and again["lease_token"] != lease
    after_claim = rows()
    assert sorted(name for name, _, _ in told) == ["claimed"]
    assert all(seen == after_claim for _, _, seen in told)

    told.clear()
    body = {"lease_token": again["lease_token"], "result": {"ok": True}}
    assert api.complete(worker, first, **body).status_code == 200
    assert [(name, count) for name, count, _ in told] == [("completed", 1)]
    assert told[0][2] == rows()

    told.clear()
    assert api.complete(worker, first, **body).status_code == 200  # a repeat: nothing new
    assert told == []


def test_an_admins_retry_and_cancel_are_counted_single_and_bulk(app, api, client, producer,
                                                               admin):
    uow = app.extensions["queuelog"].jobs.uow
    first, second = (api.enqueue(producer).json["id"] for _ in range(2))
    told: list[tuple[str, int]] = []
    uow.on_event = lambda name, count: told.append((name, count))

    assert api.cancel(admin, first).status_code == 200
    assert told == [("cancelled", 1)]
    told.clear()
    assert api.retry(admin, first).status_code == 200
    assert told == [("requeued", 1)]

    told.clear()
    bulk = {"json": {"ids": [first, second]}, "headers": admin.headers}
    assert client.post("/jobs/cancel-many", **bulk).json["count"] == 2
    assert told == [("cancelled", 2)]
    told.clear()
    assert client.post("/jobs/retry-many", **bulk).json["count"] == 2
    assert told == [("requeued", 2)]
