"""`queuelog serve`'s command line, run from this checkout as a user runs it: --port/--host/
--bind choose the address it says and listens on (over QUEUELOG_BIND), a mistake among its
arguments is one line and exit 2 before anything starts, and the configuration's warnings
are said once, not once per gunicorn worker."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from app.cli import serve
from queuelog_gunicorn.binding import address_of
from tests.servers import GunicornServer, free_port, server_environment

APP = [sys.executable, "-m", "app"]


def _run(args: list[str], directory: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*APP, *args], cwd=directory, capture_output=True, text=True,
                          timeout=120, env=server_environment(directory, **settings))


def _migrated(directory: Path) -> dict[str, str]:
    settings = {"QUEUELOG_DATABASE_URL": f"sqlite:///{directory / 'q.sqlite3'}"}
    done = _run(["db", "upgrade"], directory, **settings)
    assert done.returncode == 0, done.stderr
    return settings


@pytest.mark.parametrize(("args", "said"), [
    (["--workers", "two"], "argument -w/--workers: invalid int value: 'two'"),
    (["myapp:app"], "unexpected argument: myapp:app"),
    (["--port", "0"], "'--port': 0 is not in the range"),
    (["--port"], "'--port' requires an argument"),
    (["--port", "18107", "--bind", "127.0.0.1:18108"], "give --bind, or --host and --port"),
])
def test_a_mistake_among_the_arguments_is_one_line_and_exit_2(args: list[str],
                                                                 said: str) -> None:
    done = CliRunner().invoke(serve, args)
    assert done.exit_code == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("Error: queuelog serve: ") and said in lines[0], lines[0]


def test_an_unknown_option_is_one_line_and_exit_2_before_anything_starts(
        tmp_path: Path) -> None:
    database = tmp_path / "q.sqlite3"
    done = _run(["serve", "--prt", "18107"], tmp_path,
                QUEUELOG_DATABASE_URL=f"sqlite:///{database}",
                QUEUELOG_BIND=f"127.0.0.1:{free_port()}")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "Error: queuelog serve: unrecognized arguments: --prt 18107; its own options are "
        "--host, --port, --bind and --database (queuelog serve --help), the others "
        "gunicorn's (gunicorn --help)"]
    # Said before anything else: not the database missing, nor "serving … on".
    assert not database.exists()


@pytest.mark.parametrize(("host", "port", "configured", "address"), [
    (None, 9000, ["0.0.0.0:8000"], "0.0.0.0:9000"),
    ("0.0.0.0", None, ["127.0.0.1:8123", "127.0.0.1:8124"], "0.0.0.0:8123"),  # noqa: S104 (not bound)
    ("::1", None, [], "[::1]:8000"),
    ("[::1]", 9000, ["unix:/run/queuelog.sock"], "[::1]:9000"),
    (None, 9000, ["unix:/run/queuelog.sock"], "127.0.0.1:9000"),
])
def test_host_or_port_alone_takes_the_rest_from_the_configured_address(
        host: str | None, port: int | None, configured: list[str], address: str) -> None:
    assert address_of(host, port, configured) == address


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_port_wins_over_queuelog_bind_and_is_the_address_said_and_served(
        tmp_path: Path) -> None:
    settings = _migrated(tmp_path)
    port, configured = free_port(), free_port()
    server = GunicornServer(
        [*APP, "serve", "--port", str(port)],
        server_environment(tmp_path, **settings, QUEUELOG_BIND=f"127.0.0.1:{configured}",
                           QUEUELOG_JOB_TYPES="email", GUNICORN_WORKERS="1"),
        port=port, logs=tmp_path, cwd=tmp_path)
    with server:
        server.start().wait_until_answering("/readyz")
        assert not _listening(configured)
        assert server.stop() == 0
    first = server.stderr().splitlines()[0]
    assert first == f"queuelog: serving {settings['QUEUELOG_DATABASE_URL']} on 127.0.0.1:{port}"


@pytest.mark.slow
def test_host_and_port_make_one_address_and_the_job_types_warning_is_said_once(
        tmp_path: Path) -> None:
    settings = _migrated(tmp_path)
    port = free_port()
    server = GunicornServer(
        [*APP, "serve", "--host", "127.0.0.1", "--port", str(port), "--workers", "2"],
        server_environment(tmp_path, **settings), port=port, logs=tmp_path, cwd=tmp_path)
    with server:
        server.start().wait_until_answering("/readyz")
        # Stopped gracefully, both workers have loaded the app (where they would warn).
        assert server.stop() == 0
    stderr = server.stderr()
    assert stderr.count("Booting worker") == 2, stderr
    warned = [line for line in stderr.splitlines() if "QUEUELOG_JOB_TYPES is not set" in line]
    assert len(warned) == 1, stderr
    assert warned[0].startswith("queuelog: warning: ")
    assert "QUEUELOG_JOB_TYPES=email,report" in warned[0]
    assert stderr.splitlines()[0].endswith(f" on 127.0.0.1:{port}")

