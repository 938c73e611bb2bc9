"""The client is a distribution of its own (client/): installed alone it brings no server
dependency. The server's distribution carries the same package at the same version (setup.py),
so that `pip install .` needs nothing from an index and `queuelog worker` runs after it."""

from __future__ import annotations

import configparser
import email.parser
import importlib.metadata
import os
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

import queuelog_client
import queuelog_client._version
from tests.client.conftest import ROOT

CLIENT = ROOT / "client"
SERVER_ONLY = ("flask", "sqlalchemy", "psycopg", "marshmallow", "alembic", "gunicorn")
CLIENT_MODULES = sorted(f"queuelog_client/{path.name}"
                        for path in (CLIENT / "queuelog_client").glob("*.py"))


def _server_metadata() -> configparser.ConfigParser:
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    return setup


def test_the_client_version_has_one_home_which_the_build_reads() -> None:
    project = tomllib.loads((CLIENT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "queuelog_client._version.__version__"}
    assert queuelog_client.__version__ == queuelog_client._version.__version__
    assert Version(queuelog_client.__version__)  # a version pip understands


def test_the_server_and_the_client_share_one_version_and_the_server_needs_no_client_dist(
        ) -> None:
    setup = _server_metadata()
    server_version = setup["metadata"]["version"]
    client_version = queuelog_client.__version__
    assert client_version == server_version
    assert "queuelog-client" not in setup["options"]["install_requires"]


@pytest.mark.skipif(not Path(sys.executable).with_name("queuelog").exists(),
                    reason="needs queuelog installed in this venv (scripts/test.sh)")
def test_the_installed_server_ships_the_client_package() -> None:
    # The installed distribution's record, not the checkout's queuelog.egg-info (the current
    # directory is on sys.path too).
    (installed,) = importlib.metadata.distributions(
        name="queuelog", path=[sysconfig.get_paths()["purelib"]])
    shipped = {str(f) for f in installed.files or []}
    assert set(CLIENT_MODULES) <= shipped
    assert not [r for r in installed.requires or [] if r.startswith("queuelog-client")]


@pytest.fixture(scope="module")
def server_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.ops.podman import copy_checkout

    checkout, wheels = tmp_path_factory.mktemp("checkout"), tmp_path_factory.mktemp("wheels")
    copy_checkout(checkout)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir",
         str(wheels), str(checkout)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("queuelog-*.whl")
    return wheel


@pytest.mark.slow
def test_the_server_wheel_carries_the_client_the_serving_files_and_no_client_requirement(
        server_wheel: Path) -> None:
    with zipfile.ZipFile(server_wheel) as archive:
        names = set(archive.namelist())
        (metadata_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = email.parser.Parser().parsestr(archive.read(metadata_name).decode())
        entry_points = archive.read(metadata_name.replace("METADATA", "entry_points.txt"))
        for module in CLIENT_MODULES:  # the checkout's client, byte for byte
            assert archive.read(module) == (ROOT / "client" / module).read_bytes()
    assert set(CLIENT_MODULES) <= names
    # What `queuelog serve` runs: the settings, the WSGI module, the worker class.
    assert {"queuelog_gunicorn/conf.py", "queuelog_gunicorn/binding.py",
            "queuelog_gunicorn/worker.py", "app/wsgi.py", "app/cli/entry.py"} <= names
    assert any(n.endswith("data/data/share/queuelog/alembic.ini") for n in names)
    # Every package of the checkout's app is in it (setup.py finds them; none left out).
    packages = {str(p.parent.relative_to(ROOT)) for p in (ROOT / "app").rglob("__init__.py")}
    assert {f"{package}/__init__.py" for package in packages} <= names
    # Nothing top-level but the three packages (no tests, bench, wsgi.py or client/ folder).
    assert {n.split("/")[0] for n in names if "/" in n and ".dist-info" not in n
            and ".data" not in n} == {"app", "queuelog_gunicorn", "queuelog_client"}
    requirements = metadata.get_all("Requires-Dist") or []
    assert not [r for r in requirements if r.startswith("queuelog-client")]
    assert b"queuelog = app.cli:main" in entry_points


def test_the_installed_queuelog_gunicorn_and_client_import_nothing_of_the_app() -> None:
    # What a service or gunicorn's master loads needs no `app` beside it (the server's own
    # top-level package, which could clash with a service's): importing them pulls none in.
    probe = ("import sys, queuelog_client.worker, queuelog_client.cli, "
             "queuelog_gunicorn.worker, queuelog_gunicorn.binding, queuelog_gunicorn.dispatch, "
             "queuelog_gunicorn.multiprocess; "
             "print(sorted(m for m in sys.modules if m == 'app' or m.startswith('app.')))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            cwd=ROOT, timeout=60,
                            env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{CLIENT}"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


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
