"""PostgreSQL tells every host what changed (docs/SCALING.md, "Several hosts"): the triggers of
migration 0025 send one notification per statement that makes a job claimable or finished, or
changes a type's settings or a schedule, and nothing for claims, heartbeats or a bucket's
tokens; the maintenance lead's one question tells of delayed jobs coming due. Served, a host
that waits for work sends PostgreSQL nearly nothing, and a waiting claim on one host takes a
job enqueued on another, even when its listening session was cut meanwhile."""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests
from alembic import command
from sqlalchemy import event, make_url, text

from app import create_app
from app.core.callers import Role
from app.core.clock import MICROS, Clock, ManualClock
from app.jobs.sql.due_repository import ask_due_work
from app.jobs.sql.waiter_repository import CLAIMS, hold_waiting
from app.jobs.usecases.listening_lead import (
    ASK_COST_TIMES,
    FOLLOW_SECONDS,
    FULL_ASK_SECONDS,
    LEAD_SECONDS,
    LEASE_FLOOR_MARGIN_SECONDS,
    ListeningLead,
)
from app.jobs.usecases.waiters import WaiterEntry
from app.storage.engine import make_engine
from app.storage.listener import CHANNEL, DatabaseListener
from app.storage.migrations import alembic_config, upgrade
from tests.faults.conftest import ServerStarter
from tests.servers import LiveServer, bearer, create_api_key


