"""The load the fault tests run beside each fault (issue 36), engine-neutral: it speaks only
HTTP to a base URL, so the same harness serves PostgreSQL and SQLite servers alike.

- Producers: threads POSTing /jobs at a steady pace, each job with an Idempotency-Key of its
  own. A timeout or a broken connection is retried with the SAME key, and so is a 503 (after
  its Retry-After, capped): an enqueue the server stored but whose answer was lost comes back
  as a 200 replay, so an acknowledgement is never counted twice nor lost in the count.
- Worker runners: the project's own `python -m queuelog_client worker` processes (the
  `queuelog worker` CLI), whose handler (record_execution, below) appends one JSON line per
  execution — job id, attempt, runner, pid, start, end — to a file, then lets the runner
  complete the job. The runner logs each report the server accepted ("job N completed") or
  refused ("… the lease was lost"); those lines, with their timestamps, are the completions.
- Every answer a producer gets is recorded by kind: `ok`, `<status>-problem-retry-after`
  (a problem document with Retry-After: the allowed error), `500`, `other` (any other answer:
  a non-problem body, a problem without Retry-After, an unexpected status), `timeout` (a hang
  past REQUEST_TIMEOUT_SECONDS) and `connection` (refused or reset).

At the end, `LoadRun.report()` reads every acknowledged job back through GET /jobs and says
what was lost, what completed twice, the errors by kind, and how long throughput took to come
back after the fault (see LoadReport).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

from tests.servers import REPO_ROOT, server_environment

# A request unanswered for this long is a hang: counted as a failure, then sent again.
REQUEST_TIMEOUT_SECONDS = 10.0
# A 503's Retry-After is honoured up to this: the load must notice the recovery promptly.
MAX_RETRY_AFTER_SECONDS = 1.0
BUCKET_SECONDS = 0.5
RATE_WINDOW_SECONDS = 3.0
DRAIN_TIMEOUT_SECONDS = 60.0
RUNNER_STOP_SECONDS = 15.0
ALLOWED_ERRORS = frozenset({"503-problem-retry-after"})
# What the runner's log says of each report (queuelog_client/worker.py's log lines).
_LOG_LINE = re.compile(r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (?P<level>\w+) "
                       r"(?P<logger>[\w.]+): (?P<message>.*)$")
_COMPLETED = re.compile(r"^job (\d+) completed$")
_LOST = re.compile(r"^job (\d+): (complete|fail) refused, the lease was lost")
_UNREACHABLE = re.compile(r"server unreachable[^(]*\((?P<why>.*)\)$")

EXECUTIONS_VARIABLE = "QUEUELOG_FAULTS_EXECUTIONS"
HANDLER_SECONDS_VARIABLE = "QUEUELOG_FAULTS_HANDLER_SECONDS"
RUNNER_VARIABLE = "QUEUELOG_FAULTS_RUNNER"


# -- the handler the runners call (in their own processes) ----------------------------------

def record_execution(job: dict[str, Any]) -> dict[str, Any]:
    """The worker runner's handler: works for QUEUELOG_FAULTS_HANDLER_SECONDS, then appends
    one line for this execution. One write() of a short line to a file opened for appending
    is atomic, so the runner's threads (and several runners) share the file."""
    start = time.time()
    time.sleep(float(os.environ.get(HANDLER_SECONDS_VARIABLE, "0.01")))
    line = json.dumps({"id": job["id"], "attempt": job.get("retry_count"),
                       "runner": os.environ.get(RUNNER_VARIABLE, "?"), "pid": os.getpid(),
                       "thread": threading.get_ident(), "start": start, "end": time.time()})
    with open(os.environ[EXECUTIONS_VARIABLE], "a", encoding="utf-8") as executions:
        executions.write(line + "\n")
    return {"done": True}


# -- answers ---------------------------------------------------------------------------------

