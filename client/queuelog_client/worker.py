"""The worker runner: claim jobs, run a handler on each, report the outcome.

One thread claims (long polling, only as many jobs as there are free slots), one thread per
running job calls the handler and reports, and one thread heartbeats every held job at a
third of its lease. A report that cannot reach the server is retried until it gets an
answer, so a server restart loses no completion. Reports are idempotent on the server: a
report sent again after its answer was lost gets the same 200 as the first. A 409 means the
lease was lost (the job went back to the queue and another attempt owns it), which is logged
and dropped.

Long jobs: a handler reports progress (job.progress: kept, and carried by the next heartbeat,
which comes sooner when the last progress sent is over a second old), saves checkpoints
(job.checkpoint: a heartbeat of its own, sent at once) and learns from the heartbeats' answers
that its job's cancel was requested (job.cancel_requested, job.raise_if_cancel_requested()).

Durable steps and waits (queuelog_client/steps.py): a handler's wait (job.sleep,
job.wait_for_event, job.wait_for_token) ends its run with SuspendJob, which the runner
reports as a suspend carrying the steps' memo; the job's next claim, once it resumes, runs
the handler again and its steps and waits answer from the memo.

Stopping (stop(), SIGTERM or SIGINT): no new claim is made; the jobs held finish within the
grace period, after which those still running are failed with `retry_in_seconds=0` so
another worker takes them at once. A second signal ends the grace period now.
"""

from __future__ import annotations

import enum
import functools
import importlib
import logging
import math
import os
import random
import re
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import FrameType
from typing import Any

from queuelog_client.client import (
    MAX_CLAIM_JOBS,
    MAX_CLAIM_WAIT_SECONDS,
    MAX_INSTANCE_CHARS,
    Client,
    Job,
)
from queuelog_client.errors import (
    Conflict,
    NotFound,
    ProblemError,
    ServerError,
    ServerUnreachable,
    TooManyRequests,
    ValidationFailed,
)
from queuelog_client.logs import stderr_unless_configured
from queuelog_client.steps import DurableSteps, StepMemo, SuspendJob, waitpoint_of
from queuelog_client.tracing import job_trace_headers, run_span

__all__ = ["CancelRequested", "ClaimedJob", "Handler", "RetryLater", "Worker",
           "default_instance", "load_handler"]

log = logging.getLogger("queuelog_client.worker")

Handler = Callable[[dict[str, Any]], dict[str, Any] | None]

# The server stores at most 2,000 characters of an error (it takes more, and cuts them);
# sending more is wasted bytes. Both are checked against /openapi.json, as the client's are.
MAX_ERROR_CHARS = 2000
# The label a worker sends with its claims and heartbeats, unless told: this variable's
# value, else "host:pid" (default_instance).
INSTANCE_VARIABLE = "QUEUELOG_INSTANCE"
MAX_RETRY_IN_SECONDS = 86_400
# Backoff between attempts to reach a server that does not answer, and between the empty
# claims of a worker that does not long-poll (wait_seconds=0), which would otherwise ask
# again at once, each claim a write transaction.
RECONNECT_BACKOFF_SECONDS = 0.25
RECONNECT_BACKOFF_MAX_SECONDS = 5.0
# After the grace period: how long the last fail reports and reporting threads may take.
FINAL_REPORT_SECONDS = 5.0
# A heartbeat carries new progress at most this often beyond its usual pace: prompt enough to
# watch, and a handler calling job.progress() in a tight loop still sends a request a second.
PROGRESS_EVERY_SECONDS = 1.0
# The server takes one heartbeat a second per job (or one per half lease, for a lease under
# two seconds): the runner beats every third of the lease, never sooner than that.
HEARTBEAT_SPACING_SECONDS = 1.0
# The server's bounds of a heartbeat's progress (tests/client/test_running_jobs.py checks
# them against /openapi.json): done and total within JSON's exact integers, a message cut.
MAX_PROGRESS = 2**53 - 1
MAX_PROGRESS_MESSAGE_CHARS = 200
# How long job.checkpoint() keeps trying a server that does not answer when the lease is
# not known (a ClaimedJob made by hand); the runner's jobs try for their lease.
CHECKPOINT_TRY_SECONDS = 30.0

