"""An operator's mistakes with the database or the address, through the `queuelog` command:
each is one line on stderr saying what is wrong and what to do, a non-zero exit, nothing on
stdout (no table header before it), and no SQLite file made by a typo.

Most mistakes run the command's click entry point in this process (`in_process`): a process
each cost about a second of CPU, to import the app again. What only a process shows is proven
through the installed console script: that it says each kind of mistake exactly as the entry
point does here (test_the_console_script_says_a_mistake_as_the_entry_point_does), and the
mistakes that need a real process (serve, which execs gunicorn; a refused connection)."""

from __future__ import annotations

import logging
import os
import socket
import sqlite3
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner

from app.cli import build_cli
from app.storage.migrations import upgrade
from tests.servers import create_api_key, free_port

QUEUELOG = Path(sys.executable).with_name("queuelog")
POSTGRES = os.environ.get("QUEUELOG_TEST_POSTGRES_URL")

pytestmark = pytest.mark.skipif(not QUEUELOG.exists(),
                                reason="needs queuelog installed in this venv (scripts/test.sh)")


def run(args: list[str], cwd: Path, **env_extra: str) -> subprocess.CompletedProcess[str]:
    """The installed `queuelog` console script, in a process of its own."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("QUEUELOG_", "GUNICORN_")) and k != "PYTHONPATH"}
    env.update(env_extra)
    return subprocess.run([str(QUEUELOG), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> Run:
    """`run`, but through the command's click entry point in this process (what main() runs:
    build_cli().main(prog_name="queuelog")), with the same environment and directory. Its
    stderr also holds what a process of its own would have printed there and this one keeps
    elsewhere: the warnings Python shows by default, the records logged at WARNING or above
    (pytest's log capture holds them here), and the traceback of an exception that escaped."""

    def run_here(args: list[str], cwd: Path, **env_extra: str) -> subprocess.CompletedProcess[str]:
        monkeypatch.chdir(cwd)
        env: dict[str, str | None] = {k: None for k in os.environ
                                      if k.startswith(("QUEUELOG_", "GUNICORN_"))}
        env.update(env_extra)
        caplog.clear()
        with warnings.catch_warnings(record=True) as shown:
            # Python's default filters, as a fresh process has them.
            warnings.resetwarnings()
            for category in (ResourceWarning, ImportWarning, PendingDeprecationWarning,
                             DeprecationWarning):
                warnings.simplefilter("ignore", category)
            result = CliRunner().invoke(build_cli(), args, env=env, prog_name="queuelog")
        stderr = result.stderr
        stderr += "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno)
                          for w in shown)
        stderr += "".join(f"{record.getMessage()}\n" for record in caplog.records
                          if record.levelno >= logging.WARNING)
        if result.exc_info is not None and not isinstance(result.exc_info[1], SystemExit):
            stderr += "".join(traceback.format_exception(*result.exc_info))
        return subprocess.CompletedProcess([str(QUEUELOG), *args], result.exit_code,
                                           result.stdout, stderr)

    return run_here


def assert_one_line_mistake(result: subprocess.CompletedProcess[str], *phrases: str) -> None:
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for phrase in phrases:
        assert phrase in lines[0], lines[0]


def _postgres_with(**parts: str) -> str:
    from sqlalchemy.engine import make_url

    assert POSTGRES is not None
    return make_url(POSTGRES).set(**parts).render_as_string(hide_password=False)  # type: ignore[arg-type]


MISTAKES = [
    ("sqlite-missing-directory", lambda d: f"sqlite:///{d / 'nowhere' / 'q.sqlite3'}",
     ["no SQLite database at", "queuelog db upgrade"]),
    ("sqlite-mistyped-file", lambda d: f"sqlite:///{d / 'typo.sqlite3'}",
     ["no SQLite database at", "typo.sqlite3"]),
    ("not-a-url", lambda d: "notaurl", ["is not a database URL", "postgresql+psycopg://"]),
    ("mysql", lambda d: "mysql://user@host/db", ["mysql:// is not supported", "SQLite"]),
    ("postgres-scheme", lambda d: "postgres://user@host/db",
     ["postgres://", "postgresql+psycopg://"]),
    ("postgresql-without-driver", lambda d: "postgresql://user@host/db",
     ["postgresql+psycopg://"]),
]


@pytest.mark.parametrize("command", [["keys", "list"], ["types", "list"],
                                     ["schedules", "list"]])
