"""`queuelog copy`: moving a live queue's jobs and keys to another database (issue: move to
PostgreSQL). The target is each engine in turn; the source is a SQLite file."""

from __future__ import annotations

import shutil

import pytest
from sqlalchemy import select

from app import create_app
from app.db import Database, api_keys, jobs, make_engine
from app.keys.models import Role
from app.transfer import TransferError, copy_database
from tests.conftest import JOB_TYPES, Api, Key


@pytest.fixture
def source(sqlite_template, tmp_path, clock):
    """A SQLite queue with keys and jobs in several states."""
    path = tmp_path / "source.sqlite3"
    shutil.copyfile(sqlite_template, path)
    url = f"sqlite:///{path}"
    application = create_app({"DATABASE_URL": url, "JOB_TYPES": JOB_TYPES, "CLOCK": clock,
                              "TESTING": True})
    services = application.extensions["queuelog"]
    producer = Key("shop", services.keys.create_key("shop", Role.PRODUCER))
    worker = Key("mailer", services.keys.create_key("mailer", Role.WORKER))
    api = Api(application.test_client())
    for n in range(25):
        api.enqueue(producer, payload={"n": n, "text": "nul\u0000"},
                    headers={"Idempotency-Key": f"k{n}"})
    for _ in range(5):
        claimed = api.claim(worker).json
        api.complete(worker, claimed["id"], lease_token=claimed["lease_token"], result={"ok": 1})
    api.claim(worker)
    services.db.engine.dispose()
    return url, producer, worker


def _rows(url):
    database = Database(make_engine(url, pooled=False))
    with database.read() as conn:
        found = {table.name: [tuple(row) for row in conn.execute(
            select(table).order_by(table.c.id))] for table in (api_keys, jobs)}
    database.engine.dispose()
    return found


def test_copy_moves_every_job_and_key_with_ids_kept(source, empty_db_url, runner, clock):
    source_url, producer, worker = source

    result = runner.invoke(args=["copy", "--from", source_url, "--to", empty_db_url,
                                 "--batch-size", "7"])

    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1] == "copied 2 keys and 25 jobs"
    assert _rows(empty_db_url) == _rows(source_url)

    # The moved queue carries on: same tokens, replays recognised, new ids after the old.
    moved = create_app({"DATABASE_URL": empty_db_url, "JOB_TYPES": JOB_TYPES, "CLOCK": clock,
                        "TESTING": True})
    api = Api(moved.test_client())
    replay = api.enqueue(producer, headers={"Idempotency-Key": "k3"},
                         payload={"n": 3, "text": "nul\u0000"})
    assert replay.status_code == 200 and replay.json["id"] == 4
    assert api.enqueue(producer).json["id"] > 25  # PostgreSQL may skip ids, never reuse them
    assert api.claim(worker).status_code == 200
    moved.extensions["queuelog"].db.engine.dispose()


def test_copy_refuses_a_target_that_already_holds_jobs(source, empty_db_url):
    source_url, _, _ = source
    copy_database(source_url, empty_db_url)
    with pytest.raises(TransferError, match="empty"):
        copy_database(source_url, empty_db_url)
