"""A queuelog HTTP client on the standard library alone.

Retries: a request is sent again only after a connection error or a 5xx answer, at most
`max_attempts` times in all, with exponential backoff and jitter (a 503's Retry-After is
honoured). A 4xx is never retried: sending the same request again cannot change the answer.
Every enqueue carries an idempotency key (a fresh uuid4 when the caller gives none), so a
retry of a request whose answer was lost finds the job the first attempt stored instead of
creating a second one.

Waiting (claim's wait_seconds, wait()): when the server's budget of waiting requests is full
it answers at once with Retry-After instead of waiting. The client then waits in its stead,
at least that long plus a jittered backoff that grows with each such answer (capped at
max_backoff_seconds), and asks again while the caller's wait lasts: asking again at once
would spin, thousands of requests a minute against a busy server.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import select
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any, NamedTuple, TypeVar
from urllib.parse import quote, urlencode, urlsplit

from queuelog_client._version import __version__
from queuelog_client.errors import (
    Conflict,
    ProblemError,
    QueuelogError,
    ServerError,
    ServerUnreachable,
    TooManyRequests,
    WaitTimeout,
    problem_error,
)
from queuelog_client.steps import suspend_body
from queuelog_client.tracing import trace_headers

__all__ = ["Client", "check_url"]

USER_AGENT = f"queuelog-client/{__version__}"
# Connections kept open for reuse; more than this many idle ones are closed.
MAX_IDLE_CONNECTIONS = 16
# A Retry-After beyond this is not waited out in one sleep: the caller should hear back.
MAX_RETRY_AFTER_SECONDS = 60.0
# The server's bounds the client keeps to (this distribution cannot import the server's
# table, app/core/limits.py): tests/client/test_wire_constants.py checks each against
# /openapi.json. The server waits at most this long in one GET /jobs/{id}?wait_seconds=N,
# and in one claim (wait_seconds); one claim-many takes at most MAX_CLAIM_JOBS jobs; a
# worker's instance label is at most MAX_INSTANCE_CHARS characters.
MAX_WAIT_PER_REQUEST_SECONDS = 60.0
MAX_CLAIM_WAIT_SECONDS = 20.0
MAX_CLAIM_JOBS = 100
MAX_INSTANCE_CHARS = 200
FINISHED_STATUSES = frozenset({"completed", "failed", "cancelled"})

Job = dict[str, Any]
T = TypeVar("T")


def _new_idempotency_key() -> str:
    return str(uuid.uuid4())


class ServerUrl(NamedTuple):
    scheme: str
    host: str
    port: int | None
    prefix: str  # the path the server's routes are under, without a trailing slash


def check_url(url: str) -> ServerUrl:
    """The parts of a server URL, http(s)://host[:port][/prefix]; ValueError, in one line
    saying what is wrong, for anything else."""
    try:
        parts = urlsplit(url)
        port = parts.port  # a ValueError when it is not a port number
    except ValueError as exc:
        raise ValueError(f"url must be http(s)://host[:port][/prefix], not {url!r} "
                         f"({exc})") from None
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        hint = f" (did you mean http://{url}?)" if "://" not in url else ""
        raise ValueError(f"url must be http(s)://host[:port][/prefix], not {url!r}{hint}")
    if parts.query or parts.fragment:
        raise ValueError(f"url must be http(s)://host[:port][/prefix], without a query or "
                         f"fragment, not {url!r}")
    return ServerUrl(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))


class _ConnectionPool:
    """Idle keep-alive connections to one server, shared by the threads of one Client.

    A connection is taken for one request and given back once its answer has been read, so
    each thread in flight has its own and short-lived threads (a worker's job threads) still
    reuse them.
    """

    def __init__(self, scheme: str, host: str, port: int | None,
                 ssl_context: ssl.SSLContext | None) -> None:
        self.scheme, self.host, self.port = scheme, host, port
        self.ssl_context = ssl_context
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def take(self, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        """A connection and whether it was reused (it may have gone stale while idle)."""
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                break
            if _is_dropped(conn):
                conn.close()
                continue
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            return conn, True
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout,
                                               context=self.ssl_context), False
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout), False

    def give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < MAX_IDLE_CONNECTIONS:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _is_dropped(conn: http.client.HTTPConnection) -> bool:
    """An idle keep-alive socket that is readable was closed by the server (or holds junk)."""
    if conn.sock is None:
        return True
    try:
        readable, _, _ = select.select([conn.sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


class _Retryable(Exception):
    """One attempt failed in a way that a later attempt may not."""

    def __init__(self, error: Exception, retry_after: float | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after


class Client:
    """Talks to one queuelog server with one API key. Safe to share between threads.

    `token` defaults to the QUEUELOG_TOKEN environment variable. `timeout` bounds each
    attempt (a long-polling claim adds its `wait_seconds`). `anonymous=True` makes a client
    with no key at all, for complete_waitpoint (whose token is its authority) alone.
    """

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 30.0,
                 max_attempts: int = 5, backoff_seconds: float = 0.25,
                 max_backoff_seconds: float = 10.0,
                 ssl_context: ssl.SSLContext | None = None, anonymous: bool = False) -> None:
        parts = check_url(url)
        if anonymous and token is not None:
            raise ValueError("an anonymous client takes no token")
        if not anonymous:
            token = token if token is not None else os.environ.get("QUEUELOG_TOKEN")
            if not token:
                raise ValueError("no token: pass token= or set QUEUELOG_TOKEN")
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.url = url.rstrip("/")
        self._prefix = parts.prefix
        self._token = token
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.backoff_seconds = backoff_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self._pool = _ConnectionPool(parts.scheme, parts.host, parts.port, ssl_context)

    def __repr__(self) -> str:  # never the token
        return f"Client({self.url!r})"

    def close(self) -> None:
        """Close the idle connections (the client stays usable and reconnects)."""
        self._pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- producers ----------------------------------------------------------------------------

    def enqueue(self, type: str, payload: Mapping[str, Any] | None = None, *,
                priority: str | None = None, max_retries: int | None = None,
                run_at: datetime | str | None = None, delay_seconds: int | None = None,
                idempotency_key: str | None = None,
                concurrency_key: str | None = None,
                unique: Mapping[str, Any] | None = None,
                depends_on: Iterable[int] | None = None,
                on_dependency_failure: str | None = None,
                timeout_seconds: int | None = None,
                expires_at: datetime | str | None = None,
                expires_in_seconds: int | None = None,
                tags: Iterable[str] | None = None,
                traceparent: str | None = None, tracestate: str | None = None) -> Job:
        """Enqueue one job and return it, with `"replayed": True` when the server already
        held a job with this idempotency key (generated when not given).

        `unique` keeps one job for the same work: `{"key", "period_seconds", "while",
        "on_conflict"}`, all optional (`{}` means: the same type and payload, while pending or
        running, return the twin). The job comes back with `"deduplicated"`: False for a new
        job, True when the twin holding the key was returned, "replaced" when it took this
        payload and schedule. `on_conflict="reject"` raises Conflict, whose
        `problem["existing_job_id"]` names the twin.

        `concurrency_key`: with the type's max_running_per_key set, at most that many jobs
        of one (type, concurrency_key) run at once (one customer's jobs, say).

        `depends_on`: ids of jobs (the producer's own) that must finish first; the job is
        `waiting` until they have. `on_dependency_failure`: "cancel" (the server's default:
        a dependency that fails or is cancelled cancels this job) or "run" (it counts as
        finished).

        `timeout_seconds`: each attempt is over that long after its claim (neither lease nor
        heartbeat runs past it): a failed attempt, error "timed out", retried per the
        budget. `expires_at` (a timezone-aware datetime) or `expires_in_seconds`, not both:
        a job not yet claimed by then is cancelled instead of run.

        `tags`: up to 10 labels (1..64 printable ASCII each) the job is listed and filtered
        by; the job shows them as a sorted set. `traceparent` (and `tracestate`): the W3C
        trace context the job carries to its worker (sent as headers); when not given and
        OpenTelemetry is installed, the current span's is sent."""
        body = _job_body(type, payload, priority=priority, max_retries=max_retries,
                         run_at=run_at, delay_seconds=delay_seconds,
                         concurrency_key=concurrency_key, unique=unique, depends_on=depends_on,
                         on_dependency_failure=on_dependency_failure,
                         timeout_seconds=timeout_seconds, expires_at=expires_at,
                         expires_in_seconds=expires_in_seconds, tags=tags)
        return self._post_job(body, idempotency_key, trace_headers(traceparent, tracestate))

    @contextlib.contextmanager
    def reserve(self, type: str, payload: Mapping[str, Any] | None = None, *,
                confirm_within_seconds: int = 60, check_url: str | None = None,
                idempotency_key: str | None = None, **options: Any) -> Iterator[Job]:
        """Reserve a job around your own transaction (docs/JOBS.md, Reserved jobs):

            with client.reserve("email", {"to": email}, idempotency_key=order_key) as job:
                with db:  # your transaction, committed inside the block
                    db.execute("INSERT INTO orders ...")

        The job is stored "reserved" (never claimed) before the block runs, and yielded;
        leaving the block normally confirms it (pending: your commit is done), an exception
        releases it (cancelled) and is raised again. Nobody answering by
        `confirm_within_seconds` (your process died between its commit and the confirm):
        the job's check url (`check_url`, else your key's) is asked whether you committed,
        by the idempotency key; without a check url the job is released at the deadline.

        Conflict when the confirm finds the reservation released already (the deadline or
        the check's answer came first), and on entering when an idempotency key replays a
        reservation decided already (`problem["job"]` is the job as the replay found it: the
        block must not run again). The other options are enqueue's (not unique or
        depends_on)."""
        reserve: dict[str, Any] = {"confirm_within_seconds": confirm_within_seconds}
        if check_url is not None:
            reserve["check_url"] = check_url
        job = self._post_job(_job_body(type, payload, **options) | {"reserve": reserve},
                             idempotency_key, trace_headers())
        if job["status"] != "reserved":
            raise Conflict(409, "Conflict", f"job {job['id']}'s reservation was decided "
                           f"already (it is {job['status']}): this idempotency key's "
                           "reservation is not open any more", problem={"job": job})
        try:
            yield job
        except GeneratorExit:
            # Entered but never left through `with` (the generator collected unfinished):
            # the block's outcome is unknown, so nothing is answered; the check or the
            # deadline decides.
            raise
        except BaseException as error:
            try:
                self.release(job["id"])
            except QueuelogError as failure:
                # The block's own error matters most: the release's failure rides along.
                error.add_note(f"queuelog: job {job['id']} was not released: {failure}")
            raise
        self.confirm(job["id"])

    def confirm(self, job_id: int) -> Job:
        """Confirm a reserved job after your own commit: pending now (or waiting for its
        key's turn). A repeat, or a confirm the check's answer made first, answers the job
        again; Conflict when the reservation was released instead."""
        return self._object("POST", f"/jobs/{int(job_id)}/confirm", {})

    def release(self, job_id: int) -> Job:
        """Release a reserved job (your transaction rolled back): cancelled. A repeat, or a
        release the deadline or the check's answer made first, answers the job again;
        Conflict when the reservation was confirmed instead."""
        return self._object("POST", f"/jobs/{int(job_id)}/release", {})

    def _post_job(self, body: dict[str, Any], idempotency_key: str | None,
                  trace: Mapping[str, str]) -> Job:
        """POST /jobs with an idempotency key (a fresh one when none is given) and the trace
        headers; the job, with "replayed" and "deduplicated"."""
        key = idempotency_key or _new_idempotency_key()
        job: Job
        _, headers, job = self._request("POST", "/jobs", body,
                                        headers={"Idempotency-Key": key, **trace})
        job["replayed"] = headers.get("idempotent-replayed", "").lower() == "true"
        deduplicated = headers.get("deduplicated", "").lower()
        job["deduplicated"] = "replaced" if deduplicated == "replaced" else deduplicated == "true"
        return job

    def enqueue_many(self, jobs: Iterable[Mapping[str, Any]]) -> list[Job]:
        """Enqueue several jobs in one transaction (all or none) and return them in order,
        each with `"replayed"` and `"deduplicated"`. Each item is a POST /jobs body (`type`,
        `payload`, `unique`, `timeout_seconds`, `expires_at` as a datetime or a string, …);
        items without an `idempotency_key` get a fresh one. An item
        whose unique key an earlier item of the batch holds meets that item's job. An item
        may carry a `ref`, and its `depends_on` may name the refs of earlier items beside
        job ids."""
        items = []
        for job in jobs:
            item = _job_fields(job)
            if not item.get("idempotency_key"):
                item["idempotency_key"] = _new_idempotency_key()
            items.append(item)
        # Every job of the batch carries the current OpenTelemetry span's trace, if any.
        jobs_stored: list[Job] = self._object("POST", "/jobs/batch", {"jobs": items},
                                              headers=trace_headers())["jobs"]
        return jobs_stored

    def workflow(self, jobs: Iterable[Mapping[str, Any]], *, name: str | None = None,
                 idempotency_key: str | None = None) -> dict[str, Any]:
        """Create a workflow: several jobs and their dependencies, stored in one transaction
        or not at all. Each item is a POST /jobs body plus a `ref` naming it in the request;
        its `depends_on` mixes the refs of other items (in any order) and ids of existing
        jobs. Returns the workflow as the server stored it: `{"id", "name", "status",
        "jobs": {ref: job id}, "counts", "created_at"}`, with `"replayed": True` when the
        server already held a workflow with this idempotency key.

        Like every enqueue it carries an idempotency key (a fresh one when none is given),
        so the client's own retries never store the workflow twice; the same key with a
        different body raises ValidationFailed."""
        body: dict[str, Any] = {"jobs": [_job_fields(job) for job in jobs]}
        if name is not None:
            body["name"] = name
        key = idempotency_key or _new_idempotency_key()
        created: dict[str, Any]
        _, headers, created = self._request("POST", "/workflows", body,
                                            headers={"Idempotency-Key": key, **trace_headers()})
        created["replayed"] = headers.get("idempotent-replayed", "").lower() == "true"
        return created

    def get_workflow(self, workflow_id: int) -> dict[str, Any]:
        """The workflow (its producer, admins): `{"id", "name", "status", "counts",
        "created_at", "jobs": [{"ref", "id", "type", "status", "depends_on"}]}`, jobs in the
        order they were given. `status` is "running" while any job is unfinished, then
        "completed", "failed" or "cancelled"."""
        return self._object("GET", f"/workflows/{int(workflow_id)}")

    def cancel_workflow(self, workflow_id: int) -> dict[str, Any]:
        """Cancel every waiting and pending job of the workflow (running ones finish);
        returns the workflow as get_workflow shows it."""
        return self._object("POST", f"/workflows/{int(workflow_id)}/cancel", {})

    def list_workflows(self, *, status: str | None = None, limit: int | None = None,
                       cursor: str | None = None) -> dict[str, Any]:
        """One page: `{"workflows": [{"id", "name", "status", "counts", "created_at"}],
        "next_cursor": str or None}`."""
        return self._object("GET", "/workflows" + _query(
            status=status, limit=limit, cursor=cursor))

    def iter_workflows(self, *, status: str | None = None,
                       page_size: int = 100) -> Iterator[dict[str, Any]]:
        """Every workflow the key may see (filtered), following the cursors page by page."""
        cursor = None
        while True:
            page = self.list_workflows(status=status, limit=page_size, cursor=cursor)
            yield from page["workflows"]
            cursor = page.get("next_cursor")
            if not cursor:
                return

    # -- anyone -------------------------------------------------------------------------------

    def get_job(self, job_id: int) -> Job:
        return self._object("GET", f"/jobs/{int(job_id)}")

    def wait(self, job_id: int, timeout: float) -> Job:
        """Wait up to `timeout` seconds for the job to be completed, failed or cancelled and
        return it (its `result`, or its status, says how it went). Raises WaitTimeout, with
        the job as it was last seen, when it has not finished in time.

        The server holds each request up to MAX_WAIT_PER_REQUEST_SECONDS and answers within
        about 100 ms of the job finishing; longer timeouts are covered by asking again."""
        def ask(wait: float) -> tuple[Job, bool, float | None]:
            wait_seconds = round(min(wait, MAX_WAIT_PER_REQUEST_SECONDS), 3)
            _, headers, job = self._request(
                "GET", f"/jobs/{int(job_id)}?wait_seconds={wait_seconds}",
                timeout=self.timeout + wait_seconds)
            return job, job["status"] in FINISHED_STATUSES, _not_waited(headers)

        job = self._long_poll(timeout, ask)
        if job["status"] not in FINISHED_STATUSES:
            raise WaitTimeout(f"job {int(job_id)} is still {job['status']} after "
                              f"{timeout} s", job)
        return job

    def list_jobs(self, *, status: str | None = None, type: str | None = None,
                  tag: str | None = None, limit: int | None = None,
                  cursor: str | None = None) -> dict[str, Any]:
        """One page: `{"jobs": [...], "next_cursor": str or None}`, ordered by id; `tag`:
        only the jobs carrying it."""
        return self._object("GET", "/jobs" + _query(
            status=status, type=type, tag=tag, limit=limit, cursor=cursor))

    def explain(self, job_id: int) -> dict[str, Any]:
        """Why the job is or is not running (admins, or the producer that owns it):
        `{"job_id", "status", "claimable_now", "reasons": [{"code", "message", …}],
        "position", "position_capped", "estimated_start_seconds", "aging"}`, the most
        important reason first; a claimable job's place in its type's line and about when it
        starts (null when not claimable, or not known), and where its type ages priorities,
        `{"priority_now", "next_rise_at"}`."""
        return self._object("GET", f"/jobs/{int(job_id)}/explain")

    def attempts(self, job_id: int) -> list[dict[str, Any]]:
        """The job's attempts, oldest first (admins, or the producer that owns it; only
        admins see each attempt's error)."""
        attempts: list[dict[str, Any]] = self._object(
            "GET", f"/jobs/{int(job_id)}/attempts")["attempts"]
        return attempts

    def dependencies(self, job_id: int) -> list[dict[str, Any]]:
        """The jobs this job depends on, in its `depends_on` order, each `{"id", "type",
        "status", "result"}` (the worker holding or last holding the job, its producer,
        admins): how a job of a workflow reads what the jobs before it produced. Every entry
        of depends_on is there: one the server's retention removed since (it had finished)
        is `{"id", "type": None, "status": "removed", "result": None}`."""
        dependencies: list[dict[str, Any]] = self._object(
            "GET", f"/jobs/{int(job_id)}/dependencies")["dependencies"]
        return dependencies

    def iter_jobs(self, *, status: str | None = None, type: str | None = None,
                  tag: str | None = None, page_size: int = 100) -> Iterator[Job]:
        """Every job the key may see (filtered), following the cursors page by page."""
        cursor = None
        while True:
            page = self.list_jobs(status=status, type=type, tag=tag, limit=page_size,
                                  cursor=cursor)
            yield from page["jobs"]
            cursor = page.get("next_cursor")
            if not cursor:
                return

    # -- workers ------------------------------------------------------------------------------

    def claim(self, *, types: Iterable[str] | None = None, lease_seconds: int | None = None,
              wait_seconds: float = 0, instance: str | None = None) -> Job | None:
        """Claim the most urgent due job (with its `lease_token`), waiting up to
        `wait_seconds` for one; None when there was none. `instance`: this worker
        process's label (e.g. "host:pid"), which GET /workers lists under the key and the
        job's attempt names; shown as reported, it is trusted for nothing."""
        def ask(wait: float) -> tuple[Job | None, bool, float | None]:
            status, headers, job = self._request(
                "POST", "/jobs/claim", _claim_body(types, lease_seconds, wait, instance),
                timeout=self.timeout + wait)
            claimed: Job | None = None if status == 204 else job
            return claimed, claimed is not None, _not_waited(headers)

        return self._long_poll(wait_seconds, ask)

    def claim_many(self, max_jobs: int, *, types: Iterable[str] | None = None,
                   lease_seconds: int | None = None, wait_seconds: float = 0,
                   instance: str | None = None) -> list[Job]:
        """Claim up to `max_jobs` jobs at once, each with its own `lease_token`
        (`instance`: as for claim)."""
        def ask(wait: float) -> tuple[list[Job], bool, float | None]:
            body = _claim_body(types, lease_seconds, wait, instance) | {"max_jobs": max_jobs}
            _, headers, answer = self._request("POST", "/jobs/claim-many", body,
                                               timeout=self.timeout + wait)
            claimed: list[Job] = answer["jobs"]
            return claimed, bool(claimed), _not_waited(headers)

        return self._long_poll(wait_seconds, ask)

    def heartbeat(self, job_id: int, lease_token: str | None = None, *,
                  lease_seconds: int | None = None, progress: tuple[int, int] | None = None,
                  message: str | None = None,
                  checkpoint: Mapping[str, Any] | None = None,
                  wait_if_too_soon: bool = True, instance: str | None = None) -> Job:
        """Extend the lease (by `lease_seconds`, or the server's default) and return the job.
        Its `"cancel_requested"` says whether someone asked for the job's cancel: the
        handler should stop (whatever it reports then, the job ends cancelled).

        `progress`, a (done, total) pair, and `message` are shown in the job's `"progress"`;
        `checkpoint`, a JSON object, is stored (durably, once this returns) and handed to
        the job's next attempt in its claim's `"checkpoint"`. Conflict (409) when the lease
        was lost.

        A job takes one heartbeat a second, and one checkpoint a second: one sent sooner is
        answered 429 with Retry-After, having changed nothing. This waits that long and
        sends it again (`max_attempts` times in all), then raises TooManyRequests; with
        `wait_if_too_soon=False` it raises at the first 429 (the runner plans its next
        heartbeat instead of waiting). `instance`: as for claim (noted as the instance
        seen; the job's attempt keeps its claim's)."""
        body = _fenced(lease_token) | _heartbeat_fields(lease_seconds, progress, message,
                                                        checkpoint, instance)
        path = f"/jobs/{int(job_id)}/heartbeat"
        attempt = 1
        while True:
            try:
                return self._object("POST", path, body)
            except TooManyRequests as too_soon:
                if not wait_if_too_soon or attempt >= self.max_attempts:
                    raise
                attempt += 1
                time.sleep(self._delay(attempt, too_soon.retry_after
                                       if too_soon.retry_after is not None else 1.0))

    def complete(self, job_id: int, lease_token: str | None = None, *,
                 result: Mapping[str, Any] | None = None, traceparent: str | None = None,
                 tracestate: str | None = None) -> Job:
        """Report success. Sent again with the same lease token and result after its answer
        was lost, it answers 200 with the job as the first one left it; without a lease
        token such a repeat answers 409. `traceparent`/`tracestate` (headers): the trace the
        server's report span joins (the runner sends its job's)."""
        body = _fenced(lease_token) | {"result": None if result is None else dict(result)}
        return self._object("POST", f"/jobs/{int(job_id)}/complete", body,
                            headers=_given_trace(traceparent, tracestate))

    def complete_many(self, items: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Complete several jobs (`{"id", "lease_token", "result"}` each); every item is
        answered on its own: `{"id", "status", "job" or "problem"}`."""
        results: list[dict[str, Any]] = self._object(
            "POST", "/jobs/complete-many", {"items": [dict(item) for item in items]})["results"]
        return results

    def suspend(self, job_id: int, lease_token: str | None = None, *,
                seconds: int | None = None, until: datetime | str | None = None,
                event: str | None = None, key: str = "", token: bool = False,
                timeout_seconds: int | None = None,
                checkpoint: Mapping[str, Any] | None = None) -> Job:
        """Suspend a running job: it gives up its lease and waits for exactly one of
        `seconds`, `until` (a timezone-aware datetime or RFC 3339), the event `event` with
        `key`, or a waitpoint (`token=True`), the last two within `timeout_seconds` (which
        the server requires of them). The next claim of the job after its resume carries
        `checkpoint`, as a fail's does, and `"resumed"`.

        Returns the job ("suspended", with "waiting_for"; a token's wait with its
        "waitpoint" `{"token", "url"}`, shown only here), or "pending" with "resumed" when a
        kept event resumed it at once; sent again after its answer was lost, the job again,
        without the waitpoint. Conflict when the caller does not hold the job; ValueError,
        before sending, for no kind of wait or several."""
        body = _fenced(lease_token) | suspend_body(
            seconds=seconds, until=until, event=event, key=key, token=token,
            timeout_seconds=timeout_seconds, checkpoint=checkpoint)
        return self._object("POST", f"/jobs/{int(job_id)}/suspend", body)

    def fail(self, job_id: int, lease_token: str | None = None, *, error: str,
             retry_in_seconds: int | None = None,
             checkpoint: Mapping[str, Any] | None = None, traceparent: str | None = None,
             tracestate: str | None = None) -> Job:
        """Report a failed attempt: the job is pending again (after the backoff, or after
        `retry_in_seconds`) or failed when its retries are spent; "cancelled" when its
        cancel was requested meanwhile. `checkpoint` (a JSON object) is handed to the next
        attempt, as a heartbeat's is. `traceparent`/`tracestate`: as complete's."""
        body = _fenced(lease_token) | {"error": error}
        if retry_in_seconds is not None:
            body["retry_in_seconds"] = retry_in_seconds
        if checkpoint is not None:
            body["checkpoint"] = dict(checkpoint)
        return self._object("POST", f"/jobs/{int(job_id)}/fail", body,
                            headers=_given_trace(traceparent, tracestate))

    # -- admins, and producers for their own jobs ----------------------------------------------

    def cancel(self, job_id: int) -> Job:
        """Cancel a job (admins, or the producer that owns it; another producer's job is
        NotFound). A pending or waiting job is cancelled at once. A running job only has its
        cancel requested: it stays "running" with `"cancel_requested": True` until the worker
        holding it reports (or its lease runs out), and then ends "cancelled", never retried.
        Asking again changes nothing."""
        return self._object("POST", f"/jobs/{int(job_id)}/cancel", {})

    # -- admins -------------------------------------------------------------------------------

    def retry(self, job_id: int) -> Job:
        return self._object("POST", f"/jobs/{int(job_id)}/retry", {})

    # -- suspended jobs: events and waitpoints (docs/CLIENT.md, Durable steps and waits) ------

    def post_event(self, name: str, data: Mapping[str, Any] | None = None, *, key: str = "",
                   producer: str | None = None,
                   idempotency_key: str | None = None) -> dict[str, Any]:
        """Post an event (for the caller's own jobs; an admin may name another `producer`):
        resumes every job of that producer suspended on `name` and `key`, handing them
        `data`; an event nobody waits for yet is kept a while, and the next wait for it
        resumes at once. Returns `{"woken": n}`. It carries an idempotency key (a fresh one
        when none is given), so the client's own retries post it once."""
        body: dict[str, Any] = {"name": name, "key": key}
        if data is not None:
            body["data"] = dict(data)
        if producer is not None:
            body["producer"] = producer
        return self._object("POST", "/events", body, headers={
            "Idempotency-Key": idempotency_key or _new_idempotency_key()})

    def complete_waitpoint(self, token: str, data: Mapping[str, Any] | None = None
                           ) -> dict[str, Any]:
        """Complete a suspended job's waitpoint: the job resumes with `data`. No key is
        sent (the token is the authority; `Client(url, anonymous=True)` will do). NotFound
        for an unknown token; Conflict when it was completed already, which after a retry
        of a lost answer may be this call's own first completion."""
        body = {} if data is None else {"data": dict(data)}
        return self._object("POST", f"/waitpoints/{quote(token, safe='')}", body,
                            authorize=False)

    # -- the wire -----------------------------------------------------------------------------

    def _object(self, method: str, path: str, body: Any = None, *,
                headers: Mapping[str, str] | None = None,
                timeout: float | None = None, authorize: bool = True) -> dict[str, Any]:
        """The JSON object a route answers with (every route here but a claim's 204)."""
        answer: dict[str, Any] = self._request(method, path, body, headers=headers,
                                               timeout=timeout, authorize=authorize)[2]
        return answer

    def _request(self, method: str, path: str, body: Any = None, *,
                 headers: Mapping[str, str] | None = None,
                 timeout: float | None = None,
                 authorize: bool = True) -> tuple[int, dict[str, str], Any]:
        """Send with retries; (status, lower-cased headers, parsed JSON or None). The key
        goes along unless `authorize` is False (or the client has none)."""
        # Encoding first: a payload that is not JSON is the caller's error, raised at once.
        data = None if body is None else json.dumps(
            body, allow_nan=False, separators=(",", ":"), ensure_ascii=False).encode()
        all_headers = {"Accept": "application/json", "User-Agent": USER_AGENT,
                       **(headers or {})}
        if authorize and self._token is not None:
            all_headers["Authorization"] = f"Bearer {self._token}"
        if data is not None:
            all_headers["Content-Type"] = "application/json"
        attempt_timeout = self.timeout if timeout is None else timeout
        for attempt in range(1, self.max_attempts + 1):
            try:
                return self._attempt(method, self._prefix + path, data, all_headers,
                                     attempt_timeout)
            except _Retryable as failure:
                if attempt == self.max_attempts:
                    if isinstance(failure.error, ProblemError):
                        raise failure.error from None
                    raise ServerUnreachable(
                        f"{method} {path}: no answer from {self.url} after {attempt} "
                        f"attempts ({failure.error!r})") from failure.error
                time.sleep(self._delay(attempt, failure.retry_after))
        raise AssertionError("unreachable")  # the loop returns or raises

    def _long_poll(self, wait_seconds: float,
                   ask: Callable[[float], tuple[T, bool, float | None]]) -> T:
        """Ask until done or `wait_seconds` have passed; the last answer. `ask(wait)` sends
        one request that may wait that long: (answer, done, Retry-After when the server
        said it did not wait)."""
        deadline = time.monotonic() + max(wait_seconds, 0.0)
        not_waited = 0
        while True:
            answer, done, retry_after = ask(max(deadline - time.monotonic(), 0.0))
            remaining = deadline - time.monotonic()
            if done or remaining <= 0:
                return answer
            if retry_after is not None:
                not_waited += 1
                time.sleep(min(self._delay_after_not_waited(not_waited, retry_after),
                               remaining))

    def _delay_after_not_waited(self, times: int, retry_after: float) -> float:
        """The pause after the `times`-th answer in a row that did not wait: its Retry-After,
        then the retries' jittered backoff, so that the clients a full server turned away
        together do not come back together."""
        return min(retry_after, MAX_RETRY_AFTER_SECONDS) + self._delay(times, None)

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, MAX_RETRY_AFTER_SECONDS)
        ceiling = min(self.backoff_seconds * 2 ** (attempt - 1), self.max_backoff_seconds)
        # Jitter spreads the retries of many clients that failed at the same moment.
        return random.uniform(ceiling / 2, ceiling)

    def _attempt(self, method: str, path: str, data: bytes | None,
                 headers: dict[str, str], timeout: float) -> tuple[int, dict[str, str], Any]:
        conn, reused = self._pool.take(timeout)
        try:
            response = self._exchange(conn, method, path, data, headers)
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            conn.close()
            if not reused:
                raise _Retryable(ServerUnreachable("connection closed")) from None
            # The server closed an idle keep-alive connection just as it was reused: the
            # request never reached the application, so one more try is free.
            conn, _ = self._pool.take(timeout)
            try:
                response = self._exchange(conn, method, path, data, headers)
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                raise _retryable_transport_error(exc) from None
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise _retryable_transport_error(exc) from None

        status, response_headers, raw = response
        if response_headers.get("connection", "").lower() == "close":
            conn.close()
        else:
            self._pool.give_back(conn)
        parsed = _parse_json(raw)
        if status < 400:
            return status, response_headers, parsed
        error = problem_error(status, parsed, http.client.responses.get(status, "Error"),
                              _retry_after(response_headers.get("retry-after")))
        if isinstance(error, ServerError):
            raise _Retryable(error, error.retry_after if status == 503 else None)
        raise error

    @staticmethod
    def _exchange(conn: http.client.HTTPConnection, method: str, path: str,
                  data: bytes | None, headers: dict[str, str]
                  ) -> tuple[int, dict[str, str], bytes]:
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        raw = response.read()
        response_headers = {name.lower(): value for name, value in response.getheaders()}
        if response.will_close:
            response_headers["connection"] = "close"
        return response.status, response_headers, raw


def _retryable_transport_error(exc: BaseException) -> Exception:
    if isinstance(exc, ssl.SSLCertVerificationError):
        # A certificate that does not verify will not verify on the next attempt either.
        return ServerUnreachable(f"TLS verification failed: {exc}")
    return _Retryable(exc if isinstance(exc, Exception) else Exception(str(exc)))


def _parse_json(raw: bytes) -> Any:
    if not raw:
        return None
    with contextlib.suppress(ValueError):
        return json.loads(raw)
    return None


def _retry_after(value: str | None) -> float | None:
    """Retry-After as seconds: a number of seconds or an HTTP date."""
    if not value:
        return None
    with contextlib.suppress(ValueError):
        return max(0.0, float(value))
    with contextlib.suppress(TypeError, ValueError):
        when = parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time())
    return None


def _not_waited(headers: Mapping[str, str]) -> float | None:
    """A 2xx answer to a request that asked to wait carries Retry-After only when the server
    could not wait (its budget of waiting requests was full): how long to pause, or None."""
    if "retry-after" not in headers:
        return None
    seconds = _retry_after(headers["retry-after"])
    return 1.0 if seconds is None else seconds


def _query(**parameters: Any) -> str:
    """`?name=value&…` of the parameters given (not None), or "" when there are none."""
    given = {name: value for name, value in parameters.items() if value is not None}
    return f"?{urlencode(given)}" if given else ""


def _job_fields(job: Mapping[str, Any]) -> dict[str, Any]:
    """A POST /jobs body given as a mapping (an item of a batch or a workflow), ready to
    send: a datetime `run_at` or `expires_at` as RFC 3339."""
    item = dict(job)
    for name in ("run_at", "expires_at"):
        if isinstance(item.get(name), datetime):
            item[name] = _rfc3339(item[name], name)
    return item


def _rfc3339(moment: datetime, name: str = "run_at") -> str:
    if moment.tzinfo is None:
        raise ValueError(f"{name} must be timezone-aware (a naive datetime is ambiguous)")
    return moment.isoformat()


def _enqueue_body(type: str, payload: Mapping[str, Any] | None, priority: str | None,
                  max_retries: int | None, run_at: datetime | str | None,
                  delay_seconds: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {"type": type, "payload": dict(payload or {})}
    if priority is not None:
        body["priority"] = priority
    if max_retries is not None:
        body["max_retries"] = max_retries
    if run_at is not None:
        body["run_at"] = _rfc3339(run_at) if isinstance(run_at, datetime) else run_at
    if delay_seconds is not None:
        body["delay_seconds"] = delay_seconds
    return body


def _job_body(type: str, payload: Mapping[str, Any] | None = None, *,
              priority: str | None = None, max_retries: int | None = None,
              run_at: datetime | str | None = None, delay_seconds: int | None = None,
              concurrency_key: str | None = None, unique: Mapping[str, Any] | None = None,
              depends_on: Iterable[int] | None = None,
              on_dependency_failure: str | None = None, timeout_seconds: int | None = None,
              expires_at: datetime | str | None = None,
              expires_in_seconds: int | None = None,
              tags: Iterable[str] | None = None) -> dict[str, Any]:
    """A POST /jobs body of enqueue's options (those given)."""
    body = _enqueue_body(type, payload, priority, max_retries, run_at, delay_seconds)
    body |= _running_limits(timeout_seconds, expires_at, expires_in_seconds)
    if concurrency_key is not None:
        body["concurrency_key"] = concurrency_key
    if unique is not None:
        body["unique"] = dict(unique)
    if depends_on is not None:
        body["depends_on"] = [int(job_id) for job_id in depends_on]
    if on_dependency_failure is not None:
        body["on_dependency_failure"] = on_dependency_failure
    if tags is not None:
        if isinstance(tags, str):
            raise TypeError("tags must be a list of strings, not one string")
        body["tags"] = list(tags)
    return body


def _running_limits(timeout_seconds: int | None, expires_at: datetime | str | None,
                    expires_in_seconds: int | None) -> dict[str, Any]:
    """The enqueue fields that bound a job's running: each attempt's timeout, and when the
    job expires unclaimed. Giving both expiries is left to the server to refuse (422 naming
    them), as run_at with delay_seconds is."""
    fields: dict[str, Any] = {}
    if timeout_seconds is not None:
        fields["timeout_seconds"] = timeout_seconds
    if expires_at is not None:
        fields["expires_at"] = (_rfc3339(expires_at, "expires_at")
                                if isinstance(expires_at, datetime) else expires_at)
    if expires_in_seconds is not None:
        fields["expires_in_seconds"] = expires_in_seconds
    return fields


def _heartbeat_fields(lease_seconds: int | None, progress: tuple[int, int] | None,
                      message: str | None, checkpoint: Mapping[str, Any] | None,
                      instance: str | None = None) -> dict[str, Any]:
    """A heartbeat's body beside its lease token: only what was given."""
    fields: dict[str, Any] = {} if instance is None else {"instance": instance}
    if lease_seconds is not None:
        fields["lease_seconds"] = lease_seconds
    if progress is not None:
        done, total = progress
        fields["progress"] = {"done": done, "total": total}
    if message is not None:
        fields["message"] = message
    if checkpoint is not None:
        fields["checkpoint"] = dict(checkpoint)
    return fields


def _claim_body(types: Iterable[str] | None, lease_seconds: int | None,
                wait_seconds: float, instance: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"wait_seconds": wait_seconds}
    if instance is not None:
        body["instance"] = instance
    if types is not None:
        body["types"] = list(types)
    if lease_seconds is not None:
        body["lease_seconds"] = lease_seconds
    return body


def _given_trace(traceparent: str | None, tracestate: str | None) -> dict[str, str]:
    """A report's trace headers: only those given (a report is no new work to trace)."""
    return trace_headers(traceparent, tracestate) if traceparent else {}


def _fenced(lease_token: str | None) -> dict[str, Any]:
    return {} if lease_token is None else {"lease_token": lease_token}