@pytest.mark.parametrize(("name", "url", "phrases"), MISTAKES, ids=[m[0] for m in MISTAKES])
def test_a_database_url_mistake_is_one_line(tmp_path, in_process, command, name, url,
                                            phrases) -> None:
    result = in_process(command, tmp_path, QUEUELOG_DATABASE_URL=url(tmp_path),
                        QUEUELOG_JOB_TYPES="e")
    assert_one_line_mistake(result, *phrases)
    assert list(tmp_path.iterdir()) == []  # no file created by the mistake


@pytest.mark.parametrize(("name", "url", "phrases"),
                         [m for m in MISTAKES if not m[0].startswith("sqlite")],
                         ids=[m[0] for m in MISTAKES if not m[0].startswith("sqlite")])
def test_help_with_a_database_url_mistake_says_it_in_one_line(tmp_path, in_process, name, url,
                                                              phrases) -> None:
    result = in_process(["--help"], tmp_path, QUEUELOG_DATABASE_URL=url(tmp_path))
    assert result.returncode == 0
    assert "Usage: queuelog" in result.stdout and "worker" in result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for phrase in phrases:
        assert phrase in lines[0], lines[0]


@pytest.mark.parametrize(("args", "phrases"), [
    (["keys", "create", "shop", "--role", "nope"],
     ["queuelog keys create: ", "'nope' is not one of", "--help"]),
    (["keys", "create"], ["queuelog keys create: ", "Missing argument 'NAME'", "--help"]),
    (["nosuch"], ["queuelog: ", "No such command 'nosuch'", "queuelog --help"]),
    (["types", "set", "email", "--max-running", "many"],
     ["queuelog types set: ", "'many'", "--help"]),
], ids=["bad-choice", "missing-argument", "unknown-command", "not-a-number"])
def test_a_command_line_mistake_is_one_line_with_exit_2(tmp_path, in_process, args,
                                                        phrases) -> None:
    # click's own answer is the usage block, a hint and the error: one line says it all.
    result = in_process(args, tmp_path, QUEUELOG_DATABASE_URL=f"sqlite:///{tmp_path / 'q.sqlite3'}")
    assert result.returncode == 2
    assert_one_line_mistake(result, *phrases)


def test_a_database_never_migrated_is_one_line(tmp_path, in_process) -> None:
    database = tmp_path / "other.sqlite3"
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE unrelated (id INTEGER)")
    result = in_process(["keys", "list"], tmp_path, QUEUELOG_DATABASE_URL=f"sqlite:///{database}")
    assert_one_line_mistake(result, "has no queuelog tables", "queuelog db upgrade")


def test_db_upgrade_into_a_missing_directory_is_one_line_and_creates_nothing(
        tmp_path, in_process) -> None:
    database = tmp_path / "nowhere" / "q.sqlite3"
    result = in_process(["db", "upgrade"], tmp_path, QUEUELOG_DATABASE_URL=f"sqlite:///{database}")
    assert_one_line_mistake(result, "directory does not exist")
    assert not database.parent.exists()


def test_db_upgrade_to_an_unknown_revision_is_one_line_and_creates_nothing(tmp_path) -> None:
    database = tmp_path / "q.sqlite3"
    result = run(["db", "upgrade", "9999"], tmp_path,
                 QUEUELOG_DATABASE_URL=f"sqlite:///{database}")
    assert result.returncode != 0 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "Error: cannot upgrade to '9999': Can't locate revision identified by '9999'; give "
        "`head` (the default) or a revision id from alembic/versions"]
    assert not database.exists()


@pytest.mark.skipif(POSTGRES is None, reason="QUEUELOG_TEST_POSTGRES_URL names no server")
def test_postgresql_refusing_the_connection_is_one_line(tmp_path) -> None:
    closed = free_port()  # nobody listens there
    result = run(["keys", "list"], tmp_path,
                 QUEUELOG_DATABASE_URL=_postgres_with(host="127.0.0.1", port=str(closed)))
    assert_one_line_mistake(result, f"cannot use PostgreSQL at 127.0.0.1:{closed}",
                            "Connection refused", "QUEUELOG_DATABASE_URL")


@pytest.mark.skipif(POSTGRES is None, reason="QUEUELOG_TEST_POSTGRES_URL names no server")
def test_a_missing_postgresql_database_is_one_line(tmp_path) -> None:
    result = run(["types", "list"], tmp_path,
                 QUEUELOG_DATABASE_URL=_postgres_with(database="queuelog_no_such_database"))
    assert_one_line_mistake(result, 'database "queuelog_no_such_database" does not exist')


