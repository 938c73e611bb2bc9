"""How the client is imported and the runner started: no server dependency, three entry
points, and a token that never travels on the command line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from queuelog_client.cli import main
from tests.client.conftest import ROOT, _child_env


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=_child_env(**env))


def test_importing_the_client_loads_neither_flask_nor_sqlalchemy():
    probe = _run("-c", "import sys, queuelog_client, queuelog_client.cli; "
                       "print(sorted(m for m in ('flask', 'sqlalchemy', 'click', 'werkzeug') "
                       "if m in sys.modules))")
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "[]"


@pytest.mark.parametrize("entry", [
    ["-c", "from app.cli import main; main()", "worker"],
    ["-m", "queuelog_client", "worker"],
])
def test_the_runner_command_answers_help_without_a_database(entry, tmp_path):
    # An unusable database URL: `queuelog worker` must not build the app to run.
    answer = _run(*entry, "--help", QUEUELOG_DATABASE_URL="postgresql+psycopg://nobody@/none")
    assert answer.returncode == 0, answer.stderr
    assert "--handler" in answer.stdout and "--concurrency" in answer.stdout


def test_the_flask_cli_lists_the_worker_command_too(tmp_path):
    answer = _run("-m", "flask", "--app", "app", "worker", "--help",
                  QUEUELOG_DATABASE_URL=f"sqlite:///{tmp_path / 'q.sqlite3'}")
    assert answer.returncode == 0, answer.stderr
    assert "--handler" in answer.stdout


def test_a_token_on_the_command_line_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--url", "http://127.0.0.1:9", "--handler", "tests.client.handlers:succeed",
              "--token", "s3cret"])
    assert exit_.value.code == 2
    assert "QUEUELOG_TOKEN" in capsys.readouterr().err


def test_without_a_token_the_runner_says_where_to_put_one(monkeypatch, capsys):
    monkeypatch.delenv("QUEUELOG_TOKEN", raising=False)
    with pytest.raises(SystemExit):
        main(["--url", "http://127.0.0.1:9", "--handler", "tests.client.handlers:succeed"])
    assert "--token-file" in capsys.readouterr().err


def test_the_token_file_is_read_and_an_unknown_handler_is_reported(tmp_path, capsys):
    token_file = tmp_path / "token"
    token_file.write_text("from-a-file\n")
    with pytest.raises(SystemExit) as exit_:
        main(["--url", "http://127.0.0.1:9", "--token-file", str(token_file),
              "--handler", "tests.client.handlers:no_such_handler"])
    assert exit_.value.code == 2
    assert "no_such_handler" in capsys.readouterr().err
