"""The worker runner: claim jobs, run a handler on each, report the outcome.

One thread claims (long polling, only as many jobs as there are free slots), one thread per
running job calls the handler and reports, and one thread heartbeats every held job at a
third of its lease. A report that cannot reach the server is retried until it gets an
answer, so a server restart loses no completion. Reports are idempotent on the server: a
report sent again after its answer was lost gets the same 200 as the first. A 409 means the
lease was lost (the job went back to the queue and another attempt owns it), which is logged
and dropped.

Stopping (stop(), SIGTERM or SIGINT): no new claim is made; the jobs held finish within the
grace period, after which those still running are failed with `retry_in_seconds=0` so
another worker takes them at once. A second signal ends the grace period now.
"""

from __future__ import annotations

import enum
import functools
import importlib
import logging
import random
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from types import FrameType
from typing import Any

from queuelog_client.client import MAX_CLAIM_JOBS, MAX_CLAIM_WAIT_SECONDS, Client, Job
from queuelog_client.errors import (
    Conflict,
    NotFound,
    ProblemError,
    ServerError,
    ServerUnreachable,
    ValidationFailed,
)

__all__ = ["ClaimedJob", "Handler", "RetryLater", "Worker", "load_handler"]

log = logging.getLogger("queuelog_client.worker")

Handler = Callable[[dict[str, Any]], dict[str, Any] | None]

# The server stores at most 2,000 characters of an error (it takes more, and cuts them);
# sending more is wasted bytes. Both are checked against /openapi.json, as the client's are.
MAX_ERROR_CHARS = 2000
MAX_RETRY_IN_SECONDS = 86_400
# Backoff between attempts to reach a server that does not answer, and between the empty
# claims of a worker that does not long-poll (wait_seconds=0), which would otherwise ask
# again at once, each claim a write transaction.
RECONNECT_BACKOFF_SECONDS = 0.25
RECONNECT_BACKOFF_MAX_SECONDS = 5.0
# After the grace period: how long the last fail reports and reporting threads may take.
FINAL_REPORT_SECONDS = 5.0

_UNREACHABLE = (ServerUnreachable, ServerError)


class RetryLater(Exception):
    """Raised by a handler to have its job tried again in `seconds` (an attempt is spent,
    as with any failure: a job whose retries are used up ends failed)."""

    def __init__(self, seconds: float, reason: str = "") -> None:
        self.seconds = max(0, min(MAX_RETRY_IN_SECONDS, round(seconds)))
        self.reason = reason or f"retry in {self.seconds} s"
        super().__init__(self.reason)


class ClaimedJob(dict[str, Any]):
    """The job a handler receives: the claimed job's fields as a dict (without its lease
    token), and `dependencies()`."""

    def __init__(self, fields: Job, client: Client) -> None:
        super().__init__(fields)
        self._client = client
        self._dependencies: list[dict[str, Any]] | None = None
        self._lock = threading.Lock()

    def dependencies(self) -> list[dict[str, Any]]:
        """The jobs this one depends on, in its `depends_on` order, each `{"id", "type",
        "status", "result"}` ([] for a job without dependencies): what the jobs before it
        in a workflow produced. Read from the server on the first call only (a claim does
        not carry them); an error reaching the server is raised here and, unless the handler
        catches it, fails the attempt like any other exception."""
        with self._lock:
            if self._dependencies is None:
                self._dependencies = self._client.dependencies(int(self["id"]))
            return list(self._dependencies)

    def __reduce__(self) -> tuple[type[dict[str, Any]], tuple[dict[str, Any]]]:
        # Pickled (handed to a process pool, say) or copied, it becomes a plain dict: its
        # client and lock cannot cross into another process.
        return dict, (dict(self),)


