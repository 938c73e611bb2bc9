"""The client is a distribution of its own (client/): installed alone it brings no server
dependency, and it is released in step with the server, which pins it."""

from __future__ import annotations

import configparser
import importlib.metadata
import os
import subprocess
import tomllib
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import queuelog_client
import queuelog_client._version
from tests.client.conftest import ROOT

CLIENT = ROOT / "client"
SERVER_ONLY = ("flask", "sqlalchemy", "psycopg", "marshmallow", "alembic", "gunicorn")


def _server_metadata() -> configparser.ConfigParser:
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    return setup


def _client_pin(requirements: list[str]) -> Requirement:
    return next(r for r in map(Requirement, requirements) if r.name == "queuelog-client")


def test_the_client_version_has_one_home_which_the_build_reads() -> None:
    project = tomllib.loads((CLIENT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "queuelog_client._version.__version__"}
    assert queuelog_client.__version__ == queuelog_client._version.__version__
    assert Version(queuelog_client.__version__)  # a version pip understands


def test_the_server_and_the_client_share_one_version_and_the_server_pins_it() -> None:
    setup = _server_metadata()
    server_version = setup["metadata"]["version"]
    client_version = queuelog_client.__version__
    pin = _client_pin(setup["options"]["install_requires"].split("\n")[1:])
    assert client_version == server_version
    assert str(pin.specifier) == f"=={server_version}"


def test_the_installed_server_requires_the_installed_client_and_does_not_ship_it() -> None:
    pin = _client_pin(importlib.metadata.requires("queuelog") or [])
    assert importlib.metadata.version("queuelog-client") in pin.specifier
    shipped = importlib.metadata.files("queuelog") or []
    assert not [f for f in shipped if f.parts[0] == "queuelog_client"]


@pytest.mark.slow
def test_the_client_installed_alone_runs_the_worker_without_server_dependencies(
        tmp_path: Path) -> None:
    environment = tmp_path / "venv"
    venv.create(environment, with_pip=True)
    python = str(environment / "bin" / "python")
    # Not the test's environment: nothing of the checkout or of .venv-test may leak in.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("QUEUELOG_")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([python, *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)

    installed = run("-m", "pip", "install", "--quiet", str(CLIENT))
    assert installed.returncode == 0, installed.stderr

    probe = run("-c", "import importlib.metadata, importlib.util, queuelog_client; "
                      "print(queuelog_client.__file__); "
                      f"print([m for m in {SERVER_ONLY!r} if importlib.util.find_spec(m)]); "
                      "print(queuelog_client.__version__, "
                      "importlib.metadata.version('queuelog-client'))")
    assert probe.returncode == 0, probe.stderr
    client_file, missing_server_modules, versions = probe.stdout.splitlines()
    assert Path(client_file).is_relative_to(environment)
    assert missing_server_modules == "[]"
    assert versions == f"{queuelog_client.__version__} {queuelog_client.__version__}"
    listed = run("-m", "pip", "list", "--format=freeze")
    names = {line.split("==")[0].lower() for line in listed.stdout.splitlines()}
    assert "queuelog-client" in names and "queuelog" not in names

    runner = run("-m", "queuelog_client", "worker", "--help")
    assert runner.returncode == 0, runner.stderr
    assert "--handler" in runner.stdout
