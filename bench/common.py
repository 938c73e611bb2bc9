"""What every benchmark shares: servers, databases, keys, the load generator, statistics,
machine notes and the report each script prints (and hands to run_all.py).

Every figure is measured beside its baseline in the same run, and repeated: the machine is
shared with other test runs, so an absolute figure says little and a ratio from one run says
more. Load only ever goes to loopback addresses, in loops bounded in count and time.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import multiprocessing
import os
import platform
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The editable install in the shared venv points at another checkout; these scripts measure
# the code of the tree they live in.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

JOB_TYPES = "email,report"
LOOPBACK = "127.0.0.1"
# Variables of the caller's shell that would change what a server does.
_SCRUBBED_PREFIXES = ("QUEUELOG_", "GUNICORN_", "PROMETHEUS_MULTIPROC_DIR", "PORT")


# -- options and reports ---------------------------------------------------------------------

def parse_options(description: str, argv: Sequence[str] | None = None,
                  default_repeats: int = 3) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--smoke", action="store_true",
                        help="a few hundred jobs, one repeat: checks the script still runs")
    parser.add_argument("--repeats", type=int, default=None,
                        help=f"times each figure is measured (default {default_repeats}, "
                             "1 with --smoke)")
    parser.add_argument("--report", type=Path, default=None,
                        help="also write the report as JSON here (run_all.py reads it)")
    options = parser.parse_args(argv)
    if options.repeats is None:
        options.repeats = 1 if options.smoke else default_repeats
    if options.repeats < 1:
        parser.error("--repeats must be at least 1")
    return options


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)

    def add(self, *cells: Any) -> None:
        self.rows.append([str(cell) for cell in cells])

    def markdown(self) -> str:
        lines = [f"**{self.title}**", "", "| " + " | ".join(self.columns) + " |",
                 "|" + "|".join("---" for _ in self.columns) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join(lines)

    def text(self) -> str:
        widths = [max(len(column), *(len(row[i]) for row in self.rows))
                  for i, column in enumerate(self.columns)]
        def line(cells: Sequence[str]) -> str:
            return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True))
        out = [self.title, line(self.columns), line(["-" * w for w in widths])]
        out += [line(row) for row in self.rows]
        return "\n".join(out)


@dataclass
class Target:
    name: str
    goal: str
    measured: str
    met: bool

    @property
    def verdict(self) -> str:
        return "met" if self.met else "NOT met"


@dataclass
class Report:
    """One script's section of RESULTS.md: what it measured, how, and against which goals."""

    title: str
    command: str
    smoke: bool
    repeats: int
    tables: list[Table] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def targets_table(self) -> Table:
        table = Table("Targets", ["target", "goal", "measured: median [min-max]", "verdict"])
        for target in self.targets:
            table.add(target.name, target.goal, target.measured, target.verdict)
        return table

    def markdown(self) -> str:
        parts = [f"## {self.title}", "",
                 f"`{self.command}` — {self.repeats} repeat(s)"
                 f"{', smoke sizes' if self.smoke else ''}, {self.seconds:.0f} s.", ""]
        for table in self.tables:
            parts += [table.markdown(), ""]
        if self.targets:
            parts += [self.targets_table().markdown(), ""]
        parts += [f"- {note}" for note in self.notes]
        return "\n".join(parts).rstrip() + "\n"

    def text(self) -> str:
        parts = [f"== {self.title} ({self.repeats} repeat(s){', smoke' if self.smoke else ''},"
                 f" {self.seconds:.0f} s)"]
        parts += [table.text() for table in self.tables]
        if self.targets:
            parts.append(self.targets_table().text())
        if self.notes:
            parts.append("\n".join(f"* {note}" for note in self.notes))
        return "\n\n".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "markdown": self.markdown(),
                "targets": [target.__dict__ | {"verdict": target.verdict}
                            for target in self.targets]}


def run_script(measure: Callable[[argparse.Namespace], Report], doc: str | None,
               argv: Sequence[str] | None = None) -> None:
    """A benchmark script's main: its options, its measurements, its printed report."""
    options = parse_options((doc or "").splitlines()[0], argv)
    started = time.monotonic()
    finish(measure(options), options, started)