def load_handler(spec: str) -> Handler:
    """The function named by 'package.module:function' (or 'module:Class.method')."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"handler must be 'package.module:function', not {spec!r}")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{spec} is not callable")
    handler: Handler = target
    return handler


class _JobState(enum.Enum):
    """A held job's life in the runner: RUNNING → REPORTING → DONE, or RUNNING → ABANDONED
    (failed back to the queue at the end of the grace period, while its handler still ran)."""

    RUNNING = enum.auto()
    REPORTING = enum.auto()
    DONE = enum.auto()
    ABANDONED = enum.auto()


class _Report(enum.Enum):
    """The two outcomes a worker reports; the value names it in the log."""

    COMPLETE = "complete"
    FAIL = "fail"


@dataclass
class _HeldJob:
    job: Job
    lease_token: str | None
    lease_seconds: int
    next_heartbeat: float
    state: _JobState = _JobState.RUNNING
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def id(self) -> int:
        return int(self.job["id"])


class Worker:
    """Runs `handler` on the jobs of `types` (None: any type the key allows).

    The handler receives the job as a dict (a ClaimedJob: `job.dependencies()` reads what
    the jobs it depends on produced) and returns a JSON object or None, stored as the
    job's result. An exception fails the job with "Type: message" (the traceback is logged
    here, never sent); `RetryLater(seconds)` asks for a retry after that many seconds.

    `token` defaults to QUEUELOG_TOKEN. `lease_seconds` defaults to the server's. A claim
    waits up to `wait_seconds` for work, so a stop may take that long to be noticed: the
    claim in flight is not cut short, since the server may be handing it a job that would
    then sit leased to nobody until the lease ran out; what it brings runs within the grace
    period. `heartbeat=False` only suits handlers that always finish well within the lease.
    """

    def __init__(self, url: str, handler: Handler, *, token: str | None = None,
                 types: Iterable[str] | None = None, concurrency: int = 1,
                 lease_seconds: int | None = None, wait_seconds: float = 5.0,
                 grace_seconds: float = 30.0, heartbeat: bool = True,
                 timeout: float = 30.0) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if not 0 <= wait_seconds <= MAX_CLAIM_WAIT_SECONDS:
            raise ValueError(f"wait_seconds must be between 0 and {MAX_CLAIM_WAIT_SECONDS:g}")
        self.handler = handler
        self.types = None if types is None else list(types)
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.wait_seconds = wait_seconds
        self.grace_seconds = grace_seconds
        self.heartbeat_enabled = heartbeat
        # Few attempts inside the client: the worker's own loops keep retrying, while
        # watching for a stop, for as long as the server stays away.
        self.client = Client(url, token, timeout=timeout, max_attempts=2)
        self.stats = {"claimed": 0, "completed": 0, "failed": 0, "lost": 0, "abandoned": 0}

        self._held: dict[int, _HeldJob] = {}
        self._changed = threading.Condition()  # a slot freed, a stop, a new heartbeat due
        self._stopping = threading.Event()
        self._claiming_done = threading.Event()
        self._deadline: float | None = None
        self._fatal: ProblemError | None = None

    # -- control --------------------------------------------------------------------------

    def run(self, install_signal_handlers: bool = True) -> None:
        """Claim and run jobs until stop() (or SIGTERM/SIGINT), then let the held jobs
        finish. Raises the ProblemError that made claiming impossible (e.g. 401, 403)."""
        restore = self._install_signal_handlers() if install_signal_handlers else {}
        heartbeats = threading.Thread(target=self._heartbeat_loop, name="queuelog-heartbeat",
                                      daemon=True)
        heartbeats.start()
        # Said at once: an idle worker would otherwise print nothing until its first job.
        log.info("worker waiting for jobs of %s from %s (concurrency %d, each claim waits "
                 "up to %g s)",
                 f"types {','.join(self.types)}" if self.types is not None
                 else "any type the key allows", self.client.url, self.concurrency,
                 self.wait_seconds)
        try:
            self._claim_loop()
        finally:
            self._claiming_done.set()
            self.stop()
            self._drain()
            heartbeats.join(timeout=FINAL_REPORT_SECONDS)
            for signum, previous in restore.items():
                signal.signal(signum, previous)
            self.client.close()
            log.info("worker stopped: %s", self.stats)
        if self._fatal is not None:
            raise self._fatal

    def stop(self, grace_seconds: float | None = None) -> None:
        """Stop claiming; held jobs get `grace_seconds` (default: the worker's) to finish.
        Calling it again with a shorter grace shortens it. Safe from any thread."""
        grace = self.grace_seconds if grace_seconds is None else grace_seconds
        with self._changed:
            deadline = time.monotonic() + grace
            if self._deadline is None or deadline < self._deadline:
                self._deadline = deadline
            self._stopping.set()
            self._changed.notify_all()

    def _stop_on_signal(self, signum: int) -> None:
        second = self._stopping.is_set()
        log.info("%s: %s", signal.Signals(signum).name,
                 "ending the grace period now" if second else
                 f"no more claims; held jobs have {self.grace_seconds:g} s to finish")
        self.stop(0 if second else None)

    def _install_signal_handlers(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            # A signal handler runs in the main thread between two bytecodes, possibly while
            # that thread holds a lock stop() needs: hand the work to a new thread instead.
            threading.Thread(target=self._stop_on_signal, args=(signum,),
                             daemon=True).start()

        previous: dict[int, Any] = {}
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, on_signal)
        return previous

    # -- claiming -------------------------------------------------------------------------

    def _claim_loop(self) -> None:
        backoff = idle = RECONNECT_BACKOFF_SECONDS
        while not self._stopping.is_set():
            with self._changed:
                self._changed.wait_for(
                    lambda: self._stopping.is_set() or len(self._held) < self.concurrency)
                free = self.concurrency - len(self._held)
            if self._stopping.is_set():
                return
            try:
                jobs = self._claim(free)
            except _UNREACHABLE as exc:
                log.warning("claim: server unreachable, retrying in %.1f s (%s)", backoff,
                            _short(exc))
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, RECONNECT_BACKOFF_MAX_SECONDS)
                continue
            except ProblemError as exc:
                log.error("claim refused, stopping: %s", exc)
                self._fatal = exc
                return
            backoff = RECONNECT_BACKOFF_SECONDS
            for job in jobs:
                self._start(job)
            if jobs or self.wait_seconds > 0:
                # A long-polling claim has waited already (the client waits in the server's
                # stead when the server could not).
                idle = RECONNECT_BACKOFF_SECONDS
                continue
            self._stopping.wait(random.uniform(idle / 2, idle))
            idle = min(idle * 2, RECONNECT_BACKOFF_MAX_SECONDS)

    def _claim(self, free: int) -> list[Job]:
        if self.concurrency == 1:
            job = self.client.claim(types=self.types, lease_seconds=self.lease_seconds,
                                    wait_seconds=self.wait_seconds)
            return [] if job is None else [job]
        # A worker may run more jobs at once than one claim-many may take.
        return self.client.claim_many(min(free, MAX_CLAIM_JOBS), types=self.types,
                                      lease_seconds=self.lease_seconds,
                                      wait_seconds=self.wait_seconds)

    def _start(self, job: Job) -> None:
        lease = self.lease_seconds or _lease_of(job)
        held = _HeldJob(job=job, lease_token=job.get("lease_token"), lease_seconds=lease,
                        next_heartbeat=time.monotonic() + lease / 3)
        with self._changed:
            self._held[held.id] = held
            self.stats["claimed"] += 1
            self._changed.notify_all()
        log.info("job %s (%s) claimed", held.id, job.get("type"))
        threading.Thread(target=self._run_job, args=(held,), name=f"queuelog-job-{held.id}",
                         daemon=True).start()

    # -- running and reporting --------------------------------------------------------------

    def _run_job(self, held: _HeldJob) -> None:
        try:
            view = ClaimedJob({k: v for k, v in held.job.items() if k != "lease_token"},
                              self.client)
            retry_in: int | None = None
            try:
                result = self.handler(view)
                if result is not None and not isinstance(result, dict):
                    raise TypeError(f"the handler returned {type(result).__name__}; "
                                    "a result must be a dict or None")
                error = None
            except RetryLater as request:
                error, retry_in, result = f"RetryLater: {request.reason}", request.seconds, None
                log.info("job %s asks to be retried in %d s", held.id, request.seconds)
            except BaseException as exc:  # any failure of the handler, SystemExit too
                error, result = _describe(exc), None
                log.error("job %s failed:\n%s", held.id,
                          "".join(traceback.format_exception(exc)).rstrip())
            with held.lock:
                if held.state is _JobState.ABANDONED:
                    log.warning("job %s finished after the grace period; it was already "
                                "failed back to the queue", held.id)
                    return
                held.state = _JobState.REPORTING
            if error is None:
                self._report_complete(held, result)
            else:
                self._report_fail(held, error, retry_in)
            held.state = _JobState.DONE
        finally:
            with self._changed:
                self._held.pop(held.id, None)
                self._changed.notify_all()

    def _report_complete(self, held: _HeldJob, result: dict[str, Any] | None) -> None:
        try:
            outcome = self._report(held, _Report.COMPLETE,
                                   lambda: self.client.complete(held.id, held.lease_token,
                                                                result=result))
        except (TypeError, ValueError) as exc:
            # Not JSON (a datetime, NaN…): the result can never be stored, so fail the job.
            self._report_fail(held, f"invalid result: {_describe(exc)}", None)
            return
        except ValidationFailed as exc:
            self._report_fail(held, f"result rejected by the server: {exc.detail} "
                                    f"{exc.errors or ''}".rstrip(), None)
            return
        if outcome:
            self._count("completed")
            log.info("job %s completed", held.id)

    def _report_fail(self, held: _HeldJob, error: str, retry_in: int | None) -> None:
        if self._report(held, _Report.FAIL,
                        lambda: self.client.fail(held.id, held.lease_token,
                                                 error=error[:MAX_ERROR_CHARS],
                                                 retry_in_seconds=retry_in)):
            self._count("failed")

    def _report(self, held: _HeldJob, report: _Report, send: Callable[[], Job]) -> bool:
        """Send until the server answers. True when it took the report (a repeat after a
        lost answer included); False when the lease was lost (409/404) or the grace period
        ran out. ValidationFailed of a complete is raised: the caller fails the job."""
        what = report.value
        backoff = RECONNECT_BACKOFF_SECONDS
        while True:
            try:
                send()
                return True
            except (Conflict, NotFound) as exc:
                self._count("lost")
                log.warning("job %s: %s refused, the lease was lost (%s); another attempt "
                            "owns the job", held.id, what, exc.detail)
                return False
            except ValidationFailed as exc:
                if report is _Report.COMPLETE:
                    raise  # the result was refused: the caller fails the job instead
                log.error("job %s: %s refused: %s", held.id, what, exc)
                return False
            except _UNREACHABLE as exc:
                if self._past_deadline(backoff):
                    log.error("job %s: could not %s before the grace period ended (%s); "
                              "the job returns to the queue when its lease expires",
                              held.id, what, _short(exc))
                    return False
                log.warning("job %s: %s failed, server unreachable, retrying in %.1f s (%s)",
                            held.id, what, backoff, _short(exc))
                time.sleep(backoff)
                backoff = min(backoff * 2, RECONNECT_BACKOFF_MAX_SECONDS)
            except ProblemError as exc:
                log.error("job %s: %s refused: %s", held.id, what, exc)
                return False

    def _past_deadline(self, margin: float = 0.0) -> bool:
        deadline = self._deadline
        return deadline is not None and time.monotonic() + margin > (
            deadline + FINAL_REPORT_SECONDS)

    def _count(self, name: str) -> None:
        with self._changed:
            self.stats[name] += 1

    # -- heartbeats ------------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        while True:
            with self._changed:
                due = [h for h in self._held.values() if h.state is _JobState.RUNNING]
                if self._claiming_done.is_set() and not due:
                    return
                now = time.monotonic()
                soonest = min((h.next_heartbeat for h in due), default=now + 1.0)
                if soonest > now:
                    self._changed.wait(timeout=min(soonest - now, 1.0))
                    continue
                due = [h for h in due if h.next_heartbeat <= now]
            for held in due:
                if self.heartbeat_enabled:
                    self._beat(held)
                else:
                    held.next_heartbeat = float("inf")

    def _beat(self, held: _HeldJob) -> None:
        interval = held.lease_seconds / 3
        try:
            self.client.heartbeat(held.id, held.lease_token, lease_seconds=held.lease_seconds)
            held.next_heartbeat = time.monotonic() + interval
        except _UNREACHABLE as exc:
            # Sooner than usual: the lease runs out while the server is away.
            held.next_heartbeat = time.monotonic() + min(interval, 1.0)
            log.warning("job %s: heartbeat failed, server unreachable (%s)", held.id,
                        _short(exc))
        except ProblemError as exc:
            held.next_heartbeat = float("inf")
            if held.state is _JobState.RUNNING:
                log.warning("job %s: heartbeat refused, the lease is lost (%s); the handler "
                            "runs on but its outcome will be refused", held.id, exc.detail)

    # -- stopping --------------------------------------------------------------------------

    def _drain(self) -> None:
        """Wait for the held jobs until the deadline; fail those still running then."""
        deadline = self._deadline if self._deadline is not None else time.monotonic()
        with self._changed:
            while self._held and (remaining := deadline - time.monotonic()) > 0:
                self._changed.wait(timeout=remaining)
                deadline = min(deadline, self._deadline or deadline)  # a second signal
            overdue = list(self._held.values())
        abandoned = []
        for held in overdue:
            with held.lock:
                if held.state is _JobState.RUNNING:
                    held.state = _JobState.ABANDONED
                    abandoned.append(held)
        with self._changed:
            self._changed.notify_all()  # the heartbeat thread has no job left to beat for
        for held in abandoned:
            self._count("abandoned")
            log.warning("job %s: handler still running after the grace period; failing it "
                        "back to the queue", held.id)
            self._report(held, _Report.FAIL, functools.partial(
                self.client.fail, held.id, held.lease_token, retry_in_seconds=0,
                error="WorkerShutdown: the worker stopped before the handler finished"))
        # Reports in flight give up by themselves shortly after the deadline.
        with self._changed:
            self._changed.wait_for(lambda: all(h.state in {_JobState.ABANDONED, _JobState.DONE}
                                               for h in self._held.values()),
                                   timeout=FINAL_REPORT_SECONDS)


def _lease_of(job: Job) -> int:
    """The lease the server granted, from the claim's own timestamps."""
    try:
        claimed = datetime.fromisoformat(job["claimed_at"])
        expires = datetime.fromisoformat(job["lease_expires_at"])
        return max(1, round((expires - claimed).total_seconds()))
    except (KeyError, TypeError, ValueError):
        return 300


def _describe(exc: BaseException) -> str:
    message = str(exc).strip()
    name = type(exc).__name__
    return f"{name}: {message}" if message else name


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= 200 else text[:200] + "…"
