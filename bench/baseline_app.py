"""The bare Flask app the HTTP figures are measured against.

It does what any JSON service on this stack must do for the same requests (parse the JSON
body, answer the same status with a job-sized JSON body) and nothing queuelog adds:
no authentication, validation, database, request log or metrics. Served by gunicorn with
the shipped gunicorn.conf.py: `gunicorn bench.baseline_app:app` from the project root.
"""

from __future__ import annotations

import itertools
from typing import Any

from flask import Flask, jsonify, request

app = Flask(__name__)
app.json.sort_keys = False  # type: ignore[attr-defined]
_ids = itertools.count(1)

_TIME = "2026-11-30T04:40:43.123456Z"


def _job(job_id: int, payload: Any, status: str, **extra: Any) -> dict[str, Any]:
    """A body shaped and sized like queuelog's job."""
    return {"id": job_id, "type": "email", "payload": payload, "priority": "medium",
            "status": status, "retry_count": 0, "max_retries": 3, "idempotency_key": None,
            "run_at": _TIME, "claimed_at": None, "worker_id": None, "lease_expires_at": None,
            "result": None, "created_at": _TIME, "updated_at": _TIME, **extra}


def _body() -> dict[str, Any]:
    body = request.get_json(silent=True)
    return body if isinstance(body, dict) else {}


@app.get("/healthz")
def healthz() -> Any:
    return jsonify({"status": "ok"})


@app.post("/jobs")
def enqueue() -> Any:
    body = _body()
    job_id = next(_ids)
    response = jsonify(_job(job_id, body.get("payload", {}), "pending"))
    response.status_code = 201
    response.headers["Location"] = f"/jobs/{job_id}"
    return response


@app.post("/jobs/claim")
def claim() -> Any:
    _body()
    job_id = next(_ids)
    return jsonify(_job(job_id, {"to": "user@example.com", "template": "welcome-v2",
                                 "locale": "en-GB"}, "running",
                        claimed_at=_TIME, worker_id="worker", lease_expires_at=_TIME,
                        lease_token=f"{'0' * 32}.{job_id}"))


@app.post("/jobs/<int:job_id>/complete")
def complete(job_id: int) -> Any:
    body = _body()
    return jsonify(_job(job_id, {"to": "user@example.com", "template": "welcome-v2",
                                 "locale": "en-GB"}, "completed",
                        claimed_at=_TIME, worker_id="worker", result=body.get("result")))


@app.post("/jobs/batch")
def enqueue_batch() -> Any:
    jobs = _body().get("jobs", [])
    response = jsonify({"jobs": [_job(next(_ids), job.get("payload", {}), "pending")
                                 | {"replayed": False} for job in jobs]})
    response.status_code = 201
    return response


@app.post("/jobs/claim-many")
def claim_many() -> Any:
    wanted = _body().get("max_jobs", 10)
    jobs = []
    for _ in range(wanted):
        job_id = next(_ids)
        jobs.append(_job(job_id, {"to": "user@example.com", "template": "welcome-v2",
                                  "locale": "en-GB"}, "running", claimed_at=_TIME,
                         worker_id="worker", lease_expires_at=_TIME,
                         lease_token=f"{'0' * 32}.{job_id}"))
    return jsonify({"jobs": jobs})


@app.post("/jobs/complete-many")
def complete_many() -> Any:
    items = _body().get("items", [])
    return jsonify({"results": [
        {"id": item.get("id"), "status": 200,
         "job": _job(item.get("id"), {"to": "user@example.com", "template": "welcome-v2",
                                      "locale": "en-GB"}, "completed", claimed_at=_TIME,
                     worker_id="worker", result=item.get("result"))}
        for item in items]})