def _driver_url(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


class Notices:
    """A session LISTENing on the queue's channel: what the database told since the last look."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(_driver_url(url), autocommit=True)
        self.conn.execute(f"LISTEN {CHANNEL}")

    def told(self) -> list[str]:
        """The payloads sent since the last call (every statement before it has committed)."""
        self.conn.execute("SELECT 1")  # delivers what arrived meanwhile
        return [notice.payload for notice in self.conn.notifies(timeout=0.2)]

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def pg_url(postgres_server: Any) -> str:
    return postgres_server.create_database()


def _someone_waits(url: str, until_us: int = 2**62) -> None:
    """A process whose requests wait, as job_waiters holds it: the jobs' notices go out."""
    engine = make_engine(url, pooled=False)
    with engine.begin() as conn:
        hold_waiting(conn, "a waiting process", CLAIMS, None, until_us)
    engine.dispose()


@pytest.fixture
def notices(pg_url: str) -> Iterator[Notices]:
    _someone_waits(pg_url)
    listening = Notices(pg_url)
    yield listening
    listening.close()


@pytest.fixture
def served_app(pg_url: str) -> Iterator[Any]:
    application = create_app({"TESTING": True, "DATABASE_URL": pg_url,
                              "JOB_TYPES": frozenset({"email", "pdf", "sync"}),
                              "DB_POOL_SIZE": 2})
    yield application
    application.extensions["queuelog"].close()


def _keys(application: Any) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    keys = application.extensions["queuelog"].keys
    return tuple(  # type: ignore[return-value]
        {"Authorization": f"Bearer {keys.create_key(f'{role.value}-1', role)}"}
        for role in (Role.PRODUCER, Role.WORKER, Role.ADMIN))


def test_each_change_a_waiter_acts_on_is_told_once_and_nothing_else(served_app, notices, pg_url):
    client = served_app.test_client()
    producer, worker, admin = _keys(served_app)
    assert notices.told() == []

    job = client.post("/jobs", json={"type": "email"}, headers=producer).json
    assert notices.told() == ["claimable"]
    batch = client.post("/jobs/batch", json={"jobs": [{"type": "email"}, {"type": "pdf"}]},
                        headers=producer)
    assert batch.status_code == 201, batch.json
    assert notices.told() == ["claimable"]  # one statement, one notice
    client.post("/jobs", json={"type": "email", "delay_seconds": 60}, headers=producer)
    assert notices.told() == []  # not due: the lead tells when it comes due

    claimed = client.post("/jobs/claim", json={"types": ["email"]}, headers=worker).json
    assert claimed["id"] == job["id"]
    assert notices.told() == ["types"]  # a type's first claim makes its row, once
    client.post(f"/jobs/{job['id']}/heartbeat", json={}, headers=worker)
    assert notices.told() == []  # heartbeats tell nobody
    client.post(f"/jobs/{job['id']}/complete", json={"result": {}}, headers=worker)
    assert notices.told() == ["finished"]

    second = client.post("/jobs/claim", json={"types": ["email"]}, headers=worker).json
    assert notices.told() == []  # nor do claims
    client.post(f"/jobs/{second['id']}/fail", json={"error": "x", "retry_in_seconds": 0},
                headers=worker)
    assert notices.told() == ["claimable"]  # back to pending, due now

    assert client.patch("/types/email", json={"paused": True},
                        headers=admin).status_code == 200
    assert notices.told() == ["types"]
    engine = make_engine(pg_url, pooled=False)
    with engine.begin() as conn:  # what claims write on a type's row
        conn.execute(text("UPDATE job_types SET tokens = 1, tokens_at = 1, last_claim_at = 1"))
    assert notices.told() == []
    with engine.begin() as conn:  # an update of no row, as a claim's insert of a known type
        conn.execute(text("UPDATE schedules SET paused = paused"))
    assert notices.told() == []
    made = client.post("/schedules", json={"name": "nightly", "cron": "0 3 * * *",
                                           "job": {"type": "email"}}, headers=admin)
    assert made.status_code == 201, made.json
    assert notices.told() == ["schedules"]
    engine.dispose()


def test_a_transaction_tells_once_what_all_its_statements_changed(served_app, notices):
    """PostgreSQL takes its server-wide notify lock per transaction and folds only equal
    notices: an end that frees other jobs (its dependents, its ordered key's next job) in the
    same transaction is told in one notice, and a schedule's firing in the job's notice."""
    client = served_app.test_client()
    producer, worker, admin = _keys(served_app)
    assert client.patch("/types/sync", json={"ordering": "key"},
                        headers=admin).status_code == 200

    def claim_and(outcome: str, job_type: str, body: dict[str, Any]) -> None:
        claimed = client.post("/jobs/claim", json={"types": [job_type]}, headers=worker).json
        notices.told()  # a type's first claim makes its row: 'types', a transaction of its own
        answer = client.post(f"/jobs/{claimed['id']}/{outcome}", json=body, headers=worker)
        assert answer.status_code == 200, answer.json

    first = client.post("/jobs", json={"type": "email"}, headers=producer).json
    dependent = client.post("/jobs", json={"type": "pdf", "depends_on": [first["id"]]},
                            headers=producer).json
    notices.told()
    claim_and("complete", "email", {"result": {}})
    assert notices.told() == ["claimable finished"]  # the end and its dependent's release
    assert client.get(f"/jobs/{dependent['id']}", headers=admin).json["status"] == "pending"

    for _ in range(2):
        client.post("/jobs", json={"type": "sync", "concurrency_key": "acct-1"},
                    headers=producer)
    notices.told()
    claim_and("complete", "sync", {"result": {}})
    assert notices.told() == ["claimable finished"]  # the end and the key's next turn

    failing = client.post("/jobs", json={"type": "email", "max_retries": 0},
                          headers=producer).json
    client.post("/jobs", json={"type": "pdf", "depends_on": [failing["id"]]}, headers=producer)
    notices.told()
    claim_and("fail", "email", {"error": "gone"})
    assert len(notices.told()) == 1  # the end, and its dependent cancelled

    schedules = served_app.extensions["queuelog"].schedules
    made = client.post("/schedules", json={"name": "minutely", "cron": "* * * * *",
                                           "job": {"type": "email"}}, headers=admin)
    assert made.status_code == 201, made.json
    assert notices.told() == ["schedules"]  # a setting changed: every ticker looks again
    assert schedules.fire_due(Clock().now_us() + 61 * MICROS) == 1
    assert notices.told() == ["claimable"]  # its slot's job; the slot moved on tells nobody


def test_with_nobody_waiting_the_jobs_changes_tell_nobody(served_app, pg_url):
    """The jobs' notices go out only while some process's requests wait (a notifying commit
    takes a lock for the whole server): a settings or schedule change is told still."""
    _someone_waits(pg_url, until_us=Clock().now_us() - MICROS)  # it waited, a while ago
    listening = Notices(pg_url)
    client = served_app.test_client()
    producer, worker, admin = _keys(served_app)
    job = client.post("/jobs", json={"type": "email"}, headers=producer).json
    client.post("/jobs/claim", json={"types": ["email"]}, headers=worker)
    client.post(f"/jobs/{job['id']}/complete", json={"result": {}}, headers=worker)
    assert listening.told() == ["types"]  # the type's first claim made its row
    client.patch("/types/email", json={"paused": True}, headers=admin)
    assert listening.told() == ["types"]

    # A claim that is about to wait says so, once for many waits, and for its types alone.
    _someone_waits(pg_url, until_us=Clock().now_us() - 2 * 3600 * MICROS)  # stopped long ago
    entry = WaiterEntry(served_app.extensions["queuelog"].db, Clock())
    peek_until = entry.before_claim_wait({"pdf"})
    assert peek_until > time.monotonic()  # new: its first second still peeks
    assert entry.before_claim_wait({"pdf"}) == peek_until  # held: no statement, no grace
    client.post("/jobs", json={"type": "email"}, headers=producer)
    assert listening.told() == []  # nobody waits for email jobs
    engine = make_engine(pg_url, pooled=False)
    with engine.connect() as conn:  # the entry long lapsed is forgotten as this one is written
        assert conn.execute(text("SELECT waiter FROM job_waiters")).scalars().all() == [
            entry.name]
    engine.dispose()
    pdf = client.post("/jobs", json={"type": "pdf"}, headers=producer).json
    assert listening.told() == ["claimable"]
    claimed = client.post("/jobs/claim", json={"types": ["pdf"]}, headers=worker).json
    assert claimed["id"] == pdf["id"]
    listening.told()  # the pdf type's first claim made its row
    client.post(f"/jobs/{pdf['id']}/complete", json={"result": {}}, headers=worker)
    assert listening.told() == ["finished"]  # its end may free a place a pdf claim awaits

    entry.before_claim_wait({"email"})  # now email too
    client.post("/jobs", json={"type": "email"}, headers=producer)
    assert listening.told() == ["claimable"]
    entry.before_read_wait()  # and a read waits for some job's end, whatever its type
    other = client.post("/jobs", json={"type": "sync"}, headers=producer).json
    assert listening.told() == []  # a sync job claimable: nobody waits for one
    client.post("/jobs/claim", json={"types": ["sync"]}, headers=worker)
    listening.told()
    client.post(f"/jobs/{other['id']}/complete", json={"result": {}}, headers=worker)
    assert listening.told() == ["finished"]
    listening.close()


def test_a_session_with_notify_off_tells_nobody(pg_url, notices):
    application = create_app({"TESTING": True, "DATABASE_URL": pg_url, "NOTIFY": False,
                              "JOB_TYPES": frozenset({"email"})})
    producer, _worker, _admin = _keys(application)
    client = application.test_client()
    assert client.post("/jobs", json={"type": "email"}, headers=producer).status_code == 201
    assert notices.told() == []
    application.extensions["queuelog"].close()


def test_the_leads_question_finds_what_is_due_and_tells_of_delayed_jobs_come_due(
        served_app, notices, pg_url):
    client = served_app.test_client()
    producer, worker, _admin = _keys(served_app)
    engine = make_engine(pg_url, pooled=False)
    now = Clock().now_us()

    def ask(at: int, since: int) -> Any:
        with engine.connect() as conn:
            due = ask_due_work(conn, at, since)
            conn.commit()
        return due

    idle = ask(now, now - MICROS)
    assert (idle.next_lease, idle.next_expiry, idle.next_delayed, idle.cascades,
            idle.reservations) == (None, None, None, False, False)
    assert not idle.sweeps_due and idle.next_at() is None
    assert notices.told() == []

    delayed = client.post("/jobs", json={"type": "email", "delay_seconds": 30},
                          headers=producer).json
    client.post("/jobs", json={"type": "pdf", "expires_in_seconds": 20}, headers=producer)
    client.post("/jobs/claim", json={"types": ["pdf"], "lease_seconds": 10}, headers=worker)
    # The pdf job's (the delayed one is not due), and the pdf type's first claim made its row.
    assert notices.told() == ["claimable", "types"]
    later = ask(now, now - MICROS)
    assert later.next_delayed is not None and later.next_delayed > now + 29 * MICROS
    assert later.next_lease is not None and later.next_lease > now
    assert later.next_at() == later.next_lease  # the lease runs out first
    assert not later.sweeps_due
    assert notices.told() == []

    # The delayed job's time comes: the ask that first sees it tells everyone, once.
    run_at = later.next_delayed
    assert ask(run_at, run_at - MICROS).sweeps_due  # the lease is past too
    assert notices.told() == ["claimable"]
    ask(run_at + MICROS, run_at)
    assert notices.told() == []
    assert delayed["id"]
    engine.dispose()


def test_the_migration_adds_the_triggers_and_index_to_a_database_0024_filled(empty_db_url,
                                                                           engine_name):
    upgrade(empty_db_url, "0024")
    engine = make_engine(empty_db_url, pooled=False)
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO jobs (type, payload, priority, status, retry_count, max_retries,"
            " producer, run_at, created_at, updated_at) VALUES"
            " ('email', '{}', 10, 'pending', 0, 3, 'p', 5, 1, 1),"
            " ('email', '{}', 10, 'pending', 0, 3, 'p', 1, 1, 1)"))
    upgrade(empty_db_url)

    def indexes() -> set[str]:
        query = ("SELECT name FROM sqlite_master WHERE type = 'index'" if engine_name == "sqlite"
                 else "SELECT indexname FROM pg_indexes WHERE tablename = 'jobs'")
        with engine.connect() as conn:
            return {row[0] for row in conn.execute(text(query))}

    assert "ix_jobs_delayed_run_at" in indexes()
    if engine_name == "postgresql":
        with engine.connect() as conn:
            triggers = {row[0] for row in conn.execute(text(
                "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal"))}
        assert triggers == {"queuelog_jobs_inserted", "queuelog_jobs_updated",
                            "queuelog_types_changed", "queuelog_schedules_changed"}
        _someone_waits(empty_db_url)
        listening = Notices(empty_db_url)
        with engine.begin() as conn:  # the upgraded database tells of its jobs' changes
            conn.execute(text("UPDATE jobs SET status = 'completed' WHERE id = 1"))
        assert listening.told() == ["finished"]
        listening.close()
    command.downgrade(alembic_config(empty_db_url), "0024")
    assert "ix_jobs_delayed_run_at" not in indexes()
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM jobs")).scalar() == 2
    engine.dispose()