def kind_of(response: requests.Response) -> str:
    """What an answer was, for the error counts."""
    if response.status_code < 400:
        return "ok"
    problem = response.headers.get("Content-Type", "").startswith("application/problem+json")
    if problem and response.headers.get("Retry-After") and response.status_code >= 500:
        return f"{response.status_code}-problem-retry-after"
    if response.status_code == 500:
        return "500"
    return "other"


@dataclass
class Answers:
    """Every answer of one kind of call, by kind, with when the errors came."""

    kinds: Counter[str] = field(default_factory=Counter)
    error_times: list[tuple[float, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, kind: str, at: float) -> None:
        with self.lock:
            self.kinds[kind] += 1
            if kind != "ok":
                self.error_times.append((at, kind))


# -- worker runners --------------------------------------------------------------------------

class Runner:
    """One `python -m queuelog_client worker` process against `url`, in a session of its own
    (so a test may kill it with its group), logging to `<name>.log` under `directory`."""

    def __init__(self, name: str, url: str, token: str, directory: Path, executions: Path, *,
                 job_types: Sequence[str] = ("email",), concurrency: int = 8,
                 lease_seconds: int | None = None, wait_seconds: float = 1.0,
                 handler_seconds: float = 0.01, grace_seconds: float = 5.0) -> None:
        self.name = name
        self.url = url
        self.log_path = directory / f"runner-{name}.log"
        self.argv = [sys.executable, "-m", "queuelog_client", "worker", "--url", url,
                     "--handler", "tests.faults.load:record_execution",
                     "--types", ",".join(job_types), "--concurrency", str(concurrency),
                     "--wait-seconds", str(wait_seconds), "--grace-seconds", str(grace_seconds),
                     "--log-level", "INFO"]
        if lease_seconds is not None:
            self.argv += ["--lease-seconds", str(lease_seconds)]
        # The token travels in the environment, never on the command line (ps shows that).
        self.env = server_environment(directory, QUEUELOG_TOKEN=token, TZ="UTC", **{
            EXECUTIONS_VARIABLE: str(executions), RUNNER_VARIABLE: name,
            HANDLER_SECONDS_VARIABLE: str(handler_seconds)})
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Runner:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(self.argv, cwd=REPO_ROOT, env=self.env,
                                            stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> int | None:
        """SIGTERM (the runner's graceful stop), SIGKILL when it outlives RUNNER_STOP_SECONDS;
        its exit status."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=RUNNER_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=RUNNER_STOP_SECONDS)
        return self.process.returncode

    def log_lines(self) -> Iterator[tuple[float, str, str]]:
        """(epoch seconds, level, message) of the runner's log lines (TZ=UTC)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return
        for line in text.splitlines():
            match = _LOG_LINE.match(line)
            if match is None:
                continue
            at = datetime.strptime(match["at"], "%Y-%m-%d %H:%M:%S,%f").replace(
                tzinfo=UTC).timestamp()
            yield at, match["level"], match["message"]

    def wait_until_claiming(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not any(message.startswith("worker waiting for jobs")
                      for _at, _level, message in self.log_lines()):
            if not self.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"runner {self.name} did not start:\n{self.log_tail()}")
            time.sleep(0.05)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


# -- the report ------------------------------------------------------------------------------

@dataclass
class FaultFigures:
    """One fault's window and how the completions fared around it."""

    name: str
    started_at: float
    ended_at: float
    rate_before: float  # completions per second in the few seconds before the fault
    rate_during: float
    recovery_seconds: float | None  # fault end → first bucket back at half the steady rate

    def summary(self) -> str:
        recovery = ("never" if self.recovery_seconds is None
                    else f"{self.recovery_seconds:.1f} s")
        return (f"{self.name} ({self.ended_at - self.started_at:.1f} s): completions/s "
                f"before {self.rate_before:.1f}, during {self.rate_during:.1f}, "
                f"recovery {recovery}")


@dataclass
class LoadReport:
    """What the load saw. Every test asserts `lost`, `twice` and `failures` empty or zero."""

    acknowledged: int
    acknowledged_lost: list[int]  # ids answered 201/200 that GET /jobs does not know
    not_completed: dict[int, str]  # acknowledged jobs not completed at the end, and status
    completed_twice_while_leased: list[int]  # two accepted completes, or executions on
    # two holders overlapping in time while the earlier holder's report was not refused
    overlapped_rescues: int  # executions overlapping an earlier holder's whose report was
    # refused (the lease had run out): fencing at work, not a failure
    reported_complete_not_completed: list[int]  # the runner was told 200, the job is not
    reports_refused: list[tuple[int, str]]  # (job id, runner) of each report refused with
    # 409/404: a stale holder fenced off
    client_errors: Counter[str]  # producers' answers other than ok, by kind
    worker_errors: Counter[str]  # the runners' logged retries, by what they met
    worker_errors_by_runner: dict[str, Counter[str]]
    faults: list[FaultFigures]
    timeline: list[int]  # completions per BUCKET_SECONDS, from the load's start
    allowed_errors: frozenset[str] = ALLOWED_ERRORS

    @property
    def lost(self) -> int:
        return len(self.acknowledged_lost)

    @property
    def twice(self) -> int:
        return len(self.completed_twice_while_leased)

    @property
    def failures(self) -> dict[str, int]:
        """Client errors of a kind that is never allowed (500, other, timeout, connection)."""
        return {kind: count for kind, count in self.client_errors.items()
                if kind not in self.allowed_errors}

    @property
    def worker_failures(self) -> dict[str, int]:
        return {kind: count for kind, count in self.worker_errors.items()
                if kind not in self.allowed_errors}

    def worker_failures_of(self, runner: str) -> dict[str, int]:
        return {kind: count for kind, count in self.worker_errors_by_runner[runner].items()
                if kind not in self.allowed_errors}

    @property
    def recovery_seconds(self) -> float | None:
        """The slowest recovery of the faults (None: one never recovered, or no fault)."""
        recoveries = [fault.recovery_seconds for fault in self.faults]
        if not recoveries or None in recoveries:
            return None
        return max(r for r in recoveries if r is not None)

    def summary(self, label: str) -> str:
        faults = "; ".join(fault.summary() for fault in self.faults) or "no fault"
        return (f"{label}: acknowledged {self.acknowledged}, lost {self.lost}, "
                f"twice {self.twice}, reports refused {len(self.reports_refused)} "
                f"(overlapping a new holder {self.overlapped_rescues}), "
                f"client errors {dict(sorted(self.client_errors.items())) or 'none'}, "
                f"worker retries {dict(sorted(self.worker_errors.items())) or 'none'}; "
                f"{faults}")

    def print(self, label: str) -> None:
        # pytest -s (or -rP) shows it: the figure the operations note quotes.
        print(f"\n{self.summary(label)}", flush=True)


# -- the load --------------------------------------------------------------------------------

class LoadRun:
    """Producers against `url` and worker runners against `worker_urls` (default: `url`).

    Use it as a context manager (runners and producers are stopped however the test ends):
    `start()`, `mark_fault_start()` / `mark_fault_end()` around the fault, then
    `stop_producing()`, `drain()` (every acknowledged job completed, or the timeout) and
    `report()`.
    """

    def __init__(self, url: str, *, producer_token: str, worker_token: str, admin_token: str,
                 directory: Path, producers: int = 2, rate_per_producer: float = 20.0,
                 job_type: str = "email", worker_urls: Sequence[str] | None = None,
                 worker_tokens: Sequence[str] | None = None, concurrency: int = 8,
                 lease_seconds: int | None = None, handler_seconds: float = 0.01,
                 wait_seconds: float = 1.0) -> None:
        self.url = url.rstrip("/")
        self.producer_token = producer_token
        self.admin_token = admin_token
        self.directory = directory
        self.job_type = job_type
        self.producers = producers
        self.interval = 1.0 / rate_per_producer
        self.executions_path = directory / "executions.jsonl"
        self.executions_path.touch()
        urls = list(worker_urls or [self.url])
        tokens = list(worker_tokens or [worker_token] * len(urls))
        self.runners = [
            Runner(f"r{i}", runner_url, tokens[i], directory, self.executions_path,
                   job_types=[job_type], concurrency=concurrency, lease_seconds=lease_seconds,
                   handler_seconds=handler_seconds, wait_seconds=wait_seconds)
            for i, runner_url in enumerate(urls)]
        self.answers = Answers()
        self.acknowledged: dict[str, int] = {}  # idempotency key → job id
        self._ack_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.started_at = 0.0
        self.fault_windows: list[tuple[str, float, float | None]] = []
        self._run_tag = f"{os.getpid()}-{time.time_ns()}"

    # -- control ---------------------------------------------------------------------------

    def start(self, runners: bool = True) -> LoadRun:
        """Start the runners, wait until each is claiming (so that no backlog piles up
        while they import, which would make a burst of the first completions), then the
        producers."""
        if runners:
            for runner in self.runners:
                runner.start()
            for runner in self.runners:
                runner.wait_until_claiming()
        self.started_at = time.time()
        for index in range(self.producers):
            thread = threading.Thread(target=self._produce, args=(index,), daemon=True,
                                      name=f"faults-producer-{index}")
            thread.start()
            self._threads.append(thread)
        return self

    def wait_until_flowing(self, completions: int = 20, timeout: float = 60) -> None:
        """Until the runners have completed `completions` jobs: the steady state a fault is
        measured against (a runner takes a few seconds to start)."""
        deadline = time.monotonic() + timeout
        while len(self.completion_times()) < completions:
            for runner in self.runners:
                if not runner.alive():
                    raise RuntimeError(f"runner {runner.name} exited:\n{runner.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError("the load never started flowing:\n"
                                   + "\n".join(r.log_tail() for r in self.runners))
            time.sleep(0.1)

    def mark_fault_start(self, name: str = "fault") -> None:
        self.fault_windows.append((name, time.time(), None))

    def mark_fault_end(self) -> None:
        name, started, ended = self.fault_windows[-1]
        assert ended is None, "no fault under way"
        self.fault_windows[-1] = (name, started, time.time())

    @contextlib.contextmanager
    def fault(self, name: str) -> Iterator[None]:
        """The block is the fault's window: `with load.fault("restart"): cluster.restart()`."""
        self.mark_fault_start(name)
        try:
            yield
        finally:
            self.mark_fault_end()

    def stop_producing(self) -> None:
        """No new job; each producer finishes the job it is sending (retried until answered
        or REQUEST_TIMEOUT_SECONDS * 3), so no acknowledgement is left in between."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=REQUEST_TIMEOUT_SECONDS * 4)

    def drain(self, timeout: float = DRAIN_TIMEOUT_SECONDS) -> bool:
        """Wait until no job of the load's type is pending or running; whether it came."""
        session = self._session(self.admin_token)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                with contextlib.suppress(requests.RequestException):
                    if all(self._none_of(session, status) for status in ("pending", "running")):
                        return True
                time.sleep(0.25)
            return False
        finally:
            session.close()

    def stop(self) -> None:
        self._stop.set()
        for runner in self.runners:
            runner.stop()

    def __enter__(self) -> LoadRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- producing ---------------------------------------------------------------------------

    def _session(self, token: str) -> requests.Session:
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {token}"
        return session

    def _produce(self, index: int) -> None:
        session = self._session(self.producer_token)
        next_at = time.monotonic()
        number = 0
        try:
            while not self._stop.is_set():
                self._enqueue(session, f"faults-{self._run_tag}-{index}-{number}",
                              {"type": self.job_type, "payload": {"p": index, "n": number}})
                number += 1
                next_at += self.interval
                pause = next_at - time.monotonic()
                if pause > 0:
                    self._stop.wait(pause)
                else:
                    next_at = time.monotonic()  # behind (an outage): no burst to catch up
        finally:
            session.close()

    def _enqueue(self, session: requests.Session, key: str, body: dict[str, Any]) -> None:
        """Send until answered 201/200 (acknowledged) or refused for good; a stop gives up
        only on a job never sent or after REQUEST_TIMEOUT_SECONDS * 3 of retries."""
        give_up_at: float | None = None
        while True:
            if self._stop.is_set():
                give_up_at = give_up_at or time.monotonic() + REQUEST_TIMEOUT_SECONDS * 3
                if time.monotonic() > give_up_at:
                    return
            try:
                response = session.post(f"{self.url}/jobs", json=body,
                                        headers={"Idempotency-Key": key},
                                        timeout=REQUEST_TIMEOUT_SECONDS)
            except requests.Timeout:
                self.answers.record("timeout", time.time())
                continue
            except requests.ConnectionError:
                self.answers.record("connection", time.time())
                time.sleep(0.2)
                continue
            kind = kind_of(response)
            self.answers.record(kind, time.time())
            if response.status_code in (200, 201):
                with self._ack_lock:
                    self.acknowledged[key] = int(response.json()["id"])
                return
            if kind.endswith("-problem-retry-after"):
                time.sleep(min(float(response.headers["Retry-After"]), MAX_RETRY_AFTER_SECONDS))
                continue
            if response.status_code == 409:  # this key's first request still in flight
                time.sleep(0.1)
                continue
            return  # refused for good: not acknowledged, counted under its kind

    # -- reading back --------------------------------------------------------------------------

    def _none_of(self, session: requests.Session, status: str) -> bool:
        response = session.get(f"{self.url}/jobs", params={
            "status": status, "type": self.job_type, "limit": 1}, timeout=REQUEST_TIMEOUT_SECONDS)
        response.raise_for_status()
        return not response.json()["jobs"]

    def stored_jobs(self) -> dict[int, dict[str, Any]]:
        """Every job of the load's type, read through GET /jobs with the admin key."""
        session = self._session(self.admin_token)
        jobs: dict[int, dict[str, Any]] = {}
        params: dict[str, Any] = {"type": self.job_type, "limit": 500}
        try:
            while True:
                response = session.get(f"{self.url}/jobs", params=params,
                                       timeout=REQUEST_TIMEOUT_SECONDS * 3)
                response.raise_for_status()
                page = response.json()
                jobs.update((int(job["id"]), job) for job in page["jobs"])
                if page["next_cursor"] is None:
                    return jobs
                params["cursor"] = page["next_cursor"]
        finally:
            session.close()

    def executions(self) -> list[dict[str, Any]]:
        lines = self.executions_path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def reports(self) -> tuple[list[tuple[float, int, str]], list[tuple[float, int, str]],
                               dict[str, Counter[str]]]:
        """From the runners' logs: (time, job id, runner) of each accepted complete and each
        refused report, and the retries each runner logged, by what they met."""
        accepted: list[tuple[float, int, str]] = []
        refused: list[tuple[float, int, str]] = []
        retries_by_runner: dict[str, Counter[str]] = {}
        for runner in self.runners:
            retries = retries_by_runner[runner.name] = Counter()
            for at, _level, message in runner.log_lines():
                if match := _COMPLETED.match(message):
                    accepted.append((at, int(match[1]), runner.name))
                elif match := _LOST.match(message):
                    refused.append((at, int(match[1]), runner.name))
                elif match := _UNREACHABLE.search(message):
                    retries[_retry_kind(match["why"])] += 1
        return accepted, refused, retries_by_runner

    def completion_times(self) -> list[float]:
        return sorted(at for at, _job, _runner in self.reports()[0])

    def claim_times(self) -> list[float]:
        """When each execution started: the claims the runners made, seen from the handler."""
        return sorted(execution["start"] for execution in self.executions())

    def rate(self, times: Iterable[float], start: float, end: float) -> float:
        """Events per second in [start, end)."""
        if end <= start:
            return 0.0
        return sum(1 for at in times if start <= at < end) / (end - start)

    def report(self, *, allowed_errors: Iterable[str] = ALLOWED_ERRORS) -> LoadReport:
        stored = self.stored_jobs()
        acked_ids = set(self.acknowledged.values())
        accepted, refused, retries_by_runner = self.reports()
        completes: Counter[int] = Counter(job for _at, job, _runner in accepted)
        twice = {job for job, count in completes.items() if count > 1}
        refused_by = defaultdict(set)
        for _at, job, runner in refused:
            refused_by[job].add(runner)
        overlapped = 0
        by_job: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for execution in self.executions():
            by_job[int(execution["id"])].append(execution)
        for job, runs in by_job.items():
            runs.sort(key=lambda run: run["start"])
            for earlier, later in itertools.pairwise(runs):
                if later["start"] < earlier["end"]:
                    # Overlapping holders: fine only when the earlier one's report was
                    # refused (its lease had run out, the claim that rescued it fenced it).
                    if earlier["runner"] in refused_by[job]:
                        overlapped += 1
                    else:
                        twice.add(job)
        times = sorted(at for at, _job, _runner in accepted)
        timeline = _buckets(times, self.started_at)
        return LoadReport(
            acknowledged=len(acked_ids),
            acknowledged_lost=sorted(acked_ids - stored.keys()),
            not_completed={job: stored[job]["status"] for job in sorted(acked_ids & stored.keys())
                           if stored[job]["status"] != "completed"},
            completed_twice_while_leased=sorted(twice),
            overlapped_rescues=overlapped,
            reports_refused=[(job, runner) for _at, job, runner in refused],
            reported_complete_not_completed=sorted(
                job for job in completes if stored.get(job, {}).get("status") != "completed"),
            client_errors=Counter({kind: count for kind, count in self.answers.kinds.items()
                                   if kind != "ok"}),
            worker_errors=sum(retries_by_runner.values(), Counter()),
            worker_errors_by_runner=retries_by_runner,
            faults=self._fault_figures(times),
            timeline=timeline,
            allowed_errors=frozenset(allowed_errors),
        )

    def _fault_figures(self, times: list[float]) -> list[FaultFigures]:
        """For each fault: the completion rate in the RATE_WINDOW_SECONDS before it (after the
        first completion and the previous fault), during it, and the seconds from its end to
        the first BUCKET_SECONDS window at half the steady rate (the one before the first
        fault) or better."""
        figures = []
        previous_end = times[0] if times else self.started_at
        steady: float | None = None  # the rate before the first fault: what recovery means
        for name, started, ended in self.fault_windows:
            ended = ended if ended is not None else time.time()
            window_start = max(previous_end, started - RATE_WINDOW_SECONDS)
            before = self.rate(times, window_start, started)
            steady = before if steady is None else steady
            at, last, recovery = ended, (times[-1] if times else ended), None
            while at <= last:
                if self.rate(times, at, at + BUCKET_SECONDS) >= steady / 2:
                    recovery = at - ended
                    break
                at += BUCKET_SECONDS / 5
            figures.append(FaultFigures(name, started, ended, before,
                                        self.rate(times, started, ended), recovery))
            previous_end = ended
        return figures


def _buckets(times: Sequence[float], start: float) -> list[int]:
    if not times:
        return []
    counts = [0] * (int((times[-1] - start) / BUCKET_SECONDS) + 1)
    for at in times:
        counts[max(0, int((at - start) / BUCKET_SECONDS))] += 1
    return counts


def _retry_kind(why: str) -> str:
    """What a runner's logged retry met: '503 Service Unavailable: …' is the allowed 503
    problem (the client raises ServiceUnavailable only for a 503 answer, and the server
    always sends its problems with Retry-After — the producers check that header),
    '500 …' a 500, anything else no answer at all."""
    status = why.split(" ", 1)[0]
    if status == "503":
        return "503-problem-retry-after"
    if status.isdigit():
        return status
    return "timeout" if "timed out" in why.lower() else "connection"
