"""`queuelog keys create | list | revoke`: the operator's side of authentication (contract 6, 7)."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pytest
from sqlalchemy import create_engine, select

from app.storage.schema import api_keys
from tests.conftest import Api, Key

TOKEN = re.compile(r"ql_[A-Za-z0-9_-]{43,}")


def _create(runner: Any, name: str, *options: str) -> Any:
    return runner.invoke(args=["keys", "create", name, *options])


def _create_key(runner: Any, name: str, role: str, *options: str) -> Key:
    result = _create(runner, name, "--role", role, *options)
    assert result.exit_code == 0, result.output
    return Key(name, result.stdout.splitlines()[-1])


def _stored_keys(db_url: str) -> list[dict[str, Any]]:
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(select(api_keys))]
    finally:
        engine.dispose()


@pytest.mark.parametrize("role", ["producer", "worker", "admin"])
def test_create_prints_a_strong_token_alone_on_the_last_line_and_it_works(
        runner, client, role):
    result = _create(runner, f"svc-{role}", "--role", role)

    assert result.exit_code == 0, result.output
    last_line = result.stdout.splitlines()[-1]
    assert TOKEN.fullmatch(last_line), last_line  # 32 random bytes, url-safe: 43+ characters
    assert result.stdout.count(last_line) == 1  # shown once
    response = client.get("/jobs", headers={"Authorization": f"Bearer {last_line}"})
    assert response.status_code == 200


def test_every_created_token_is_different(runner):
    tokens = {_create_key(runner, f"worker-{n}", "worker").token for n in range(5)}

    assert len(tokens) == 5


def test_the_database_stores_only_the_sha256_digest_of_a_token(runner, db_url):
    key = _create_key(runner, "billing", "producer")

    (row,) = _stored_keys(db_url)

    assert row["name"] == "billing"
    assert row["token_digest"] == hashlib.sha256(key.token.encode()).hexdigest()
    secret_part = key.token.removeprefix("ql_")
    for column, value in row.items():
        assert secret_part[:16] not in str(value), column


def test_list_shows_names_roles_and_status_but_never_a_token_or_its_digest(runner, db_url):
    producer = _create_key(runner, "billing", "producer", "--max-priority", "high",
                           "--types", "email,pdf")
    worker = _create_key(runner, "renderer", "worker")
    assert runner.invoke(args=["keys", "revoke", "renderer"]).exit_code == 0

    result = runner.invoke(args=["keys", "list"])

    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    billing = next(line for line in lines if line.startswith("billing"))
    renderer = next(line for line in lines if line.startswith("renderer"))
    assert billing.split() == ["billing", "producer", "high", "email,pdf", "live"]
    assert renderer.split()[:2] == ["renderer", "worker"]
    assert renderer.split()[-1] == "revoked"
    for key in (producer, worker):
        assert key.token not in result.output
        assert key.token.removeprefix("ql_")[:12] not in result.output
    for row in _stored_keys(db_url):
        assert row["token_digest"] not in result.output


def test_revoke_makes_the_next_request_with_that_key_401(runner, client):
    key = _create_key(runner, "billing", "producer")
    assert client.get("/jobs", headers=key.headers).status_code == 200

    result = runner.invoke(args=["keys", "revoke", "billing"])

    assert result.exit_code == 0, result.output
    response = client.get("/jobs", headers=key.headers)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert client.post("/jobs", json={"type": "email"}, headers=key.headers).status_code == 401


def test_revoking_an_unknown_or_already_revoked_key_fails(runner):
    _create_key(runner, "billing", "producer")
    assert runner.invoke(args=["keys", "revoke", "billing"]).exit_code == 0

    again = runner.invoke(args=["keys", "revoke", "billing"])
    unknown = runner.invoke(args=["keys", "revoke", "nobody"])

    for result in (again, unknown):
        assert result.exit_code != 0
        assert "Error" in result.output


def test_a_revoked_keys_name_is_never_reused(runner, client, db_url):
    old = _create_key(runner, "billing", "producer")
    assert runner.invoke(args=["keys", "revoke", "billing"]).exit_code == 0

    result = _create(runner, "billing", "--role", "admin")

    assert result.exit_code != 0
    assert "billing" in result.output
    assert not TOKEN.search(result.output)
    assert [row["name"] for row in _stored_keys(db_url)] == ["billing"]
    assert client.get("/jobs", headers=old.headers).status_code == 401


def test_a_live_keys_name_cannot_be_taken_by_a_second_key(runner, client, db_url):
    first = _create_key(runner, "billing", "producer")

    result = _create(runner, "billing", "--role", "admin")

    assert result.exit_code != 0
    assert not TOKEN.search(result.output)
    assert len(_stored_keys(db_url)) == 1
    assert client.get("/jobs", headers=first.headers).status_code == 200


def test_max_priority_sets_a_producers_ceiling(runner, api):
    trusted = _create_key(runner, "trusted", "producer", "--max-priority", "HIGH")
    default = _create_key(runner, "plain", "producer")

    assert api.enqueue(trusted, priority="high").status_code == 201
    assert api.enqueue(trusted, priority="critical").status_code == 403
    assert api.enqueue(default, priority="medium").status_code == 201
    assert api.enqueue(default, priority="high").status_code == 403


def test_types_limit_what_a_producer_may_enqueue(runner, api):
    mailer = _create_key(runner, "mailer", "producer", "--types", "email")

    assert api.enqueue(mailer, type="email").status_code == 201
    refused = api.enqueue(mailer, type="pdf")
    assert refused.status_code == 403
    assert refused.content_type == "application/problem+json"
    assert [job["type"] for job in api.list(mailer).json["jobs"]] == ["email"]


def test_types_limit_what_a_worker_is_ever_handed(runner, api, producer, admin):
    renderer = _create_key(runner, "renderer", "worker", "--types", "pdf,sync")
    email_job = api.enqueue(admin, type="email", priority="critical").json["id"]
    pdf_job = api.enqueue(producer, type="pdf", priority="low").json["id"]

    first = api.claim(renderer)
    asked_for_email = api.claim(renderer, types=["email"])
    nothing_left = api.claim(renderer)

    assert first.json["id"] == pdf_job  # the critical email job is passed over
    assert asked_for_email.status_code == 204
    assert nothing_left.status_code == 204
    assert api.get(admin, email_job).json["status"] == "pending"


@pytest.mark.parametrize("name", ["", "has space", "-leading-dash", ".hidden", "a/b", "x" * 101,
                                  "na\u00efve", "semi;colon", "quote'd"])
def test_invalid_key_names_are_rejected(runner, db_url, name):
    result = _create(runner, name, "--role", "producer")

    assert result.exit_code != 0
    assert not TOKEN.search(result.output)
    assert _stored_keys(db_url) == []


@pytest.mark.parametrize("options", [
    pytest.param(["--role", "root"], id="unknown role"),
    pytest.param(["--role", "Producer!"], id="misspelt role"),
    pytest.param([], id="no role"),
    pytest.param(["--role", "producer", "--max-priority", "urgent"], id="unknown priority"),
])
def test_invalid_roles_and_priorities_are_rejected(runner, db_url, options):
    result = _create(runner, "billing", *options)

    assert result.exit_code == 2  # a usage error
    assert not TOKEN.search(result.output)
    assert _stored_keys(db_url) == []


def test_a_key_created_by_the_cli_can_drive_a_whole_job(runner, api: Api):
    producer = _create_key(runner, "billing", "producer")
    worker = _create_key(runner, "renderer", "worker")

    job_id = api.enqueue(producer, type="pdf").json["id"]
    claim = api.claim(worker).json
    done = api.complete(worker, job_id, lease_token=claim["lease_token"], result={"pages": 2})

    assert claim["worker_id"] == "renderer"
    assert done.json["status"] == "completed"
    assert api.get(producer, job_id).json["result"] == {"pages": 2}


@pytest.mark.parametrize("args", [
    ["--role", "admin", "--max-priority", "low"],
    ["--role", "worker", "--max-priority", "high"],
    ["--role", "admin", "--types", "email"],
    ["--role", "producer", "--types", "email,emial"],
])
def test_key_options_that_cannot_mean_anything_are_refused(runner, args):
    result = runner.invoke(args=["keys", "create", "odd-key", *args])
    assert result.exit_code != 0
    assert "odd-key" not in runner.invoke(args=["keys", "list"]).output


def test_types_are_checked_against_the_configured_types_in_the_commands_shell(
        runner, app, db_url):
    refused = _create(runner, "mailer", "--role", "worker", "--types", "sms")
    assert refused.exit_code != 0
    assert "not among QUEUELOG_JOB_TYPES (email, pdf, sync): sms" in refused.output

    app.config["JOB_TYPES"] = frozenset()  # a shell without QUEUELOG_JOB_TYPES
    unchecked = _create(runner, "mailer", "--role", "worker", "--types", "email")
    assert unchecked.exit_code != 0
    assert "QUEUELOG_JOB_TYPES" in unchecked.output
    assert _stored_keys(db_url) == []
    # A key without types needs no configured types.
    assert _create(runner, "ops", "--role", "admin").exit_code == 0


def test_list_shows_a_priority_ceiling_for_producer_keys_only(runner):
    _create(runner, "maker", "--role", "producer", "--max-priority", "high")
    _create(runner, "runner-1", "--role", "worker")
    _create(runner, "boss", "--role", "admin")
    rows = {line.split()[0]: line.split() for line in
            runner.invoke(args=["keys", "list"]).output.splitlines()[1:]}
    assert rows["maker"][2] == "high"
    assert rows["runner-1"][2] == "-" and rows["boss"][2] == "-"