_UNREACHABLE = (ServerUnreachable, ServerError)


class RetryLater(Exception):
    """Raised by a handler to have its job tried again in `seconds` (an attempt is spent,
    as with any failure: a job whose retries are used up ends failed)."""

    def __init__(self, seconds: float, reason: str = "") -> None:
        self.seconds = max(0, min(MAX_RETRY_IN_SECONDS, round(seconds)))
        self.reason = reason or f"retry in {self.seconds} s"
        super().__init__(self.reason)


class CancelRequested(Exception):
    """Raised by job.raise_if_cancel_requested() once the job's cancel was requested. The
    runner reports it as a failure, which the server turns into the cancel."""


class ClaimedJob(DurableSteps, dict[str, Any]):
    """The job a handler receives: the claimed job's fields as a dict (without its lease
    token; `job["checkpoint"]` is what an earlier attempt saved, or None, less the steps'
    memo), `dependencies()`, `trace`, `traceparent` and `tags`, for long jobs `progress()`,
    `checkpoint()`, `cancel_requested` and `raise_if_cancel_requested()`, and the durable
    `step()`, `sleep()`, `wait_for_event()` and `wait_for_token()` (steps.py).

    The dict's own `"cancel_requested"` and `"progress"` are the claim's; the properties and
    methods are live."""

    def __init__(self, fields: Job, client: Client, *, lease_seconds: int | None = None,
                 beat_soon: Callable[[float], None] | None = None) -> None:
        # The steps' memo rides in the checkpoint; the handler sees its own part only.
        self._memo = StepMemo(fields.get("checkpoint"), fields.get("resumed"))
        super().__init__({name: value for name, value in fields.items()
                          if name != "lease_token"})
        if "checkpoint" in self:
            self["checkpoint"] = self._memo.own_checkpoint
        self._client = client
        self._lease_token: str | None = fields.get("lease_token")
        self._lease_seconds = lease_seconds
        self._dependencies: list[dict[str, Any]] | None = None
        self._tags: list[str] | None = None
        self._lock = threading.Lock()
        self._cancel_requested = threading.Event()
        # The runner's heartbeat thread: "beat for this job at this monotonic time".
        self._beat_soon = beat_soon
        self._progress = _ProgressMailbox()
        # Set while checkpoint() sends its heartbeat (waiting out a 429 included): that
        # heartbeat keeps the lease, and the runner's own would only be refused in its way.
        self._checkpointing = threading.Event()

    def dependencies(self) -> list[dict[str, Any]]:
        """The jobs this one depends on, in its `depends_on` order, each `{"id", "type",
        "status", "result"}` ([] for a job without dependencies): what the jobs before it
        in a workflow produced. Every entry of depends_on is there, one removed by the
        server's retention since with `"status": "removed"` and no type or result. Read from
        the server on the first call only (a claim does
        not carry them); an error reaching the server is raised here and, unless the handler
        catches it, fails the attempt like any other exception."""
        with self._lock:
            if self._dependencies is None:
                self._dependencies = self._client.dependencies(int(self["id"]))
            return list(self._dependencies)

    @property
    def trace(self) -> dict[str, str | None] | None:
        """The W3C trace context the job's producer sent, `{"traceparent", "tracestate"}`,
        or None. With OpenTelemetry installed the runner's span "queuelog.run <type>" is
        already its child and current while the handler runs."""
        trace = self.get("trace")
        return dict(trace) if isinstance(trace, Mapping) else None

    @property
    def traceparent(self) -> str | None:
        """The job's `traceparent` header value, or None."""
        trace = self.trace
        return None if trace is None else trace.get("traceparent")

    @property
    def tags(self) -> list[str]:
        """The job's tags, sorted ([]: none). A claim's answer does not carry them: they are
        read from the server (GET /jobs/{id}) on the first use only, and an error reaching
        it is raised here, as dependencies() does."""
        with self._lock:
            if self._tags is None:
                shown = self.get("tags")
                if not isinstance(shown, list):
                    shown = self._client.get_job(int(self["id"])).get("tags")
                self._tags = [str(tag) for tag in shown] if isinstance(shown, list) else []
            return list(self._tags)

    @property
    def cancel_requested(self) -> bool:
        """True once a heartbeat's answer (the runner's, or a checkpoint's) said the job's
        cancel was requested: the handler should stop soon. Whatever it then returns or
        raises, the job ends cancelled. Heard within one heartbeat interval (a third of the
        lease); never with `Worker(heartbeat=False)`."""
        return self._cancel_requested.is_set()

    def raise_if_cancel_requested(self) -> None:
        """Raise CancelRequested when the job's cancel was requested."""
        if self._cancel_requested.is_set():
            raise CancelRequested(f"job {self['id']} was cancelled while it ran")

    def progress(self, done: int, total: int, message: str | None = None) -> None:
        """Record how far the job is (0 <= done <= total), shown in the job's `"progress"`;
        `message` is cut at MAX_PROGRESS_MESSAGE_CHARS. Never waits on the network: the
        runner's heartbeats carry the latest progress, one of them sooner than usual when
        the last progress sent is over PROGRESS_EVERY_SECONDS old. Cheap enough to call for
        every item."""
        for name, value in (("done", done), ("total", total)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"progress {name} must be an int, not {type(value).__name__}")
        if not 0 <= done <= total <= MAX_PROGRESS:
            raise ValueError(f"progress must be 0 <= done <= total <= {MAX_PROGRESS}, "
                             f"not {done}/{total}")
        if message is not None:
            message = str(message)[:MAX_PROGRESS_MESSAGE_CHARS]
        due = self._progress.record(done, total, message, time.monotonic())
        if due is not None and self._beat_soon is not None:
            self._beat_soon(due)

    def checkpoint(self, state: Mapping[str, Any]) -> None:
        """Save `state` (a JSON object) for the job's next attempt, which finds it in
        `job["checkpoint"]`: a heartbeat sent now, durable once this returns. The server
        saves one checkpoint a second per job (and takes one heartbeat a second): sent
        sooner, it is sent again after the Retry-After of its 429, so this may wait up to a
        second or two. Raises
        Conflict when the lease was lost (another attempt owns the job: stop),
        ValidationFailed when the server refuses the state (larger than a payload may be),
        and ServerUnreachable when the server did not answer for as long as the lease.
        The key steps.MEMO_KEY is reserved (ValueError): the steps' memo is saved beside
        `state` under it."""
        self._send_checkpoint(self._memo.with_state(state))

    def _save_memo(self) -> None:
        self._send_checkpoint(self._memo.body())

    def _send_checkpoint(self, body: dict[str, Any]) -> None:
        within = float(self._lease_seconds or CHECKPOINT_TRY_SECONDS)
        self._checkpointing.set()
        try:
            answer = _until_answered(lambda: self._client.heartbeat(
                int(self["id"]), self._lease_token, lease_seconds=self._lease_seconds,
                checkpoint=body), within)
        finally:
            self._checkpointing.clear()
        self._heard(answer)

    def _heard(self, answer: Job) -> bool:
        """Take a heartbeat's answer; True when it newly says the cancel was requested."""
        if answer.get("cancel_requested") and not self._cancel_requested.is_set():
            self._cancel_requested.set()
            return True
        return False

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