def finish(report: Report, options: argparse.Namespace, started: float) -> None:
    """Print the report and, when asked, write it for run_all.py."""
    report.seconds = time.monotonic() - started
    print(report.text(), flush=True)
    if options.report is not None:
        options.report.write_text(json.dumps(report.to_json(), indent=1))


# -- statistics --------------------------------------------------------------------------------

def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile (q in 0..100) of `values`."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


@dataclass
class Spread:
    """One figure measured once per repeat."""

    values: list[float] = field(default_factory=list)

    def add(self, value: float) -> None:
        self.values.append(value)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    def show(self, digits: int = 0, unit: str = "") -> str:
        if not self.values:
            return "-"
        fmt = f"{{:,.{digits}f}}"
        median = fmt.format(self.median) + unit
        if len(self.values) == 1:
            return median
        return f"{median} [{fmt.format(min(self.values))}-{fmt.format(max(self.values))}]"


def ms(seconds: float) -> float:
    return seconds * 1000.0


# -- the machine -------------------------------------------------------------------------------

def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _memory_gib() -> str:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    return "unknown"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def fsync_cost_ms(directory: str, samples: int = 100) -> float:
    """Median time of one 4 KiB write + fsync in `directory`: the floor under every durable
    commit measured here."""
    path = os.path.join(directory, "fsync-probe")
    times = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for _ in range(samples):
            os.write(fd, b"\0" * 4096)
            start = time.perf_counter()
            os.fsync(fd)
            times.append(time.perf_counter() - start)
    finally:
        os.close(fd)
        os.remove(path)
    return ms(statistics.median(times))


def machine_notes(directory: str | None = None) -> list[tuple[str, str]]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True,
                                  text=True, timeout=10, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return "?"

    dirty = " (with uncommitted changes)" if git("status", "--porcelain", "--", "app") else ""
    with tempfile.TemporaryDirectory(dir=directory) as probe_dir:
        fsync = fsync_cost_ms(probe_dir)
    packages = ["flask", "werkzeug", "sqlalchemy", "marshmallow", "gunicorn", "alembic",
                "huey", "persist-queue", "litequeue"]
    return [
        ("CPU", f"{_cpu_model()}, {os.cpu_count()} cores"),
        ("memory", _memory_gib()),
        ("OS", f"{platform.system()} {platform.release()}"),
        ("load average at start", " ".join(f"{x:.2f}" for x in os.getloadavg())),
        ("disk", f"one 4 KiB write + fsync: {fsync:.2f} ms (median of 100) in "
                 f"{directory or tempfile.gettempdir()}"),
        ("Python", f"{platform.python_implementation()} {platform.python_version()}"),
        ("SQLite", sqlite3.sqlite_version),
        ("libraries", ", ".join(f"{name} {_version(name)}" for name in packages)),
        ("queuelog", f"{git('rev-parse', '--short', 'HEAD')} on {git('branch', '--show-current')}"
                     f"{dirty}"),
    ]


# -- databases and keys ------------------------------------------------------------------------

def sqlite_url(path: str | Path) -> str:
    return f"sqlite:///{path}"


def migrated_database(directory: str | Path, name: str = "queuelog.sqlite3") -> str:
    """A fresh SQLite file at the newest migration; returns its URL."""
    from app.migrations import upgrade

    url = sqlite_url(Path(directory) / name)
    upgrade(url)
    return url


def create_keys(url: str, keys: Mapping[str, str]) -> dict[str, str]:
    """Create keys {name: role} in the database and return {name: token}."""
    from app import create_app
    from app.keys.models import Role

    app = create_app({"DATABASE_URL": url, "JOB_TYPES": JOB_TYPES})
    services = app.extensions["queuelog"]
    try:
        return {name: services.keys.create_key(name, Role(role)) for name, role in keys.items()}
    finally:
        services.db.engine.dispose()