def test_one_notice_per_transaction_on_a_database_0026_filled(empty_db_url, engine_name):
    upgrade(empty_db_url, "0026")
    engine = make_engine(empty_db_url, pooled=False)
    ends_and_frees = (  # a dependency's end and its dependent's release, one transaction
        "UPDATE jobs SET status = 'completed' WHERE id = 1",
        "UPDATE job_dependencies SET resolved = 1 WHERE depends_on_id = 1",
        "UPDATE jobs SET status = 'pending' WHERE id = 2")

    def told_by(statements: tuple[str, ...]) -> list[str]:
        listening = Notices(empty_db_url)
        with engine.begin() as conn:
            for statement in statements:
                conn.execute(text(statement))
        told = listening.told()
        listening.close()
        return told

    def fill() -> None:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM job_dependencies"))
            conn.execute(text("DELETE FROM jobs"))
            conn.execute(text(
                "INSERT INTO jobs (id, type, payload, priority, status, retry_count,"
                " max_retries, producer, run_at, created_at, updated_at) VALUES"
                " (1, 'email', '{}', 10, 'running', 0, 3, 'p', 1, 1, 1),"
                " (2, 'pdf', '{}', 10, 'waiting', 0, 3, 'p', 1, 1, 1)"))
            conn.execute(text(
                "INSERT INTO job_dependencies (job_id, position, depends_on_id,"
                " cancel_on_failure, resolved) VALUES (2, 0, 1, 1, 0)"))

    fill()
    if engine_name == "postgresql":
        _someone_waits(empty_db_url)
        assert told_by(ends_and_frees) == ["finished", "claimable"]  # 0026: one per statement
        fill()
    upgrade(empty_db_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM job_dependencies")).scalar() == 1
    if engine_name == "postgresql":
        assert told_by(ends_and_frees) == ["claimable finished"]
        fill()
    command.downgrade(alembic_config(empty_db_url), "0026")
    if engine_name == "postgresql":
        assert told_by(ends_and_frees) == ["finished", "claimable"]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM jobs")).scalar() == 2
    engine.dispose()


# -- served ---------------------------------------------------------------------------------


class StatementLog:
    """The statements PostgreSQL received for one database, read from its own log between
    two marks (log_statement = 'all' for that database's sessions)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.database = make_url(url).database
        with psycopg.connect(_driver_url(url), autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{self.database}" SET log_statement = \'all\'')
            path = conn.execute("SELECT pg_current_logfile()").fetchone()[0]
            directory = conn.execute("SHOW data_directory").fetchone()[0]
        if path is not None and not os.path.isabs(path):
            path = os.path.join(directory, path)
        candidates = [path] if path else sorted(glob.glob("/var/log/postgresql/*.log"),
                                                key=os.path.getmtime)
        if not candidates or not os.access(candidates[-1], os.R_OK):
            pytest.fail("PostgreSQL's log could not be read")
        self.path = candidates[-1]

    def mark(self) -> str:
        label = f"queuelog-mark-{uuid.uuid4().hex}"
        with psycopg.connect(_driver_url(self.url), autocommit=True) as conn:
            conn.execute(f"SELECT '{label}'")
        return label

    def between(self, first: str, last: str) -> list[str]:
        deadline = time.monotonic() + 10
        while True:
            lines = Path(self.path).read_text(errors="replace").splitlines()
            starts = [i for i, line in enumerate(lines) if first in line]
            ends = [i for i, line in enumerate(lines) if last in line]
            if starts and ends:
                break
            assert time.monotonic() < deadline, "the marks never reached the log"
            time.sleep(0.1)
        tag = f"@{self.database} "
        return [line for line in lines[starts[0] + 1:ends[-1]]
                if tag in line and ("statement: " in line or "execute " in line)]


def _host(directory: Path, url: str, workers: int) -> LiveServer:
    """A server with a TMPDIR (and so a wake directory and a listener) of its own: a host.
    Short, so that the sockets' paths fit in it."""
    return ServerStarter(directory)(url, workers=workers, threads=4)


@pytest.fixture
def hosts(pg_url: str) -> Iterator[tuple[StatementLog, list[LiveServer], list[Path]]]:
    log = StatementLog(pg_url)
    started: list[LiveServer] = []
    directories = [Path(tempfile.mkdtemp(prefix="ql-host-")) for _ in range(2)]
    yield log, started, directories
    for server in started:
        server.kill()
    for directory in directories:
        shutil.rmtree(directory, ignore_errors=True)


def test_an_idle_host_waiting_for_work_sends_nearly_nothing_and_wakes_on_another_hosts_job(
        hosts, pg_url):
    log, started, directories = hosts
    producer = bearer(create_api_key(pg_url, "producer-1", "producer"))
    worker = bearer(create_api_key(pg_url, "worker-1", "worker"))
    started += [_host(directories[0], pg_url, workers=2), _host(directories[1], pg_url, workers=2)]
    host_a, host_b = started
    time.sleep(2)  # the listeners are up, one of them leads
    # Each process writes its minute's stats at the minute's start: not in the window.
    into_minute = time.time() % 60
    if not 3 < into_minute < 50:
        time.sleep((63 - into_minute) % 60)
    answer: dict[str, Any] = {}

    def claim() -> None:
        answer["claim"] = requests.post(host_b.url_of("/jobs/claim"),
                                        json={"types": ["email"], "wait_seconds": 20},
                                        headers=worker, timeout=60)

    waiting = threading.Thread(target=claim)
    waiting.start()
    # A process whose requests begin to wait peeks for its first second (a transaction
    # that checked for waiters before it said so may commit a job and tell nobody).
    time.sleep(1.5)
    first = log.mark()
    time.sleep(4)  # two idle hosts, a claim waiting on one
    quiet = log.mark()
    made = requests.post(host_a.url_of("/jobs"), json={"type": "email"}, headers=producer,
                         timeout=30).json()
    waiting.join(60)
    assert answer["claim"].status_code == 200
    assert answer["claim"].json()["id"] == made["id"]
    sent = log.between(first, quiet)
    # The lead's question once a second, the other host's try for the lead: no waiter's
    # peek (one every 50 ms would be 80 in these 4 s), no background loop's round.
    assert len(sent) <= 10, "\n".join(sent)


def test_a_job_committed_while_the_hosts_listened_to_nothing_is_still_claimed(hosts, pg_url):
    _log, started, directories = hosts
    worker = bearer(create_api_key(pg_url, "worker-1", "worker"))
    started += [_host(directories[0], pg_url, workers=1), _host(directories[1], pg_url, workers=1)]
    _host_a, host_b = started
    time.sleep(2)
    answer: dict[str, Any] = {}

    def claim() -> None:
        answer["claim"] = requests.post(host_b.url_of("/jobs/claim"),
                                        json={"types": ["email"], "wait_seconds": 20},
                                        headers=worker, timeout=60)

    waiting = threading.Thread(target=claim)
    waiting.start()
    time.sleep(1)
    with psycopg.connect(_driver_url(pg_url), autocommit=True) as conn:
        # Every listening session ends (each host's), and a job is committed at once, long
        # before they listen again (a listener waits a fifth of a second to connect again):
        # its notice reaches nobody.
        cut = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database()"
            " AND application_name = 'queuelog listener'").fetchall()
        made = conn.execute(
            "INSERT INTO jobs (type, payload, priority, status, retry_count, max_retries,"
            " producer, run_at, created_at, updated_at) VALUES ('email', '{}', 10, 'pending',"
            " 0, 3, 'producer-1', 1, 1, 1) RETURNING id").fetchone()
        listening = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'queuelog listener'").fetchone()
    assert len(cut) == 2
    assert listening == (0,)  # the job was committed while nobody listened
    waiting.join(60)
    # The listener that comes back tells its host's waiters to look: the claim takes the job
    # within its wait (a waiter told nothing would look again only after a minute).
    assert answer["claim"].status_code == 200
    assert answer["claim"].json()["id"] == made[0]


