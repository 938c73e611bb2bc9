"""Regression: on PostgreSQL a claim once took every claimable job while answering with one."""

from __future__ import annotations

from typing import Any


def test_a_claim_takes_exactly_one_job_and_leaves_the_others_pending(
        app: Any, api: Any, producer: Any, worker: Any, admin: Any) -> None:
    ids = [api.enqueue(producer).json["id"] for _ in range(3)]

    claimed = api.claim(worker)

    assert claimed.status_code == 200
    assert claimed.json["id"] == ids[0]
    statuses = {job["id"]: job["status"] for job in api.list(admin).json["jobs"]}
    assert statuses == {ids[0]: "running", ids[1]: "pending", ids[2]: "pending"}


def test_claiming_several_takes_the_limit_in_claim_order(app: Any, api: Any, producer: Any,
                                                         worker: Any) -> None:
    ids = [api.enqueue(producer).json["id"] for _ in range(5)]
    caller = app.extensions["queuelog"].keys.caller_for_token(worker.token)

    claimed = app.extensions["queuelog"].jobs.claim(caller, limit=2)

    assert [c.job.id for c in claimed] == ids[:2]
    assert api.claim(worker).json["id"] == ids[2]