@contextlib.contextmanager
def scratch_directory(prefix: str) -> Iterator[str]:
    """A temporary directory beside the others, removed however the run ends."""
    path = tempfile.mkdtemp(prefix=prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -- servers -----------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


class Server:
    """gunicorn serving `app_spec` from the project root, so that the shipped gunicorn.conf.py
    applies; only the bind address (and what `overrides` set) differ from production."""

    def __init__(self, app_spec: str, directory: str, overrides: Mapping[str, str] | None = None,
                 ready_path: str = "/readyz", root: Path = ROOT) -> None:
        self.port = free_port()
        env = {name: value for name, value in os.environ.items()
               if not name.startswith(_SCRUBBED_PREFIXES)}
        tmpdir = Path(directory) / f"server-tmp-{self.port}"
        tmpdir.mkdir()
        env.update(PYTHONPATH=str(root), TMPDIR=str(tmpdir), PYTHONUNBUFFERED="1",
                   QUEUELOG_BIND=f"{LOOPBACK}:{self.port}")
        env.update(overrides or {})
        self.stderr_path = Path(directory) / f"gunicorn-{self.port}.stderr"
        with open(self.stderr_path, "wb") as err:
            # stdout carries one JSON line per request; nothing reads it here.
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gunicorn", app_spec], cwd=root, env=env,
                stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL,
                start_new_session=True)
        try:
            self._wait_until_answering(ready_path)
        except BaseException:
            self.kill()
            raise

    def _wait_until_answering(self, path: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gunicorn exited ({self.process.returncode}):\n"
                                   f"{self.stderr()[-3000:]}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                conn = http.client.HTTPConnection(LOOPBACK, self.port, timeout=2)
                try:
                    conn.request("GET", path)
                    if conn.getresponse().status == 200:
                        return
                finally:
                    conn.close()
            time.sleep(0.1)
        raise RuntimeError(f"gunicorn did not answer {path} in {timeout} s:\n"
                           f"{self.stderr()[-3000:]}")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def worker_pids(self) -> list[int]:
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        return [int(pid) for pid in children.read_text().split()]

    def stop(self, timeout: float = 40) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def queuelog_server(directory: str, url: str, **overrides: str) -> Server:
    return Server("wsgi:app", directory,
                  {"QUEUELOG_DATABASE_URL": url, "QUEUELOG_JOB_TYPES": JOB_TYPES, **overrides})


def baseline_server(directory: str, **overrides: str) -> Server:
    return Server("bench.baseline_app:app", directory, dict(overrides), ready_path="/healthz")


def worker_memory_kib(pid: int) -> dict[str, int]:
    """VmHWM (peak resident set) and VmRSS of a process, in KiB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmHWM", "VmRSS"):
            values[name] = int(rest.split()[0])
    return values


# -- HTTP clients ------------------------------------------------------------------------------

class HttpError(RuntimeError):
    pass


class Client:
    """One keep-alive connection, as one producer or worker process would hold."""

    def __init__(self, port: int, token: str | None = None) -> None:
        self.conn = http.client.HTTPConnection(LOOPBACK, port, timeout=60)
        self.headers = {"Content-Type": "application/json"}
        if token is not None:
            self.headers["Authorization"] = f"Bearer {token}"

    def call(self, method: str, path: str, body: Any = None,
             expect: tuple[int, ...] = (200, 201)) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        try:
            self.conn.request(method, path, body=data, headers=self.headers)
            response = self.conn.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException):
            # The server closed an idle keep-alive connection: reconnect once.
            self.conn.close()
            self.conn.request(method, path, body=data, headers=self.headers)
            response = self.conn.getresponse()
            raw = response.read()
        if response.status not in expect:
            raise HttpError(f"{method} {path} answered {response.status}: {raw[:300]!r}")
        return response.status, (json.loads(raw) if raw else None)

    def close(self) -> None:
        self.conn.close()


# A scenario is one unit of work of one client: it makes its requests on the client it is
# given and returns how many jobs they moved. Scenarios are module-level functions, named in
# SCENARIOS, so that client processes can run them after a fork.
Scenario = Callable[[Client, Mapping[str, Any]], int]
SCENARIOS: dict[str, Scenario] = {}


def scenario(function: Scenario) -> Scenario:
    SCENARIOS[function.__name__] = function
    return function


@dataclass
class LoadResult:
    operations: int
    jobs: int
    seconds: float
    latencies: list[float]
    errors: list[str]
    client_cpu_seconds: float

    @property
    def jobs_per_second(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else 0.0

    @property
    def operations_per_second(self) -> float:
        return self.operations / self.seconds if self.seconds > 0 else 0.0

    @property
    def p50_ms(self) -> float:
        return ms(percentile(self.latencies, 50))

    @property
    def p99_ms(self) -> float:
        return ms(percentile(self.latencies, 99))


def _client_process(name: str, port: int, tokens: list[str], params: Mapping[str, Any],
                    threads: int, first_client: int, budget: Any, start: Any, stop_at: Any,
                    ready: Any, results: Any) -> None:
    work = SCENARIOS[name]
    latencies: list[float] = []
    jobs = [0]
    errors: list[str] = []
    lock = threading.Lock()
    clients = [Client(port, tokens[(first_client + i) % len(tokens)]) for i in range(threads)]
    for client in clients:
        client.conn.connect()
    cpu_before = time.process_time()

    def run(client: Client, index: int) -> None:
        context = dict(params, client_index=first_client + index)
        mine: list[float] = []
        moved = 0
        start.wait()
        deadline = stop_at.value
        while time.perf_counter() < deadline:
            with budget.get_lock():
                if budget.value <= 0:
                    break
                budget.value -= 1
            began = time.perf_counter()
            try:
                moved += work(client, context)
            except Exception as exc:  # reported to the caller, which fails the run
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}")
                break
            mine.append(time.perf_counter() - began)
        with lock:
            latencies.extend(mine)
            jobs[0] += moved

    workers = [threading.Thread(target=run, args=(client, i), daemon=True)
               for i, client in enumerate(clients)]
    for worker in workers:
        worker.start()
    ready.put(os.getpid())
    for worker in workers:
        worker.join()
    finished = time.perf_counter()
    for client in clients:
        client.close()
    results.put((latencies, jobs[0], errors, finished, time.process_time() - cpu_before))


def run_load(name: str, port: int, tokens: Sequence[str], *, clients: int, operations: int,
             max_seconds: float, params: Mapping[str, Any] | None = None,
             processes: int | None = None) -> LoadResult:
    """`clients` concurrent clients, each on its own keep-alive connection, running the
    scenario `name` until `operations` have started or `max_seconds` have passed.

    The clients are threads spread over a few forked processes (one per core by default),
    so that one Python process's GIL does not cap the load the clients can offer.
    Latency is per operation: from before its first request to after its last response.
    """
    context = multiprocessing.get_context("fork")
    processes = max(1, min(clients, processes or os.cpu_count() or 1))
    budget = context.Value("q", operations)
    start = context.Event()
    stop_at = context.Value("d", 0.0)
    ready = context.Queue()
    results = context.Queue()
    shares = [clients // processes + (1 if i < clients % processes else 0)
              for i in range(processes)]
    children = []
    first = 0
    for share in shares:
        child = context.Process(target=_client_process, daemon=True, args=(
            name, port, list(tokens), dict(params or {}), share, first, budget, start,
            stop_at, ready, results))
        child.start()
        children.append(child)
        first += share
    try:
        for _ in children:
            ready.get(timeout=60)
        began = time.perf_counter()
        stop_at.value = began + max_seconds
        start.set()
        latencies: list[float] = []
        jobs, errors, last, cpu = 0, [], began, 0.0
        for _ in children:
            part, moved, failed, finished, used = results.get(timeout=max_seconds + 120)
            latencies += part
            jobs += moved
            errors += failed
            last = max(last, finished)
            cpu += used
    finally:
        for child in children:
            child.join(timeout=10)
            if child.is_alive():
                child.kill()
    if errors:
        raise HttpError(f"{len(errors)} client(s) failed; first: {errors[0]}")
    return LoadResult(len(latencies), jobs, last - began, latencies, errors, cpu)


# -- the job bodies the HTTP benchmarks send -----------------------------------------------------

def job_body(n: int) -> dict[str, Any]:
    """A typical small job: about 130 bytes of JSON."""
    return {"type": "email", "priority": "medium",
            "payload": {"to": f"user-{n}@example.com", "template": "welcome-v2",
                        "locale": "en-GB"}}


RESULT = {"message_id": "0123456789abcdef"}


def fill_queue(port: int, token: str, count: int, batch: int = 1000) -> None:
    """Enqueue `count` jobs through /jobs/batch (set-up, not measured)."""
    client = Client(port, token)
    try:
        done = 0
        while done < count:
            size = min(batch, count - done)
            client.call("POST", "/jobs/batch", {"jobs": [job_body(done + i)
                                                         for i in range(size)]})
            done += size
    finally:
        client.close()