# -- the listener ---------------------------------------------------------------------------


class Delivered:
    def __init__(self) -> None:
        self.kinds: list[frozenset[str]] = []
        self._changed = threading.Condition()

    def __call__(self, kinds: frozenset[str]) -> None:
        with self._changed:
            self.kinds.append(kinds)
            self._changed.notify_all()

    def wait_for(self, count: int) -> list[frozenset[str]]:
        with self._changed:
            assert self._changed.wait_for(lambda: len(self.kinds) >= count, timeout=30), \
                self.kinds
            return list(self.kinds)


def _listening_sessions(conn: psycopg.Connection[Any]) -> list[int]:
    return [row[0] for row in conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = 'queuelog listener'")]


def test_one_listener_per_host_and_a_new_session_tells_every_kind(pg_url, tmp_path):
    """Of two listeners of one host (one lock file), one listens; it hands each notice on; when
    its session is cut it listens again and tells every kind (a notice sent meanwhile reached
    nobody); when it stops, the other takes over, and tells every kind too."""
    engine = make_engine(pg_url)
    every = frozenset({"claimable", "finished"})
    lock = str(tmp_path / "listener.lock")
    delivered = [Delivered(), Delivered()]
    listeners = [DatabaseListener(engine, lock, delivered[0], every).start(),
                 DatabaseListener(engine, lock, delivered[1], every).start()]
    other = psycopg.connect(_driver_url(pg_url), autocommit=True)
    try:
        deadline = time.monotonic() + 30
        while not any(told.kinds for told in delivered):
            assert time.monotonic() < deadline, "no listener listens"
            time.sleep(0.05)
        leading = 0 if delivered[0].kinds else 1
        first, second = delivered[leading], delivered[1 - leading]
        assert first.wait_for(1) == [every]
        assert len(_listening_sessions(other)) == 1
        other.execute(f"NOTIFY {CHANNEL}, 'finished'")
        assert first.wait_for(2)[1] == frozenset({"finished"})

        other.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                      " WHERE application_name = 'queuelog listener'"
                      " AND datname = current_database()")
        assert first.wait_for(3)[2] == every  # listening again
        other.execute(f"NOTIFY {CHANNEL}, 'claimable'")
        assert first.wait_for(4)[3] == frozenset({"claimable"})

        listeners[leading].stop()
        assert second.wait_for(1) == [every]
        other.execute(f"NOTIFY {CHANNEL}, 'finished'")
        assert second.wait_for(2)[1] == frozenset({"finished"})
        assert len(first.kinds) == 4
        assert len(_listening_sessions(other)) == 1
    finally:
        for listener in listeners:
            listener.stop()
        other.close()
        engine.dispose()