def test_serve_refuses_a_database_not_there(tmp_path) -> None:
    result = run(["serve"], tmp_path, QUEUELOG_DATABASE_URL=f"sqlite:///{tmp_path / 'q.sqlite3'}",
                 QUEUELOG_BIND=f"127.0.0.1:{free_port()}")
    assert_one_line_mistake(result, "no SQLite database at", "queuelog db upgrade")
    assert not (tmp_path / "q.sqlite3").exists()


def _migrated(tmp_path: Path) -> dict[str, str]:
    """A migrated SQLite database, made directly (`queuelog db upgrade` is tested in
    tests/test_cli.py), and the settings that name it."""
    env = {"QUEUELOG_DATABASE_URL": f"sqlite:///{tmp_path / 'q.sqlite3'}",
           "QUEUELOG_JOB_TYPES": "email"}
    upgrade(env["QUEUELOG_DATABASE_URL"])
    return env


def test_serve_on_a_port_in_use_names_the_address_and_queuelog_bind(tmp_path) -> None:
    env = _migrated(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run(["serve"], tmp_path, QUEUELOG_BIND=f"127.0.0.1:{port}", **env)
    assert_one_line_mistake(result, f"cannot listen on 127.0.0.1:{port}",
                            "Address already in use", "QUEUELOG_BIND")


def _serve(cwd: Path, environ: dict[str, str]) -> subprocess.Popen[str]:
    """`queuelog serve` started as a user would, one worker of two threads."""
    return subprocess.Popen([str(QUEUELOG), "serve", "--threads", "2"], cwd=cwd, env=environ,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _first_answer(server: subprocess.Popen[str], url: str, **headers: str) -> requests.Response:
    """The first answer of a server still booting (not listening, or no worker yet)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return requests.get(url, timeout=5, headers=headers)
        except requests.RequestException:
            assert server.poll() is None, server.stderr.read() if server.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.2)


@pytest.mark.slow
def test_serve_runs_the_installed_app_under_the_shipped_settings_from_any_directory(
        tmp_path) -> None:
    env = _migrated(tmp_path)
    port = free_port()
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("QUEUELOG_", "GUNICORN_")) and k != "PYTHONPATH"}
    environ.update(env, QUEUELOG_BIND=f"127.0.0.1:{port}", GUNICORN_WORKERS="1",
                   TMPDIR=str(tmp_path))
    server = _serve(tmp_path, environ)
    try:
        answer = _first_answer(server, f"http://127.0.0.1:{port}/healthz")
        assert answer.json() == {"status": "ok"}
        # The listening process is gunicorn itself (queuelog serve exec'd it), under the
        # settings inside the installed package.
        command_line = Path(f"/proc/{server.pid}/cmdline").read_bytes().split(b"\0")
        assert b"gunicorn" in command_line
        conf = command_line[command_line.index(b"-c") + 1].decode()
        assert conf.endswith("queuelog_gunicorn/conf.py") and "site-packages" in conf
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=60)
    assert stderr.splitlines()[0] == (f"queuelog: serving sqlite:///{tmp_path / 'q.sqlite3'} "
                                      f"on 127.0.0.1:{port}")
    assert server.returncode == 0


@pytest.mark.slow
def test_serve_from_a_checkout_serves_the_default_database_it_names(tmp_path) -> None:
    """With no QUEUELOG_DATABASE_URL, `queuelog serve` run inside a checkout (where gunicorn's
    working directory puts the checkout's `app` first, whose default instance folder differs)
    serves the installed default database it names: the key made there signs in."""
    from tests.servers import REPO_ROOT

    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("QUEUELOG_", "GUNICORN_")) and k != "PYTHONPATH"}
    environ.update(QUEUELOG_JOB_TYPES="email", TMPDIR=str(tmp_path))
    default = Path(sys.prefix) / "var" / "app-instance" / "queuelog.sqlite3"
    existed = default.exists()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(QUEUELOG), *args], cwd=REPO_ROOT, env=environ,
                              capture_output=True, text=True, timeout=120, check=True)

    cli("db", "upgrade")
    token = cli("keys", "create", f"serve-check-{os.getpid()}", "--role", "admin"
                ).stdout.splitlines()[-1]
    port = free_port()
    environ.update(QUEUELOG_BIND=f"127.0.0.1:{port}", GUNICORN_WORKERS="1")
    server = _serve(REPO_ROOT, environ)
    try:
        answer = _first_answer(server, f"http://127.0.0.1:{port}/types",
                               Authorization=f"Bearer {token}")
        assert answer.status_code == 200, answer.text
        assert [t["type"] for t in answer.json()["types"]] == ["email"]
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=60)
        if not existed:
            for leftover in default.parent.glob("queuelog.sqlite3*"):
                leftover.unlink()
    assert stderr.splitlines()[0].startswith(f"queuelog: serving sqlite:///{default} ")


@pytest.fixture(scope="module")
def keys_database(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A migrated SQLite database holding a producer key (billing) and a worker key
    (renderer); the mistakes below change nothing in it."""
    url = f"sqlite:///{tmp_path_factory.mktemp('keys') / 'q.sqlite3'}"
    upgrade(url)
    for name, role in (("billing", "producer"), ("renderer", "worker")):
        create_api_key(url, name, role)
    return {"QUEUELOG_DATABASE_URL": url, "QUEUELOG_JOB_TYPES": "email"}


CHECK_URL = "https://shop.example/queuelog/check"
ORIGINS = {"QUEUELOG_CHECK_URL_ORIGINS": "https://shop.example/queuelog/"}
CHECK_KEY_MISTAKES = [
    ("unknown-key", ["check-secret", "nobody"], {}, ["no key named 'nobody'"]),
    ("not-a-producer", ["set-check-url", "renderer", "--clear"], {},
     ["'renderer' has the role worker", "only a producer key"]),
    ("refused-url", ["create", "shop", "--role", "producer", "--check-url",
                     "https://shop.example.evil/queuelog/check"], ORIGINS,
     ["The check url is refused", "QUEUELOG_CHECK_URL_ORIGINS"]),
    ("no-check-url-origins", ["set-check-url", "billing", CHECK_URL], {},
     ["The check url is refused", "QUEUELOG_CHECK_URL_ORIGINS is not set"]),
    ("malformed-check-url-origins", ["check-secret", "billing"],
     {"QUEUELOG_CHECK_URL_ORIGINS": "shop.example"},
     ["QUEUELOG_CHECK_URL_ORIGINS", "is not a url prefix"]),
]


@pytest.mark.parametrize(("name", "args", "env_extra", "phrases"), CHECK_KEY_MISTAKES,
                         ids=[m[0] for m in CHECK_KEY_MISTAKES])
def test_a_check_url_or_check_secret_mistake_is_one_line(tmp_path, in_process, keys_database,
                                                         name, args, env_extra,
                                                         phrases) -> None:
    result = in_process(["keys", *args], tmp_path, **keys_database, **env_extra)
    assert_one_line_mistake(result, *phrases)
    assert "qlchk_" not in result.stderr


# One mistake of each kind above, through the installed console script in a process of its own:
# it says exactly what the entry point says in this process (so what the tests above prove of
# the one holds of the other), and nothing more.
@pytest.mark.parametrize(("args", "url", "env_extra"), [
    (["types", "list"], lambda d: f"sqlite:///{d / 'typo.sqlite3'}", {}),
    (["--help"], lambda d: "postgres://user@host/db", {}),
    (["keys", "create", "shop", "--role", "nope"], lambda d: f"sqlite:///{d / 'q.sqlite3'}", {}),
    (["keys", "check-secret", "billing"], None,
     {"QUEUELOG_CHECK_URL_ORIGINS": "shop.example"}),
], ids=["database-url", "help-with-a-database-url", "command-line", "check-url-origins"])
def test_the_console_script_says_a_mistake_as_the_entry_point_does(
        tmp_path, in_process, keys_database, args, url, env_extra) -> None:
    env = {**keys_database, **env_extra} if url is None else {
        "QUEUELOG_DATABASE_URL": url(tmp_path), "QUEUELOG_JOB_TYPES": "e", **env_extra}

    real = run(args, tmp_path, **env)
    here = in_process(args, tmp_path, **env)

    assert (real.returncode, real.stdout, real.stderr) == (here.returncode, here.stdout,
                                                           here.stderr)
    assert real.returncode != 0 or args == ["--help"]
    assert len(real.stderr.strip().splitlines()) == 1, real.stderr
    assert list(tmp_path.iterdir()) == []