# What the server takes as an instance label (besides its length): printable ASCII, no space
# at either end (tests/client/test_wire_constants.py checks it against /openapi.json).
INSTANCE_PATTERN = re.compile(r"^[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?\Z")


def default_instance() -> str:
    """This process's instance label: QUEUELOG_INSTANCE when set (and not empty), else
    "host:pid", the host's name cut so that the label stays within the server's length (and
    any character of it the server would refuse written "?")."""
    chosen = os.environ.get(INSTANCE_VARIABLE)
    if chosen:
        return chosen
    pid = f":{os.getpid()}"
    host = "".join(char if "!" <= char <= "~" else "?"
                   for char in socket.gethostname() or "localhost")
    return host[:MAX_INSTANCE_CHARS - len(pid)] + pid


def check_instance(label: str) -> str:
    """The label, if the server would take it: 1..MAX_INSTANCE_CHARS characters of printable
    ASCII, no space at either end; else ValueError."""
    if not 1 <= len(label) <= MAX_INSTANCE_CHARS:
        raise ValueError(f"an instance label is 1 to {MAX_INSTANCE_CHARS} characters, "
                         f"not {len(label)}")
    if not INSTANCE_PATTERN.match(label):
        raise ValueError(f"an instance label is printable ASCII, with no space at either "
                         f"end: {label!r}")
    return label


