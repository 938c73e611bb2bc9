"""The operator's commands: db upgrade from anywhere, purge."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from app import stop_maintenance
from app.cli import parse_duration
from app.storage.migrations import head_revision
from app.storage.schema import job_attempts, job_events

QUEUELOG = Path(sys.executable).with_name("queuelog")


def _run(args, cwd, env_extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUELOG_")}
    env.pop("PYTHONPATH", None)
    env.update(env_extra)
    return subprocess.run([str(QUEUELOG), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_installed_command_migrates_and_creates_keys_from_any_directory(tmp_path):
    # Run from a directory with no checkout in sight: the installed project must carry its
    # Alembic scripts (after a plain `pip install .` they come from the installed data).
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    db = tmp_path / "data" / "q.sqlite3"
    db.parent.mkdir()
    env = {"QUEUELOG_DATABASE_URL": f"sqlite:///{db}", "QUEUELOG_JOB_TYPES": "email"}

    upgraded = _run(["db", "upgrade"], elsewhere, env)
    assert upgraded.returncode == 0, upgraded.stderr
    created = _run(["keys", "create", "first-admin", "--role", "admin"], elsewhere, env)
    assert created.returncode == 0, created.stderr

    with sqlite3.connect(db) as conn:
        version = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        assert version == (head_revision(),)
        assert conn.execute("SELECT name, role FROM api_keys").fetchall() == [
            ("first-admin", "admin")]
    assert created.stdout.strip().splitlines()[-1].startswith("ql_")


def test_db_upgrade_through_the_flask_cli_runner(runner, empty_db_url, app):
    app.config["DATABASE_URL"] = empty_db_url
    result = runner.invoke(args=["db", "upgrade"])
    assert result.exit_code == 0, result.output
    assert "head" in result.output


@pytest.mark.parametrize("text,seconds", [("30s", 30), ("15m", 900), ("2h", 7200),
                                          ("7d", 604_800), ("2w", 1_209_600)])
def test_durations_read_as_seconds(text, seconds):
    assert parse_duration(text) == seconds


def _finished_jobs(api, producer, worker, admin, clock):
    """One job in every status; returns {status: id}. The running one stays running however
    far the clock is moved: the maintenance loop, whose round moving the clock runs, is
    stopped, so no lease is rescued."""
    stop_maintenance(api.client.application)
    ids = {}
    for status in ("completed", "failed", "cancelled", "running", "pending"):
        ids[status] = api.enqueue(producer, max_retries=0).json["id"]
        if status == "cancelled":
            api.cancel(admin, ids[status])
        elif status != "pending":
            claimed = api.claim(worker).json
            if status == "completed":
                api.complete(worker, claimed["id"])
            elif status == "failed":
                api.fail(worker, claimed["id"])
    return ids


def _remaining(api, admin):
    return {job["status"] for job in api.list(admin, limit=500).json["jobs"]}


def test_purge_deletes_only_old_finished_jobs_and_says_how_many(runner, api, producer, worker,
                                                                admin, clock):
    _finished_jobs(api, producer, worker, admin, clock)
    clock.advance(3 * 86_400)
    recent = api.enqueue(producer).json["id"]
    api.cancel(admin, recent)  # finished, but too recent to purge

    result = runner.invoke(args=["purge", "--older-than", "2d", "--batch-size", "1"])

    assert result.exit_code == 0, result.output
    assert result.output.strip() == "purged 3 jobs"
    left = api.list(admin).json["jobs"]
    assert sorted(j["status"] for j in left) == ["cancelled", "pending", "running"]
    assert recent in [j["id"] for j in left]


def test_purge_removes_the_attempts_and_events_of_the_jobs_it_deletes(runner, app, api,
                                                                      producer, worker, admin,
                                                                      clock):
    # Each fails an attempt first: a history its row cannot tell, written to both tables.
    gone = api.enqueue(producer, max_retries=1).json["id"]
    api.claim(worker)
    api.fail(worker, gone, retry_in_seconds=0)
    api.claim(worker)
    api.complete(worker, gone)
    kept = api.enqueue(producer, max_retries=1).json["id"]
    api.claim(worker)
    api.fail(worker, kept, retry_in_seconds=0)
    clock.advance(3 * 86_400)

    assert runner.invoke(args=["purge", "--older-than", "2d"]).output.strip() == "purged 1 jobs"

    database = app.extensions["queuelog"].db
    with database.read() as conn:
        left = {table.name: sorted(set(conn.execute(select(table.c.job_id)).scalars()))
                for table in (job_attempts, job_events)}
    assert left == {"job_attempts": [kept], "job_events": [kept]}


def test_purge_can_be_limited_to_some_statuses(runner, api, producer, worker, admin, clock):
    _finished_jobs(api, producer, worker, admin, clock)
    clock.advance(3 * 86_400)
    result = runner.invoke(args=["purge", "--older-than", "1d", "--status", "failed",
                                 "--status", "cancelled"])
    assert result.output.strip() == "purged 2 jobs"
    assert _remaining(api, admin) == {"completed", "running", "pending"}


def test_purge_never_touches_pending_or_running_jobs(runner, api, producer, worker, admin,
                                                     clock):
    _finished_jobs(api, producer, worker, admin, clock)
    clock.advance(400 * 86_400)
    runner.invoke(args=["purge", "--older-than", "1d"])
    assert _remaining(api, admin) == {"running", "pending"}
    result = runner.invoke(args=["purge", "--older-than", "1d", "--status", "pending"])
    assert result.exit_code != 0


def test_purge_below_a_day_needs_force(runner, api, producer, admin, clock):
    job_id = api.enqueue(producer).json["id"]
    api.cancel(admin, job_id)
    clock.advance(7200)
    refused = runner.invoke(args=["purge", "--older-than", "1h"])
    assert refused.exit_code != 0 and "--force" in refused.output
    forced = runner.invoke(args=["purge", "--older-than", "1h", "--force"])
    assert forced.output.strip() == "purged 1 jobs"


def test_purge_refuses_a_malformed_duration(runner):
    result = runner.invoke(args=["purge", "--older-than", "soon"])
    assert result.exit_code != 0


def test_alembic_upgrade_head_from_the_checkout_migrates_the_configured_database(tmp_path):
    db = tmp_path / "via-alembic.sqlite3"
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUELOG_")}
    env["QUEUELOG_DATABASE_URL"] = f"sqlite:///{db}"
    checkout = Path(__file__).resolve().parent.parent
    result = subprocess.run([sys.executable, "-m", "alembic", "upgrade", "head"], cwd=checkout,
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    with sqlite3.connect(db) as conn:
        version = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        assert version == (head_revision(),)


def test_version_is_queuelogs_own(tmp_path):
    from importlib.metadata import version

    result = _run(["--version"], tmp_path, {})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"queuelog {version('queuelog')}"
    assert "Flask" not in result.stdout and "Werkzeug" not in result.stdout


def test_help_lists_queuelogs_commands_and_none_of_flasks(tmp_path):
    result = _run(["--help"], tmp_path, {"QUEUELOG_DATABASE_URL":
                                         f"sqlite:///{tmp_path / 'q.sqlite3'}"})
    assert result.returncode == 0, result.stderr
    commands = result.stdout.split("Commands:")[1].split()
    for command in ("db", "keys", "purge", "copy", "backup", "worker"):
        assert command in commands
    for flask_own in ("run", "shell", "routes"):
        assert flask_own not in commands
    for noise in ("--env-file", "dotenv", "--app", "--debug", "development server"):
        assert noise not in result.stdout + result.stderr


def test_flask_app_app_still_runs_queuelogs_commands(tmp_path):
    db = tmp_path / "q.sqlite3"
    flask = Path(sys.executable).with_name("flask")
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUELOG_")}
    env["QUEUELOG_DATABASE_URL"] = f"sqlite:///{db}"
    checkout = Path(__file__).resolve().parent.parent
    result = subprocess.run([str(flask), "--app", "app", "db", "upgrade"], cwd=checkout,
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM alembic_version").fetchone() == (1,)


@pytest.mark.parametrize("shell_types", [None, "email,pdf"])
def test_keys_create_with_an_unknown_type_is_refused_in_every_shell(tmp_path, shell_types):
    db = tmp_path / "q.sqlite3"
    env = {"QUEUELOG_DATABASE_URL": f"sqlite:///{db}"}
    if shell_types is not None:
        env["QUEUELOG_JOB_TYPES"] = shell_types
    assert _run(["db", "upgrade"], tmp_path, env).returncode == 0

    created = _run(["keys", "create", "texter", "--role", "worker", "--types", "sms"],
                   tmp_path, env)

    assert created.returncode == 1
    assert "QUEUELOG_JOB_TYPES" in created.stderr
    assert "Traceback" not in created.stderr
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM api_keys").fetchone() == (0,)
