"""`queuelog copy`: moving a live queue's jobs and keys to another database (issue: move to
PostgreSQL). The target is each engine in turn; the source is a SQLite file."""

from __future__ import annotations

import shutil
import sqlite3

import pytest
from sqlalchemy import select

from app import create_app
from app.core.callers import Role
from app.schedules.schemas import ScheduleCreateSchema
from app.storage.engine import Database, make_engine
from app.storage.migrations import current_revision
from app.storage.transfer import TABLES, TransferError, copy_database
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
    services.types.update_type("sync", {"paused": True, "max_running": 3,
                                         "rate_per_second": 2.5})
    services.schedules.create_schedule(ScheduleCreateSchema().load(
        {"name": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Berlin",
         "job": {"type": "pdf"}, "catch_up": "all"}))
    services.db.engine.dispose()
    return url, producer, worker


def _rows(url):
    database = Database(make_engine(url, pooled=False))
    with database.read() as conn:
        found = {table.name: [tuple(row) for row in conn.execute(
            select(table).order_by(table.c.id))] for table in TABLES}
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


def test_copy_continues_ids_after_the_highest_the_source_ever_gave(source, empty_db_url,
                                                                   clock):
    # The newest jobs of the source were purged: their ids are gone from its rows but not
    # from its sequence, and the moved queue must not give them out again.
    source_url, producer, _ = source
    application = create_app({"DATABASE_URL": source_url, "JOB_TYPES": JOB_TYPES,
                              "CLOCK": clock, "TESTING": True})
    admin = Key("ops", application.extensions["queuelog"].keys.create_key("ops", Role.ADMIN))
    api = Api(application.test_client())
    newest = [api.enqueue(producer).json["id"] for _ in range(3)]
    for job_id in newest:
        api.cancel(admin, job_id)
    clock.advance(2 * 86_400)
    assert application.extensions["queuelog"].jobs.purge(older_than_seconds=86_400,
                                                             statuses=["cancelled"]) == 3
    application.extensions["queuelog"].db.engine.dispose()

    copy_database(source_url, empty_db_url)

    moved = create_app({"DATABASE_URL": empty_db_url, "JOB_TYPES": JOB_TYPES, "CLOCK": clock,
                        "TESTING": True})
    assert Api(moved.test_client()).enqueue(producer).json["id"] > max(newest)
    moved.extensions["queuelog"].db.engine.dispose()


def test_copy_from_a_missing_sqlite_file_says_so_in_one_line_and_writes_nothing(
        tmp_path, empty_db_url, runner):
    missing = tmp_path / "no-such.sqlite3"
    before = sorted(p.name for p in tmp_path.iterdir())

    result = runner.invoke(args=["copy", "--from", f"sqlite:///{missing}",
                                 "--to", empty_db_url])

    assert result.exit_code != 0
    assert result.output.strip().splitlines() == [
        f"Error: the source database {missing} does not exist"]
    assert "Traceback" not in result.output
    assert not missing.exists()
    # Nothing was created beside it, and the target was never migrated.
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    target = Database(make_engine(empty_db_url, pooled=False))
    with target.read() as conn:
        assert current_revision(conn) is None
    target.engine.dispose()


def test_copy_opens_a_sqlite_source_read_only(source, empty_db_url, tmp_path):
    source_url, _, _ = source
    path = tmp_path / "source.sqlite3"
    path.chmod(0o400)  # a read-write open would fail; the copy only reads
    try:
        copied = copy_database(source_url, empty_db_url)
    finally:
        path.chmod(0o600)
    # job_types: the settings changed on "sync", and "email"'s last claim.
    assert copied == {"api_keys": 2, "jobs": 25, "job_attempts": 6, "job_events": 36,
                      "job_types": 2, "schedules": 1}


def test_copy_refuses_a_source_without_the_schema_and_leaves_the_target_alone(
        tmp_path, empty_db_url):
    stranger = tmp_path / "stranger.sqlite3"
    sqlite3.connect(stranger).close()
    with pytest.raises(TransferError, match="schema revision none"):
        copy_database(f"sqlite:///{stranger}", empty_db_url)
    target = Database(make_engine(empty_db_url, pooled=False))
    with target.read() as conn:
        assert current_revision(conn) is None
    target.engine.dispose()


def test_copy_carries_the_types_flow_control_settings(source, empty_db_url, runner):
    source_url, _producer, _worker = source

    result = runner.invoke(args=["copy", "--from", source_url, "--to", empty_db_url])

    assert result.exit_code == 0, result.output
    target = create_app({"DATABASE_URL": empty_db_url, "JOB_TYPES": JOB_TYPES, "TESTING": True})
    sync = target.extensions["queuelog"].types.get_type("sync")
    target.extensions["queuelog"].db.engine.dispose()
    assert (sync.settings.paused, sync.settings.max_running,
            sync.settings.rate_per_second) == (True, 3, 2.5)


def test_copy_carries_the_schedules(source, empty_db_url):
    source_url, _producer, _worker = source
    copy_database(source_url, empty_db_url)
    target = create_app({"DATABASE_URL": empty_db_url, "JOB_TYPES": JOB_TYPES, "TESTING": True})
    nightly = target.extensions["queuelog"].schedules.get_schedule("nightly")
    target.extensions["queuelog"].db.engine.dispose()
    assert (nightly.cron, nightly.timezone, nightly.catch_up) == ("0 3 * * *", "Europe/Berlin",
                                                                   "all")