class _ProgressMailbox:
    """The latest progress a handler recorded, and what the heartbeats have carried of it.

    `record` answers when a heartbeat should carry it only while none is planned already, so
    a tight loop of job.progress() touches the runner's lock once per beat, not per call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: tuple[dict[str, int], str | None] | None = None
        self._recorded = 0  # calls of record(), numbering each progress
        self._sent = 0  # the number of the last progress a heartbeat delivered
        # When the server last took a heartbeat of this job (with progress or without): a
        # progress beat comes no sooner than PROGRESS_EVERY_SECONDS after it, which is the
        # server's pace too.
        self._beat_at = -math.inf
        self._beat_planned = False

    def record(self, done: int, total: int, message: str | None, now: float) -> float | None:
        """Keep this progress; the monotonic time a heartbeat should carry it, or None when
        a beat is planned already."""
        with self._lock:
            self._latest = ({"done": done, "total": total}, message)
            self._recorded += 1
            if self._beat_planned:
                return None
            self._beat_planned = True
            return max(now, self._beat_at + PROGRESS_EVERY_SECONDS)

    def unsent(self) -> tuple[int, dict[str, int] | None, str | None]:
        """(its number, progress, message) of the latest progress not yet delivered, or
        (0, None, None)."""
        with self._lock:
            if self._latest is None or self._recorded == self._sent:
                return 0, None, None
            return self._recorded, *self._latest

    def delivered(self, number: int, now: float) -> float | None:
        """The server took a heartbeat at `now`, carrying progress `number` (0: none). When
        the next should carry a newer one recorded meanwhile, or None."""
        with self._lock:
            self._beat_at = max(self._beat_at, now)
            if number > self._sent:
                self._sent = number
            if self._recorded == self._sent:
                self._beat_planned = False
                return None
            self._beat_planned = True
            return max(now, self._beat_at + PROGRESS_EVERY_SECONDS)


def heartbeat_interval(lease_seconds: float) -> float:
    """How often the runner beats for a job of this lease: a third of it, so that two beats
    may go astray before it runs out, but never sooner than the server takes them."""
    return max(lease_seconds / 3, min(HEARTBEAT_SPACING_SECONDS, lease_seconds / 2))


def _until_answered(send: Callable[[], Job], within: float) -> Job:
    """send() again while the server is unreachable, for up to `within` seconds."""
    deadline = time.monotonic() + within
    backoff = RECONNECT_BACKOFF_SECONDS
    while True:
        try:
            return send()
        except _UNREACHABLE:
            if time.monotonic() + backoff > deadline:
                raise
            time.sleep(backoff)
            backoff = min(backoff * 2, RECONNECT_BACKOFF_MAX_SECONDS)


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
    SUSPEND = "suspend"


@dataclass
class _HeldJob:
    job: Job
    view: ClaimedJob  # what the handler holds
    lease_token: str | None
    lease_seconds: int
    next_heartbeat: float  # monotonic; inf once heartbeats stopped (lost lease, disabled)
    state: _JobState = _JobState.RUNNING
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def id(self) -> int:
        return int(self.job["id"])

    # The job's trace context, sent with its reports: the server's report span then joins the
    # producer's trace.
    @property
    def traceparent(self) -> str | None:
        return job_trace_headers(self.job).get("traceparent")

    @property
    def tracestate(self) -> str | None:
        return job_trace_headers(self.job).get("tracestate")


class Worker:
    """Runs `handler` on the jobs of `types` (None: any type the key allows).

    The handler receives the job as a dict (a ClaimedJob: `job.dependencies()` reads what
    the jobs it depends on produced; `job.progress()`, `job.checkpoint()` and
    `job.cancel_requested` serve long jobs) and returns a JSON object or None, stored as the
    job's result. An exception fails the job with "Type: message" (the traceback is logged
    here, never sent); `RetryLater(seconds)` asks for a retry after that many seconds. A job
    whose cancel was requested while it ran ends cancelled whatever the handler reports
    (counted in stats["cancelled"]).

    `token` defaults to QUEUELOG_TOKEN. `lease_seconds` defaults to the server's. A claim
    waits up to `wait_seconds` for work, so a stop may take that long to be noticed: the
    claim in flight is not cut short, since the server may be handing it a job that would
    then sit leased to nobody until the lease ran out; what it brings runs within the grace
    period. `heartbeat=False` only suits handlers that always finish well within the lease.

    `instance` labels this process's claims and heartbeats (default: QUEUELOG_INSTANCE, else
    "host:pid"): GET /workers and the dashboard list the key's instances by it, and each
    job's attempt names it. The server shows it as reported; the key alone is the worker.
    """

    def __init__(self, url: str, handler: Handler, *, token: str | None = None,
                 types: Iterable[str] | None = None, concurrency: int = 1,
                 lease_seconds: int | None = None, wait_seconds: float = 5.0,
                 grace_seconds: float = 30.0, heartbeat: bool = True,
                 timeout: float = 30.0, instance: str | None = None) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.instance = check_instance(default_instance() if instance is None else instance)
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
        self.stats = {"claimed": 0, "completed": 0, "failed": 0, "cancelled": 0, "lost": 0,
                      "abandoned": 0, "suspended": 0}

        self._held: dict[int, _HeldJob] = {}
        self._changed = threading.Condition()  # a slot freed, a stop, a new heartbeat due
        self._stopping = threading.Event()
        self._claiming_done = threading.Event()
        self._deadline: float | None = None
        self._fatal: ProblemError | None = None

    # -- control --------------------------------------------------------------------------

    def run(self, install_signal_handlers: bool = True) -> None:
        """Claim and run jobs until stop() (or SIGTERM/SIGINT), then let the held jobs
        finish. Raises the ProblemError that made claiming impossible (e.g. 401, 403).

        What it does is logged on the "queuelog_client" logger; in a program that
        configured no logging, its INFO lines go to stderr (queuelog_client/logs.py)."""
        with stderr_unless_configured():
            self._run(install_signal_handlers)

    def _run(self, install_signal_handlers: bool) -> None:
        restore = self._install_signal_handlers() if install_signal_handlers else {}
        heartbeats = threading.Thread(target=self._heartbeat_loop, name="queuelog-heartbeat",
                                      daemon=True)
        heartbeats.start()
        # Said at once: an idle worker would otherwise print nothing until its first job.
        log.info("worker waiting for jobs of %s from %s (concurrency %d, each claim waits "
                 "up to %g s) as instance %s",
                 f"types {','.join(self.types)}" if self.types is not None
                 else "any type the key allows", self.client.url, self.concurrency,
                 self.wait_seconds, self.instance)
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
                                    wait_seconds=self.wait_seconds, instance=self.instance)
            return [] if job is None else [job]
        # A worker may run more jobs at once than one claim-many may take.
        return self.client.claim_many(min(free, MAX_CLAIM_JOBS), types=self.types,
                                      lease_seconds=self.lease_seconds,
                                      wait_seconds=self.wait_seconds, instance=self.instance)

    def _start(self, job: Job) -> None:
        lease = self.lease_seconds or _lease_of(job)
        view = ClaimedJob(job, self.client, lease_seconds=lease,
                          beat_soon=lambda when: self._beat_soon(int(job["id"]), when))
        held = _HeldJob(job=job, view=view, lease_token=job.get("lease_token"),
                        lease_seconds=lease,
                        next_heartbeat=time.monotonic() + heartbeat_interval(lease)
                        if self.heartbeat_enabled
                        else math.inf)
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
            retry_in: int | None = None
            suspend: SuspendJob | None = None
            try:
                with run_span(held.job):
                    try:
                        result = self.handler(held.view)
                    except SuspendJob as pause:  # a wait: suspended, neither done nor failed
                        result, suspend = None, pause  # (and no error on the run's span)
                if result is not None and not isinstance(result, dict):
                    raise TypeError(f"the handler returned {type(result).__name__}; "
                                    "a result must be a dict or None")
                error = None
            except RetryLater as request:
                error, retry_in, result = f"RetryLater: {request.reason}", request.seconds, None
                log.info("job %s asks to be retried in %d s", held.id, request.seconds)
            except CancelRequested as stop:
                error, result = _describe(stop), None
                log.info("job %s stopped: its cancel was requested", held.id)
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
            if suspend is not None:
                self._report_suspend(held, suspend)
            elif error is None:
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
                                   lambda: self.client.complete(
                                       held.id, held.lease_token, result=result,
                                       traceparent=held.traceparent,
                                       tracestate=held.tracestate))
        except (TypeError, ValueError) as exc:
            # Not JSON (a datetime, NaN…): the result can never be stored, so fail the job.
            self._report_fail(held, f"invalid result: {_describe(exc)}", None)
            return
        except ValidationFailed as exc:
            self._report_fail(held, f"result rejected by the server: {exc.detail} "
                                    f"{exc.errors or ''}".rstrip(), None)
            return
        if outcome is not None and not self._cancelled(held, outcome):
            self._count("completed")
            log.info("job %s completed", held.id)

    def _report_suspend(self, held: _HeldJob, pause: SuspendJob) -> None:
        try:
            outcome = self._report(held, _Report.SUSPEND, lambda: self.client.suspend(
                held.id, held.lease_token, **pause.wait.suspend, checkpoint=pause.checkpoint))
        except (TypeError, ValueError, ValidationFailed) as exc:
            # A wait the server (or the client) refuses: it can never be stored.
            detail = f"{exc.detail} {exc.errors or ''}".rstrip() if isinstance(
                exc, ValidationFailed) else _describe(exc)
            self._report_fail(held, f"suspend refused: {detail}", None)
            return
        if outcome is None or self._cancelled(held, outcome):
            return
        self._count("suspended")
        log.info("job %s suspended: waits for %s%s", held.id, pause.wait.what,
                 " (resumed at once)" if outcome.get("status") == "pending" else "")
        if pause.wait.on_token is None:
            return
        try:  # the suspend is stored: the token may be handed on
            pause.wait.on_token(*waitpoint_of(outcome, self.client.url))
        except BaseException as exc:
            log.error("job %s: on_token failed; the job stays suspended until its wait "
                      "times out:\n%s", held.id,
                      "".join(traceback.format_exception(exc)).rstrip())

    def _report_fail(self, held: _HeldJob, error: str, retry_in: int | None) -> None:
        outcome = self._report(held, _Report.FAIL,
                               lambda: self.client.fail(held.id, held.lease_token,
                                                        error=error[:MAX_ERROR_CHARS],
                                                        retry_in_seconds=retry_in,
                                                        traceparent=held.traceparent,
                                                        tracestate=held.tracestate))
        if outcome is not None and not self._cancelled(held, outcome):
            self._count("failed")

    def _cancelled(self, held: _HeldJob, outcome: Job) -> bool:
        """Whether the server turned the report into the cancel it was asked for."""
        if outcome.get("status") != "cancelled":
            return False
        self._count("cancelled")
        log.info("job %s cancelled on request", held.id)
        return True

    def _report(self, held: _HeldJob, report: _Report, send: Callable[[], Job]) -> Job | None:
        """Send until the server answers. The job it answered with when it took the report
        (a repeat after a lost answer included); None when the lease was lost (409/404) or
        the grace period ran out. ValidationFailed of a complete or a suspend is raised: the
        caller fails the job."""
        what = report.value
        backoff = RECONNECT_BACKOFF_SECONDS
        while True:
            try:
                return send()
            except (Conflict, NotFound) as exc:
                self._count("lost")
                log.warning("job %s: %s refused, the lease was lost (%s); another attempt "
                            "owns the job", held.id, what, exc.detail)
                return None
            except ValidationFailed as exc:
                if report is not _Report.FAIL:
                    raise  # the result or wait was refused: the caller fails the job instead
                log.error("job %s: %s refused: %s", held.id, what, exc)
                return None
            except _UNREACHABLE as exc:
                if self._past_deadline(backoff):
                    log.error("job %s: could not %s before the grace period ended (%s); "
                              "the job returns to the queue when its lease expires",
                              held.id, what, _short(exc))
                    return None
                log.warning("job %s: %s failed, server unreachable, retrying in %.1f s (%s)",
                            held.id, what, backoff, _short(exc))
                time.sleep(backoff)
                backoff = min(backoff * 2, RECONNECT_BACKOFF_MAX_SECONDS)
            except ProblemError as exc:
                log.error("job %s: %s refused: %s", held.id, what, exc)
                return None

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
                self._beat(held)

    def _beat_soon(self, job_id: int, when: float) -> None:
        """A handler's new progress: beat for its job at `when` if none comes sooner."""
        with self._changed:
            held = self._held.get(job_id)
            # inf: this job's heartbeats stopped (lease lost, or heartbeat=False) and
            # progress must not restart them.
            if held is None or not math.isfinite(held.next_heartbeat):
                return
            if when < held.next_heartbeat:
                held.next_heartbeat = when
                self._changed.notify_all()

    def _beat(self, held: _HeldJob) -> None:
        interval = heartbeat_interval(held.lease_seconds)
        if held.view._checkpointing.is_set():
            # The handler's checkpoint is a heartbeat on its way: beat after it instead.
            self._plan_beat(held, time.monotonic() + min(interval, HEARTBEAT_SPACING_SECONDS))
            return
        number, progress, message = held.view._progress.unsent()
        try:
            answer = self.client.heartbeat(
                held.id, held.lease_token, lease_seconds=held.lease_seconds,
                progress=None if progress is None else (progress["done"], progress["total"]),
                message=message, wait_if_too_soon=False, instance=self.instance)
        except TooManyRequests as exc:
            # Sooner than the server takes this job's heartbeats (the handler's checkpoint
            # beat just before, say): nothing was written, the lease stands. Beat again when
            # it says, with the same progress; a lease under two seconds is beaten at half
            # its length (the server's pace then), as Retry-After counts whole seconds.
            wait = 1.0 if exc.retry_after is None else exc.retry_after
            self._plan_beat(held, time.monotonic() + min(wait, held.lease_seconds / 2))
            log.debug("job %s: heartbeat sooner than the server takes it; again in %.1f s",
                      held.id, wait)
            return
        except _UNREACHABLE as exc:
            # Sooner than usual: the lease runs out while the server is away.
            self._plan_beat(held, time.monotonic() + min(interval, 1.0))
            log.warning("job %s: heartbeat failed, server unreachable (%s)", held.id,
                        _short(exc))
            return
        except ValidationFailed as exc:
            # A body the server refused (progress it would not take, say), not a lost lease:
            # drop that progress and beat again soon, as after a failed beat.
            held.view._progress.delivered(number, time.monotonic())
            self._plan_beat(held, time.monotonic() + min(interval, 1.0))
            log.error("job %s: heartbeat refused: %s", held.id, exc)
            return
        except ProblemError as exc:
            with self._changed:
                held.next_heartbeat = math.inf
            if held.state is _JobState.RUNNING:
                log.warning("job %s: heartbeat refused, the lease is lost (%s); the handler "
                            "runs on but its outcome will be refused", held.id, exc.detail)
            return
        now = time.monotonic()
        newer_progress = held.view._progress.delivered(number, now)
        self._plan_beat(held, min(now + interval, newer_progress or math.inf))
        if held.view._heard(answer):
            log.info("job %s: cancel requested; job.cancel_requested is now True", held.id)

    def _plan_beat(self, held: _HeldJob, when: float) -> None:
        with self._changed:
            if math.isfinite(held.next_heartbeat):
                held.next_heartbeat = when

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
                error="WorkerShutdown: the worker stopped before the handler finished",
                traceparent=held.traceparent, tracestate=held.tracestate))
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