class WokenChores:
    """The maintenance loop as the lead sees it: which chores it was woken for."""

    def __init__(self) -> None:
        self.woken: list[set[str]] = []

    def wake(self, chores: Any) -> None:
        self.woken.append(set(chores))


def test_one_lead_per_database_woken_for_the_chores_with_work(served_app, pg_url):
    client = served_app.test_client()
    producer, worker, _admin = _keys(served_app)
    engine = make_engine(pg_url, pooled=False)
    first_loop, second_loop = WokenChores(), WokenChores()
    first = ListeningLead(Clock(), first_loop)  # type: ignore[arg-type]
    second = ListeningLead(Clock(), second_loop)  # type: ignore[arg-type]
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as one, \
            engine.connect().execution_options(isolation_level="AUTOCOMMIT") as other:
        wait = first.tick(one)
        assert first.leading and 0 < wait <= LEAD_SECONDS
        # The lead noted; nothing due (retention and the horizon's look keep their own pace).
        assert first_loop.woken == [set(), {"retention", "horizon"}]
        assert second.tick(other) == FOLLOW_SECONDS and not second.leading
        assert second_loop.woken == []

        client.post("/jobs", json={"type": "email"}, headers=producer)
        client.post("/jobs/claim", json={"lease_seconds": 1}, headers=worker)
        assert first.tick(one) <= 1.0  # no later than the lease's end
        time.sleep(1.1)
        first.tick(one)
        assert first_loop.woken[-1] == {"retention", "horizon", "sweep"}  # the lease ran out

        first.lost()  # its session ended: the lock with it
        one.close()
        assert not first.leading
        for _ in range(50):  # the server frees a closed session's locks a moment later
            if second.tick(other) <= LEAD_SECONDS:
                break
            time.sleep(0.1)
        assert second.leading
    engine.dispose()


