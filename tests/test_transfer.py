"""`queuelog copy`: moving a live queue's jobs, keys and workflows to another database
(issue: move to PostgreSQL). The target is each engine in turn; the source is a SQLite file."""

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
from app.storage.transfer import SEQUENCED, TABLES, TransferError, copy_database
from tests.conftest import JOB_TYPES, Api, Key

WORKFLOW = {"name": "order-1001", "jobs": [
    {"ref": "charge", "type": "pdf", "payload": {"order": 1001}},
    {"ref": "mail", "type": "email", "depends_on": ["charge"]},
    {"ref": "ship", "type": "sync", "depends_on": ["charge", 6]},
    {"ref": "done", "type": "email", "depends_on": ["mail", "ship"],
     "on_dependency_failure": "run"}]}


@pytest.fixture
def source(sqlite_template, tmp_path, clock):
    """A SQLite queue with keys and jobs in several states, a job that waits for another
    and a workflow (jobs 27 to 30) whose jobs wait for its first one and for job 6, which
    runs."""
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
    # Job 1 fails its first attempt: a history its row cannot tell, kept in job_attempts and
    # job_events (the others' are told by their rows).
    claimed = api.claim(worker).json
    api.fail(worker, claimed["id"], lease_token=claimed["lease_token"], retry_in_seconds=0)
    for _ in range(5):
        claimed = api.claim(worker).json
        api.complete(worker, claimed["id"], lease_token=claimed["lease_token"], result={"ok": 1})
    api.claim(worker)
    waiting = api.enqueue(producer, type="pdf", depends_on=[25, 24],
                          on_dependency_failure="run").json
    assert (waiting["id"], waiting["status"]) == (26, "waiting")
    created = api.client.post("/workflows", json=WORKFLOW,
                              headers={**producer.headers, "Idempotency-Key": "order-1001"})
    assert created.status_code == 201 and created.json["jobs"]["charge"] == 27
    services.types.update_type("sync", {"paused": True, "max_running": 3,
                                         "rate_per_second": 2.5})
    services.schedules.create_schedule(ScheduleCreateSchema().load(
        {"name": "nightly", "cron": "0 3 * * *", "timezone": "Europe/Berlin",
         "job": {"type": "pdf"}, "catch_up": "all"}))
    services.close()  # its stats counts written, as a stopped server's are
    return url, producer, worker


def _rows(url):
    database = Database(make_engine(url, pooled=False))
    with database.read() as conn:
        found = {table.name: [tuple(row) for row in conn.execute(
            select(table).order_by(*table.primary_key.columns))] for table in TABLES}
    database.engine.dispose()
    return found


def test_copy_moves_every_job_and_key_with_ids_kept(source, empty_db_url, runner, clock):
    source_url, producer, worker = source

    result = runner.invoke(args=["copy", "--from", source_url, "--to", empty_db_url,
                                 "--batch-size", "7"])

    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1] == "copied 2 keys and 30 jobs"
    assert _rows(empty_db_url) == _rows(source_url)

    # The moved queue carries on: same tokens, replays recognised, new ids after the old.
    moved = create_app({"DATABASE_URL": empty_db_url, "JOB_TYPES": JOB_TYPES, "CLOCK": clock,
                        "TESTING": True})
    api = Api(moved.test_client())
    replay = api.enqueue(producer, headers={"Idempotency-Key": "k3"},
                         payload={"n": 3, "text": "nul\u0000"})
    assert replay.status_code == 200 and replay.json["id"] == 4
    assert api.enqueue(producer).json["id"] > 30  # PostgreSQL may skip ids, never reuse them
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
    # job_types: the settings changed on "sync", and "email"'s last claim. Dependencies:
    # job 26's two, and the workflow's 1 + 2 + 2.
    assert copied == {"api_keys": 2, "jobs": 30, "job_attempts": 1, "job_events": 2,
                      "job_dependencies": 7, "workflows": 1, "workflow_jobs": 4,
                      "key_turns": 0, "job_checkpoints": 0, "job_reservations": 0,
                      "job_types": 2, "schedules": 1, "failure_groups": 1,
                      "job_tags": 0, "job_traces": 0, "job_stats": 3, "job_depth": 0,
                      "job_waits": 0, "posted_events": 0}


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


def test_every_table_with_an_id_sequence_continues_after_the_source():
    # A table added with ids of its own must be continued too, or the first new row of the
    # moved queue would take a copied row's id (a workflow's, once).
    assert {table.name for table in TABLES if "id" in table.c} == {
        table.name for table in SEQUENCED}


