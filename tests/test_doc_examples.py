"""Every example README.md and docs/*.md mark `<!-- run -->` runs against a real gunicorn,
in the order of its document, and answers what the document shows (tests/doc_examples.py
has the convention and the comparison).

Each document runs on a fresh database of its own, served as `sh scripts/serve.sh` serves it
(job types `email,report`, or the settings of the document's own `serves` block), from a
directory of its own where `.venv` is the tests' environment (so `.venv/bin/queuelog` is the
operator's command, over the document's database). The blocks of a document share one shell:
variables a ```sh block sets (`Q`, `P`, …) are set in the next. A document that makes no keys
of its own gets the three of the README's walk-through (`$P`, `$W`, `$A`: keys `shop`,
`mailer`, `ops`), as its prose says. The address `127.0.0.1:8000` is the document's server;
other loopback ports a document names get free ports of their own.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from app import create_app
from app.core.callers import Role
from tests import doc_examples
from tests.doc_examples import Document, Example
from tests.servers import (
    UNCONFIGURED,
    WORKER_CLASS,
    GunicornServer,
    free_port,
    gunicorn_argv,
    server_environment,
)

pytestmark = pytest.mark.slow

ROOT = doc_examples.ROOT
SERVED_TYPES = "email,report"  # scripts/serve.sh's default
BLOCK_TIMEOUT_SECONDS = 120
STOP_TIMEOUT_SECONDS = 60
# Write the answers a run gives into the documents (doc_examples.write_answers).
UPDATE = os.environ.get("QUEUELOG_DOCS_UPDATE") == "1"
_SETTING = re.compile(r"\b(QUEUELOG_[A-Z_]+)=(\S+)")
_LOOPBACK_PORT = re.compile(r"127\.0\.0\.1:(8\d\d\d)\b")
_SQLITE_URL = re.compile(r"sqlite:///[^\s'\"]+")
# A lease token a command shows, and the job it is sent for (a job's route, or an item's id).
_LEASE_TOKEN = re.compile(r'"lease_token": "[0-9a-f]+\.\d+"')
_JOB_ROUTE = re.compile(r"/jobs/(\d+)/")
_ITEM_TOKEN = re.compile(r'("id": (\d+), "lease_token": )"[0-9a-f]+\.\d+"')
_ROLE_VARIABLES = {"producer": "P", "worker": "W", "admin": "A"}
# API.md's and the README's keys, made for a document that makes none of its own.
_KEYS = {"P": ("shop", Role.PRODUCER), "W": ("mailer", Role.WORKER), "A": ("ops", Role.ADMIN)}


class DocumentRun:
    """One document's examples, in order, over its own database and server."""

    def __init__(self, document: Document, directory: Path, template: str) -> None:
        self.document = document
        self.directory = directory
        self.work = directory / "work"
        self.work.mkdir()
        (self.work / ".venv").symlink_to(sys.prefix)
        database = directory / "queuelog.sqlite3"
        shutil.copyfile(template, database)
        self.db_url = f"sqlite:///{database}"
        self.ports: dict[str, int] = {"8000": free_port()}
        self.server: GunicornServer | None = None
        self.background: list[tuple[Example, subprocess.Popen[bytes], Path]] = []
        self.state = self.work / ".state.sh"
        self.state.write_text("")
        self.last_output = ""  # the last block's, for a failure's message
        self.lease_tokens: dict[int, str] = {}  # by job id, from the claims' answers
        self.updates: dict[int, str] = {}  # answers to write back, by line
        self.environment = {"QUEUELOG_DATABASE_URL": self.db_url,
                            "QUEUELOG_JOB_TYPES": SERVED_TYPES}

    def make_keys(self) -> None:
        """`$Q` and the walk-through's three keys, in the shell of the document's blocks."""
        app = create_app({"DATABASE_URL": self.db_url, "JOB_TYPES": SERVED_TYPES})
        try:
            keys = app.extensions["queuelog"].keys
            tokens = {variable: keys.create_key(name, role)
                      for variable, (name, role) in _KEYS.items()}
        finally:
            app.extensions["queuelog"].db.engine.dispose()
        exports = "".join(f"export {variable}={shlex.quote(token)}\n"
                          for variable, token in tokens.items())
        self.state.write_text(self.localised("export Q=http://127.0.0.1:8000\n") + exports)

    # -- the server -------------------------------------------------------------------------

    def serve(self, settings: dict[str, str]) -> None:
        """(Re)start the document's server with `settings` over its database."""
        if self.server is not None:
            self.server.kill()
        self.environment.update(
            {name: value for name, value in settings.items()
             if name not in ("QUEUELOG_BIND", "QUEUELOG_DATABASE_URL")})
        port = self.ports["8000"]
        self.server = GunicornServer(
            gunicorn_argv(*UNCONFIGURED, "--workers", "1", "--worker-class", WORKER_CLASS,
                          "--threads", "8", "--bind", f"127.0.0.1:{port}"),
            server_environment(self.directory, **self.environment),
            port=port, logs=self.directory)
        self.server.start()
        self.server.wait_until_answering()

    # -- running blocks ---------------------------------------------------------------------

    def localised(self, code: str) -> str:
        """The block with its loopback ports and its SQLite database replaced by the
        document's."""
        def port(match: re.Match[str]) -> str:
            if match[1] not in self.ports:
                self.ports[match[1]] = free_port()
            return f"127.0.0.1:{self.ports[match[1]]}"
        return _SQLITE_URL.sub(self.db_url, _LOOPBACK_PORT.sub(port, code))

    def shell_environment(self) -> dict[str, str]:
        env = {name: value for name, value in os.environ.items()
               if not name.startswith(("QUEUELOG_", "GUNICORN_"))}
        env.update(self.environment,
                   PATH=f"{Path(sys.prefix) / 'bin'}{os.pathsep}{env.get('PATH', '')}",
                   PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "client")]),
                   PYTHONUNBUFFERED="1", TMPDIR=str(self.directory))
        return env

    def with_lease_tokens(self, code: str) -> str:
        """The block with each lease token it shows replaced by the one the job's last claim
        gave here, as a reader pastes theirs."""
        code = _ITEM_TOKEN.sub(lambda match: f'{match[1]}"{self.lease_tokens[int(match[2])]}"'
                               if int(match[2]) in self.lease_tokens else match[0], code)
        route = _JOB_ROUTE.search(code)
        if route is not None and int(route[1]) in self.lease_tokens:
            code = _LEASE_TOKEN.sub(f'"lease_token": "{self.lease_tokens[int(route[1])]}"', code)
        return code

    def learn_lease_tokens(self, output: str) -> None:
        for match in re.finditer(r'"id":\s*(\d+),.*?"lease_token":\s*"([0-9a-f]+\.\d+)"',
                                 output, re.DOTALL):
            self.lease_tokens[int(match[1])] = match[2]

    def shell(self, code: str) -> subprocess.CompletedProcess[str]:
        script = (f"set -a\n. {self.state}\nset -e\n{self.localised(code)}\n"
                  f"export -p > {self.state}\n")
        return _run(["bash", "-c", script], cwd=self.work, env=self.shell_environment())

    def shell_variable(self, name: str) -> str:
        done = self.shell(f'printf %s "${{{name}:-}}"')
        return done.stdout

    def python_environment(self, example: Example) -> dict[str, str]:
        env = self.shell_environment()
        del env["QUEUELOG_DATABASE_URL"]
        env["QUEUELOG_URL"] = f"http://127.0.0.1:{self.ports['8000']}"
        if example.role is not None:
            env["QUEUELOG_TOKEN"] = self.shell_variable(_ROLE_VARIABLES[example.role])
        return env

    def start_background(self, example: Example, argv: list[str], env: dict[str, str]) -> None:
        log = self.directory / f"background-{example.line}.log"
        with log.open("wb") as output:
            process = subprocess.Popen(argv, cwd=self.work, env=env, stdout=output,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        self.background.append((example, process, log))

    def run(self, example: Example) -> str | None:
        """Run the block; what went wrong, if anything."""
        if example.serves:
            self.serve(dict(_SETTING.findall(example.code)))
            return None
        if self.server is None:
            self.serve({})
        if example.language == "sh":
            if example.background:
                self.start_background(example, ["bash", "-c", f"set -a\n. {self.state}\n"
                                                 f"set +a -e\n{self.localised(example.code)}"],
                                      self.shell_environment())
                return None
            done = self.shell(self.with_lease_tokens(example.code))
            self.learn_lease_tokens(done.stdout)
        else:
            name = example.file or f"example_{example.line}.py"
            (self.work / name).write_text(self.localised(example.code))
            if example.file_only:
                return None
            env = self.python_environment(example)
            if example.background:
                self.start_background(example, [sys.executable, name], env)
                return None
            done = _run([sys.executable, name], cwd=self.work, env=env)
        self.last_output = done.stdout
        if done.returncode != 0:
            return (f"{example.where} exited {done.returncode}:\n{done.stdout}\n"
                    f"{done.stderr}{self.server_log()}")
        if example.answer is not None:
            difference = doc_examples.difference(example.answer, done.stdout)
            if difference is not None and UPDATE:
                text = doc_examples.rewritten(example.answer, done.stdout)
                if text is not None:
                    self.updates[example.answer.line] = text
                    return None
            if difference is not None:
                return (f"{example.where}: the answer differs from the one shown at line "
                        f"{example.answer.line}:\n{difference}")
        return None

    def server_log(self) -> str:
        return f"\n-- server log:\n{self.server.log_tail()}" if self.server else ""

    def stop(self) -> list[str]:
        """Stop the background blocks (each must exit 0 on SIGTERM) and the server; what
        went wrong."""
        problems = []
        for example, process, log in self.background:
            if process.poll() is not None:
                problems.append(f"{example.where} ended early ({process.returncode}):\n"
                                f"{log.read_text(errors='replace')}")
                continue
            # The whole group: a shell block's command (gunicorn, say) is the shell's child.
            os.killpg(process.pid, signal.SIGTERM)
            try:
                status = process.wait(timeout=STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                status = None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            # A Python block (a worker) must exit 0 on SIGTERM; a shell ends by the signal.
            stopped = (0,) if example.language == "python" else (0, -signal.SIGTERM)
            if status not in stopped:
                problems.append(f"{example.where} exited {status} on SIGTERM:\n"
                                f"{log.read_text(errors='replace')}")
        if self.server is not None:
            self.server.kill()
        return problems


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a block; one that outruns BLOCK_TIMEOUT_SECONDS is a failed block (status -9)."""
    with subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=BLOCK_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            stderr += f"\n(killed after {BLOCK_TIMEOUT_SECONDS} s)"
        return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def _makes_its_own_keys(document: Document) -> bool:
    return any(example.language == "sh" and "P=$(" in example.code for example in document.run)


RUN_DOCUMENTS = [document for document in doc_examples.all_documents() if document.run]


@pytest.fixture
def document_run(request: pytest.FixtureRequest, tmp_path: Path,
                 sqlite_template: str) -> Iterator[DocumentRun]:
    run = DocumentRun(request.param, tmp_path, sqlite_template)
    try:
        yield run
    finally:
        problems = run.stop()
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("document_run", RUN_DOCUMENTS, indirect=True,
                         ids=[document.path.name for document in RUN_DOCUMENTS])
def test_the_examples_run_in_order_and_answer_what_is_shown(document_run: DocumentRun) -> None:
    document = document_run.document
    if not _makes_its_own_keys(document):
        document_run.make_keys()
    # Every block runs, after a failure too: one run lists every drift of the document.
    failures = [failure for example in document.run
                if (failure := document_run.run(example)) is not None]
    if document_run.updates:
        doc_examples.write_answers(document.path, document_run.updates)
    assert not failures, "\n\n".join(failures)