@dataclass
class ManualLead:
    """A lead on a clock the test moves, and the chores it woke."""

    clock: ManualClock
    loop: WokenChores
    lead: ListeningLead


@pytest.fixture
def lead_on_a_manual_clock() -> ManualLead:
    clock, loop = ManualClock(start_us=Clock().now_us()), WokenChores()
    return ManualLead(clock, loop, ListeningLead(clock, loop))  # type: ignore[arg-type]


def test_the_lead_finds_each_lease_from_its_floor_and_a_lagging_hosts_at_its_full_ask(
        served_app, pg_url, lead_on_a_manual_clock):
    """The lead asks for the next lease from a floor (the earlier of its last ask and the
    lease it found, less a margin): a lease written since is found at the next ask; one a
    host with a clock far behind wrote below the floor is found at the next full ask, and
    its job is swept then."""
    client, producer, worker = served_app.test_client(), *_keys(served_app)[:2]
    clock, loop, lead = lead_on_a_manual_clock.clock, lead_on_a_manual_clock.loop, \
        lead_on_a_manual_clock.lead
    engine = make_engine(pg_url, pooled=False)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        lead.tick(conn)  # leads; its first ask is a full one
        clock.advance(1.0)
        lead.tick(conn)  # from here, asks from the floor
        assert "sweep" not in loop.woken[-1]

        def claimed() -> dict[str, Any]:
            client.post("/jobs", json={"type": "email"}, headers=producer)
            answer = client.post("/jobs/claim", json={"lease_seconds": 2}, headers=worker)
            assert answer.status_code == 200
            return answer.json  # type: ignore[no-any-return]

        on_time = claimed()
        clock.advance(3.0)  # past the lease it wrote after the last ask
        lead.tick(conn)
        assert "sweep" in loop.woken[-1]
        assert client.post(f"/jobs/{on_time['id']}/complete",
                           json={"lease_token": on_time["lease_token"]},
                           headers=worker).status_code == 200

        # A lease as a host whose clock runs a minute behind would write it: below the floor.
        lagging = claimed()
        conn.execute(text("UPDATE jobs SET lease_expires_at = :at WHERE id = :id"),
                     {"at": clock.now_us() - round((LEASE_FLOOR_MARGIN_SECONDS + 60) * MICROS),
                      "id": lagging["id"]})
        clock.advance(0.5)
        lead.tick(conn)
        assert "sweep" not in loop.woken[-1]
        clock.advance(FULL_ASK_SECONDS)
        lead.tick(conn)
        assert "sweep" in loop.woken[-1]  # the full ask finds it
    engine.dispose()