def test_copy_carries_the_workflows_and_what_each_job_waits_for(source, empty_db_url, clock):
    """The moved queue goes on with the graphs where they were: the workflow reads the same,
    a replay of its Idempotency-Key finds it, the next workflow's id comes after it, and a
    dependency completed after the move releases the jobs waiting on it."""
    source_url, producer, worker = source
    copy_database(source_url, empty_db_url, batch_size=3)  # several batches of each table

    moved = create_app({"DATABASE_URL": empty_db_url, "JOB_TYPES": JOB_TYPES, "CLOCK": clock,
                        "TESTING": True})
    services = moved.extensions["queuelog"]
    admin = Key("ops", services.keys.create_key("ops", Role.ADMIN))
    api = Api(moved.test_client())
    shown = api.client.get("/workflows/1", headers=producer.headers).json
    assert (shown["name"], shown["status"]) == ("order-1001", "running")
    assert [(job["ref"], job["id"], job["status"], job["depends_on"])
            for job in shown["jobs"]] == [("charge", 27, "pending", []),
                                          ("mail", 28, "waiting", [27]),
                                          ("ship", 29, "waiting", [27, 6]),
                                          ("done", 30, "waiting", [28, 29])]
    waiting = api.get(producer, 26).json
    assert (waiting["status"], waiting["depends_on"], waiting["waiting_on"],
            waiting["on_dependency_failure"]) == ("waiting", [25, 24], 2, "run")

    replay = api.client.post("/workflows", json=WORKFLOW,
                             headers={**producer.headers, "Idempotency-Key": "order-1001"})
    assert replay.status_code == 200 and replay.json["id"] == 1
    again = api.client.post("/workflows", json=WORKFLOW, headers=producer.headers)
    assert again.status_code == 201 and again.json["id"] > 1

    # Job 27, the charge, runs on the moved queue: mail is released; ship still waits for 6.
    api.cancel(admin, 24)  # a failed dependency counts as finished for job 26 ("run")
    claimed = api.claim(worker, types=["pdf"]).json
    assert claimed["id"] == 27
    assert api.complete(worker, 27, lease_token=claimed["lease_token"]).status_code == 200
    statuses = {job["ref"]: job["status"] for job in
                api.client.get("/workflows/1", headers=producer.headers).json["jobs"]}
    assert statuses == {"charge": "completed", "mail": "pending", "ship": "waiting",
                        "done": "waiting"}
    assert api.get(producer, 26).json["waiting_on"] == 1  # 25 is still pending
    services.db.engine.dispose()


@pytest.fixture
def keyed_source(sqlite_template, tmp_path, clock):
    """A SQLite queue of contract §16: "email" orders its keys and blocks one on a failure
    (job 1 failed and blocks acct-1, whose job 2 waits; acct-2's job 3 has the turn, its job
    4 waits); "pdf" is fair, with three jobs of key A enqueued before one of B (jobs 5 to 8)."""
    path = tmp_path / "keyed.sqlite3"
    shutil.copyfile(sqlite_template, path)
    url = f"sqlite:///{path}"
    application = create_app({"DATABASE_URL": url, "JOB_TYPES": JOB_TYPES, "CLOCK": clock,
                              "TESTING": True})
    services = application.extensions["queuelog"]
    producer = Key("shop", services.keys.create_key("shop", Role.PRODUCER))
    worker = Key("mailer", services.keys.create_key("mailer", Role.WORKER))
    services.types.update_type("email", {"ordering": "key", "on_failure": "block"})
    services.types.update_type("pdf", {"fairness": "key"})
    api = Api(application.test_client())
    failing = api.enqueue(producer, concurrency_key="acct-1", max_retries=0).json["id"]
    claimed = api.claim(worker, types=["email"]).json
    assert claimed["id"] == failing == 1
    api.fail(worker, failing, lease_token=claimed["lease_token"])
    statuses = [api.enqueue(producer, concurrency_key=key).json["status"]
                for key in ("acct-1", "acct-2", "acct-2")]
    assert statuses == ["waiting", "pending", "waiting"]
    for key in ("A", "A", "A", "B"):
        api.enqueue(producer, type="pdf", concurrency_key=key)
    services.db.engine.dispose()
    return url, producer, worker


def test_copy_carries_ordered_keys_turns_and_fair_rounds(keyed_source, empty_db_url, runner,
                                                         clock):
    """The moved queue goes on where the old one was: a blocked key stays blocked until its
    failure is retried, a held job keeps waiting for its turn, and a fair type's jobs are
    claimed in the rounds they were given."""
    source_url, _producer, worker = keyed_source

    result = runner.invoke(args=["copy", "--from", source_url, "--to", empty_db_url,
                                 "--batch-size", "3"])

    assert result.exit_code == 0, result.output
    copied = _rows(empty_db_url)
    assert copied == _rows(source_url)
    # (type, producer, key, job, blocked): each key is its producer's.
    assert [turn[:5] for turn in copied["key_turns"]] == [("email", "shop", "acct-1", 1, 1),
                                                           ("email", "shop", "acct-2", 3, 0)]

    moved = create_app({"DATABASE_URL": empty_db_url, "JOB_TYPES": JOB_TYPES, "CLOCK": clock,
                        "TESTING": True})
    services = moved.extensions["queuelog"]
    admin = Key("ops", services.keys.create_key("ops", Role.ADMIN))
    api = Api(moved.test_client())
    assert api.client.get("/types/email", headers=admin.headers).json["blocked_keys"] == 1
    reason = api.client.get("/jobs/2/explain", headers=admin.headers).json["reasons"][0]
    assert (reason["code"], reason["job_id"], reason["concurrency_key"]) == (
        "key_blocked", 1, "acct-1")

    # pdf: B's only job comes second, not after all of A's.
    pdf = [api.claim(worker, types=["pdf"]).json for _ in range(4)]
    assert [(job["id"], job["concurrency_key"]) for job in pdf] == [
        (5, "A"), (8, "B"), (6, "A"), (7, "A")]
    # email: acct-2's turn runs; acct-1 is blocked, and its failure's retry takes the turn.
    assert api.claim(worker, types=["email"]).json["id"] == 3
    assert api.claim(worker, types=["email"]).status_code == 204
    assert api.retry(admin, 1).status_code == 200
    first = api.claim(worker, types=["email"]).json
    assert first["id"] == 1
    assert api.complete(worker, 1, lease_token=first["lease_token"]).status_code == 200
    assert api.claim(worker, types=["email"]).json["id"] == 2
    services.db.engine.dispose()
