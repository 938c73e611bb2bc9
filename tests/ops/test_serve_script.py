"""scripts/serve.sh, run as the README says: `queuelog serve` and the shipped gunicorn settings
(queuelog_gunicorn/conf.py) alone decide the addresses it
listens on, and the project is installed only when the venv is new or its metadata changed
(so a later start needs no package index)."""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

import pytest
import requests

from tests.servers import REPO_ROOT, GunicornServer, free_port, server_environment

pytestmark = pytest.mark.slow

SHIMS = {
    # The venv's python, except that a pip run is only recorded: the test needs no index,
    # and must not install anything into the environment it runs in.
    "python": '[ "$1 $2" = "-m pip" ] && { echo "$*" >> "$PIP_CALLS"; exit 0; }\n'
              'exec "$TEST_PYTHON" "$@"\n',
    "queuelog": 'exec "$TEST_PYTHON" -c "from app.cli import main; main()" "$@"\n',
    "gunicorn": 'exec "$TEST_PYTHON" -m gunicorn "$@"\n',
}


def checkout_with_venv(directory: Path) -> Path:
    """The files serve.sh reads, beside a .venv whose commands run this checkout's code."""
    for name in ("scripts/serve.sh", "setup.cfg", "setup.py", "pyproject.toml"):
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO_ROOT / name, directory / name)
    bin_dir = directory / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, body in SHIMS.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(stat.S_IRWXU)
    return directory


def answers(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).ok
    except requests.RequestException:
        return False


def serve(checkout: Path, tmp_path: Path, ports: tuple[int, int], run: int) -> GunicornServer:
    env = server_environment(
        tmp_path, TEST_PYTHON=sys.executable, PIP_CALLS=str(tmp_path / "pip-calls"),
        QUEUELOG_DATABASE_URL=f"sqlite:///{tmp_path / 'served.sqlite3'}",
        QUEUELOG_BIND=",".join(f"127.0.0.1:{port}" for port in ports))
    logs = tmp_path / f"run-{run}"
    logs.mkdir()
    return GunicornServer(["sh", str(checkout / "scripts" / "serve.sh")], env, port=ports[0],
                          logs=logs).start()


def test_serve_sh_listens_where_queuelog_bind_says_and_installs_only_when_needed(
        tmp_path: Path) -> None:
    checkout = checkout_with_venv(tmp_path / "checkout")
    pip_calls = tmp_path / "pip-calls"
    for run, expect_install in enumerate((True, False)):
        ports = (free_port(), free_port())
        server = serve(checkout, tmp_path, ports, run)
        try:
            for port in ports:
                server.wait_for(lambda port=port: answers(port), f"/healthz on port {port}")
        finally:
            server.kill()
        calls = pip_calls.read_text().splitlines() if pip_calls.exists() else []
        assert any("install" in call and "-e ." in call for call in calls) is expect_install
        pip_calls.unlink(missing_ok=True)

    # A change of the project's metadata installs again.
    with open(checkout / "setup.cfg", "a") as setup_cfg:
        setup_cfg.write(os.linesep)
    server = serve(checkout, tmp_path, (free_port(), free_port()), 2)
    try:
        server.wait_until_answering("/healthz")
    finally:
        server.kill()
    assert "-e ." in pip_calls.read_text()