def test_a_slow_question_about_leases_puts_the_next_one_off_by_as_many_times(
        served_app, pg_url, lead_on_a_manual_clock):
    """An ask that took 0.1 s (as one stepping over a held snapshot's leases would) is asked
    about leases again only ASK_COST_TIMES x 0.1 s later; the asks between still come each
    second, and a lease that ran out meanwhile is swept at the next ask about leases."""
    client, producer, worker = served_app.test_client(), *_keys(served_app)[:2]
    clock, loop, lead = lead_on_a_manual_clock.clock, lead_on_a_manual_clock.loop, \
        lead_on_a_manual_clock.lead
    engine = make_engine(pg_url, pooled=False)

    def slow(*_args: Any) -> None:
        clock.advance(0.1)

    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        lead.tick(conn)  # leads
        client.post("/jobs", json={"type": "email"}, headers=producer)
        assert client.post("/jobs/claim", json={"lease_seconds": 1},
                           headers=worker).status_code == 200
        event.listen(conn, "before_cursor_execute", slow)
        lead.tick(conn)  # asks about leases, and took 0.1 s
        event.remove(conn, "before_cursor_execute", slow)
        clock.advance(1.5)  # the lease has run out
        lead.tick(conn)
        assert "sweep" not in loop.woken[-1]  # not asked about leases yet
        clock.advance(ASK_COST_TIMES * 0.1 - 1.5)
        lead.tick(conn)
        assert "sweep" in loop.woken[-1]
    engine.dispose()
