"""`queuelog dispatch`: claims jobs of push types and POSTs each to its type's endpoint.

The main thread claims, through JobService.claim like any worker (the same transaction, flow
control and lease rescue), as many jobs as delivery threads are free and their origins let
start (app/dispatch/adaptive.py: each push origin's adaptive limit and Retry-After hold);
`concurrency` daemon threads deliver them and report each outcome through
JobService.complete/fail, as a worker would, under the claim's lease token. A job's lease is
its type's timeout plus PUSH_LEASE_MARGIN_SECONDS, so types are claimed in groups of one
timeout. A thread of its own writes each origin's figure where GET /types reads it
(app/dispatch/origin_figures.py).

Stopping (SIGTERM, SIGINT): no further claim; deliveries in flight get `grace_seconds` to
finish; any still unanswered then is released (a failed attempt, retried at once, as a
lease expiry would make it: the receiver may have acted on it) and the process exits 0.
A dispatcher killed outright loses nothing either: its leases expire and maintenance takes
the jobs back.

One more thread looks for the checks of reservations left unanswered past their deadline,
and `checks.concurrency` threads of their own ask them, at most `checks.per_origin` at one
origin (app/dispatch/check_rounds.py). Deliveries and checks share the HTTP client: its
pool holds, per host, a connection for each delivery thread and each check an origin may
have in flight, so neither ever waits for the other's connections.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import signal
import threading
import time
import traceback
from collections import defaultdict
from dataclasses import dataclass, replace
from types import FrameType

from sqlalchemy.exc import SQLAlchemyError

from app.core.callers import Caller, Role
from app.core.clock import MICROS, Clock
from app.core.errors import Conflict, NotFound, ServiceUnavailable, ValidationFailed
from app.core.priorities import Priority
from app.core.redaction import display_url, redact_error, scrub_url
from app.dispatch.adaptive import (
    NOTHING_SAID,
    OriginLimits,
    Said,
    Ticket,
    origin_caps,
    origin_of,
    said_by,
)
from app.dispatch.check_rounds import Checker
from app.dispatch.checks import CheckSettings
from app.dispatch.http import DeliveryFailed, Endpoint, PushClient
from app.dispatch.metrics import DispatchMetrics
from app.dispatch.origin_figures import FigureRecorder
from app.dispatch.outcome import Kind, Outcome, outcome_of
from app.jobs.usecases.claim import Claimed
from app.jobs.usecases.service import JobService
from app.jobs.web.answers import represent
from app.types.models import PUSH_LEASE_MARGIN_SECONDS, TypeSettings, push_origin_refusal
from app.types.service import TypeService
from queuelog_client.signature import SIGNATURE_HEADER, signature_header

log = logging.getLogger(__name__)

# The worker name of every push claim: a key name never holds ':', so no worker key can
# report on (complete, fail) a job the dispatcher holds.
DISPATCHER_NAME = "queuelog:dispatch"
# Idle: wait this long before claiming again, doubling up to the maximum while nothing comes.
IDLE_WAIT_SECONDS = (0.02, 0.5)
# Where the database tells of each job that becomes claimable (PostgreSQL): the idle wait's
# and the reservation checks' longest, a safety net (a push type's rate tokens come back
# untold; a reservation's check comes due untold).
TOLD_IDLE_SECONDS = 5.0
# How soon an idle wait sees stop().
_STOP_CHECK_SECONDS = 0.5
# How long a stopping dispatcher waits for its last figures to be written (the database may
# be away).
RECORD_JOIN_SECONDS = 5.0
# Push settings are read again at most this often (a change applies within it).
TARGETS_MAX_AGE_SECONDS = 1.0
# What a delivery leaves of its lease to record the outcome: the deadline of a job that
# waited for a thread is cut to fit, so no delivery outlives its lease.
REPORT_SECONDS = 5.0
LEASE_SPENT_ERROR = ("not sent: the job's lease ran out before a delivery thread was free "
                     "(retried)")
DISPATCHER_ERROR = ("dispatcher error: {} while delivering or recording the outcome (the "
                    "receiver may have received the delivery); see the dispatcher's log")
RELEASED_ERROR = ("released: the dispatcher stopped before the receiver answered (it may "
                  "have received the delivery)")
HELD_ERROR = ("not sent: the receiver's Retry-After, come after the claim, outlasts what the "
              "job's lease leaves (retried when it ends)")


def dispatcher_caller() -> Caller:
    return Caller(name=DISPATCHER_NAME, role=Role.WORKER, max_priority=Priority.LOW,
                  allowed_types=None, internal=True)


@dataclass(frozen=True)
class Delivery:
    claimed: Claimed
    target: TypeSettings
    ticket: Ticket  # its slot at its origin


def delivery_body(claimed: Claimed) -> bytes:
    """The job as its producer sees it (no error, no lease token), with its attempt number,
    as compact UTF-8 JSON."""
    job = claimed.job
    shown = represent(job, show_error=False)
    shown["attempt"] = job.retry_count + 1
    return json.dumps(shown, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class Dispatcher:
    def __init__(self, jobs: JobService, types: TypeService, *, concurrency: int,
                 grace_seconds: float, metrics: DispatchMetrics, clock: Clock,
                 checks: CheckSettings | None = None,
                 client: PushClient | None = None,
                 limits: OriginLimits | None = None) -> None:
        self.jobs = jobs
        self.types = types
        self.concurrency = concurrency
        self.grace_seconds = grace_seconds
        self.metrics = metrics
        self.clock = clock
        self.checks = checks or CheckSettings()
        self.client = client or PushClient(
            max_connections_per_host=concurrency + self.checks.per_origin)
        self.caller = dispatcher_caller()
        self.max_body_bytes = jobs.max_payload_bytes
        self._stopping = threading.Event()
        self._work: queue.Queue[Delivery] = queue.Queue()
        self._lock = threading.Condition()
        self._in_flight: dict[int, Delivery] = {}  # by job id: claimed, not yet reported
        self._released: set[int] = set()
        self._targets: dict[str, TypeSettings] = {}
        self._targets_read_at = -TARGETS_MAX_AGE_SECONDS
        self._rotation = 0
        self._failing = False  # the last claim met a database that did not answer
        self.origins = limits or OriginLimits(clock.now_us, concurrency)
        self.figures = FigureRecorder(types.db, clock, self.origins, metrics)
        self.idle_max = IDLE_WAIT_SECONDS[1]
        self.check_interval: float | None = None  # None: the checker's own

    def told_by_database(self) -> None:
        """The database tells this process when a job becomes claimable (jobs.signal is
        woken): idle waits, and the looks for due reservation checks, stretch to
        TOLD_IDLE_SECONDS."""
        self.idle_max = self.check_interval = TOLD_IDLE_SECONDS

    # -- running --------------------------------------------------------------------------

    def stop(self, *_args: object) -> None:
        """Stop claiming; run() then finishes or releases what is in flight and returns."""
        self._stopping.set()
        with self._lock:
            self._lock.notify_all()

    def _check_forever(self) -> None:
        """Ask the due checks of reservations until stop() (app/dispatch/check_rounds.py)."""
        checker = Checker(self.jobs.reservations, self.client, self.clock, self.checks)
        if self.check_interval is not None:
            checker.interval = self.check_interval
        checker.run(self._stopping)

    def install_signal_handlers(self) -> None:
        def on_signal(signum: int, _frame: FrameType | None) -> None:
            log.info("dispatch: %s: stopping", signal.Signals(signum).name)
            self.stop()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    def run(self) -> None:
        """Deliver until stop() (a signal); returns once nothing is in flight."""
        for number in range(self.concurrency):
            threading.Thread(target=self._deliver_forever, name=f"queuelog-push-{number}",
                             daemon=True).start()
        threading.Thread(target=self._check_forever, name="queuelog-checks",
                         daemon=True).start()
        recording = threading.Thread(target=self.figures.run, args=(self._stopping,),
                                     name="queuelog-origins", daemon=True)
        recording.start()
        log.info("dispatch: started, %d delivery threads", self.concurrency)
        idle = IDLE_WAIT_SECONDS[0]
        try:
            while not self._stopping.is_set():
                free = self._wait_for_free_thread()
                if free <= 0:
                    continue
                seen = self.jobs.signal.generation
                if self._claim_some(free):
                    idle = IDLE_WAIT_SECONDS[0]
                else:
                    # No longer than the soonest Retry-After hold: its origin's jobs are
                    # claimable again when it ends, and nothing tells of that.
                    hold_ends = self.origins.next_hold_end_in()
                    if self._idle(idle if hold_ends is None else min(idle, hold_ends), seen):
                        idle = IDLE_WAIT_SECONDS[0]
                    else:
                        idle = min(idle * 2, self.idle_max)
        finally:
            self._finish_in_flight()
            # Its last figures written before the gauges are closed, not after.
            recording.join(timeout=RECORD_JOIN_SECONDS)
            self.metrics.close()
        log.info("dispatch: stopped")

    def _idle(self, seconds: float, seen: int) -> bool:
        """Wait `seconds` before claiming again, or less when a job may have become
        claimable since the generation `seen` (True then) or the dispatcher stops."""
        deadline = time.monotonic() + seconds
        while not self._stopping.is_set() and (left := deadline - time.monotonic()) > 0:
            if self.jobs.signal.wait(seen, min(left, _STOP_CHECK_SECONDS)):
                return True
        return False

    def _wait_for_free_thread(self) -> int:
        with self._lock:
            self._lock.wait_for(lambda: len(self._in_flight) < self.concurrency
                                or self._stopping.is_set(), timeout=1.0)
            return self.concurrency - len(self._in_flight)

    def _claim_some(self, free: int) -> bool:
        """Claim up to `free` jobs of the push types that their origins let start now, a
        group of one timeout at a time (the groups taken in turn, so one busy group cannot
        starve another); True if any."""
        try:
            targets = self._push_targets()
            # Where the database tells, it tells this process of the push types' jobs.
            self.jobs.signal.before_wait(targets)
            groups: dict[int, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
            for target in targets.values():
                groups[target.push_timeout_seconds or 0][origin_of(target)].append(target.type)
            order = sorted(groups)
            if not order:
                return False
            self._rotation = (self._rotation + 1) % len(order)
            claimed_any = False
            for timeout in order[self._rotation:] + order[:self._rotation]:
                lease_seconds = timeout + PUSH_LEASE_MARGIN_SECONDS
                for types, limit in self._claims_within_room(groups[timeout], free):
                    if free <= 0 or self._stopping.is_set():
                        break
                    claimed = self.jobs.claim(self.caller, types=types,
                                              lease_seconds=lease_seconds,
                                              limit=min(limit, free), push=True)
                    for one in claimed:
                        # Claimed of these types alone: each has its target.
                        target = targets[one.job.type]
                        self._hand_out(Delivery(one, target,
                                                self.origins.started(origin_of(target))))
                        free -= 1
                        claimed_any = True
        except (SQLAlchemyError, ServiceUnavailable) as exc:
            # The database may be away for a moment: the dispatcher outlives it, like a
            # worker whose claims answer 503, and claims again after the idle wait. Said
            # once per outage, as the tickers do, not twice a second.
            if not self._failing:
                log.warning("dispatch: the database did not answer (%s); claiming again "
                            "until it does", type(exc).__name__)
            self._failing = True
            return False
        except Exception:
            log.exception("dispatch: a claim failed; trying again")
            return False
        if self._failing:
            log.warning("dispatch: the database answers again; claiming resumed")
            self._failing = False
        return claimed_any

    def _claims_within_room(self, origins: dict[str, list[str]],
                            free: int) -> list[tuple[list[str], int]]:
        """The claims (types, at most how many) that take a group's jobs without starting
        more at an origin than it has room for: each origin with less room than `free` claims
        its own, first (its room is small), and the origins with room for `free` share one
        (it takes no more than that). A held or full origin claims nothing."""
        own: list[tuple[list[str], int]] = []
        shared: list[str] = []
        for origin, types in sorted(origins.items()):
            room = self.origins.room(origin)
            if room >= free:
                shared += types
            elif room > 0:
                own.append((types, room))
        return [*own, (shared, free)] if shared else own

    def _push_targets(self) -> dict[str, TypeSettings]:
        if time.monotonic() - self._targets_read_at >= TARGETS_MAX_AGE_SECONDS:
            self._targets = self.types.push_targets()
            self._targets_read_at = time.monotonic()
            self.origins.set_caps(origin_caps(self._targets.values(), self.concurrency))
        return self._targets

    def _hand_out(self, delivery: Delivery) -> None:
        with self._lock:
            self._in_flight[delivery.claimed.job.id] = delivery
        self._work.put(delivery)

    # -- delivering -----------------------------------------------------------------------

    def _deliver_forever(self) -> None:
        while True:
            delivery = self._work.get()
            try:
                self._deliver(delivery)
            except Exception as exc:
                # A fault of ours, not the receiver's: the attempt still ends now, as a
                # failed one saying so, rather than holding the job until its lease lapses.
                # (The traceback may quote the push url: logged in its display form.)
                trace = "".join(traceback.format_exception(exc))
                log.error("dispatch: delivering job %d failed:\n%s", delivery.claimed.job.id,
                          scrub_url(trace, delivery.target.push_url or ""))
                self._end_attempt(delivery, exc)
            finally:
                # Its slot at the origin, if nothing gave it back (not sent, or a fault).
                self._origin_told(delivery, NOTHING_SAID)
                with self._lock:
                    self._in_flight.pop(delivery.claimed.job.id, None)
                    self._lock.notify_all()

    def _deliver(self, delivery: Delivery) -> None:
        job, target = delivery.claimed.job, delivery.target
        body = delivery_body(delivery.claimed)
        timestamp = self.clock.now_us() // MICROS
        attempt = job.retry_count + 1
        headers = {
            "Content-Type": "application/json",
            "Queuelog-Job-Id": str(job.id),
            "Queuelog-Attempt": str(attempt),
            SIGNATURE_HEADER: signature_header(target.push_secret or "", timestamp, body,
                                               job_id=job.id, attempt=attempt),
        }
        if delivery.claimed.trace is not None:
            # The producer's trace context, unchanged (docs/TRACING.md): the receiver's spans
            # join the producer's trace as a worker's would.
            headers.update(delivery.claimed.trace.as_headers())
        refused = push_origin_refusal(target.push_url or "", self.types.push_origins)
        if refused:
            # Set before the operator's list changed: never sent, whatever it names.
            error = (f"not sent: the push url ({display_url(target.push_url or '')}) is "
                     f"refused: {refused}")
            self._report(delivery, Outcome(Kind.REFUSED, error=error), None)
            return
        if not self._wait_out_hold(delivery):
            return
        endpoint = Endpoint.parse(target.push_url or "")
        lease_left = ((job.lease_expires_at or 0) - self.clock.now_us()) / MICROS
        seconds = min(float(target.push_timeout_seconds or 1), lease_left - REPORT_SECONDS)
        if seconds <= 0:
            self._report(delivery, Outcome(Kind.TIMEOUT, error=LEASE_SPENT_ERROR), None)
            return
        self.metrics.started()
        started = time.monotonic()
        try:
            answer = self.client.post(endpoint, body, headers, seconds, self.max_body_bytes)
            outcome = outcome_of(answer, self.clock.now_us() / MICROS)
        except DeliveryFailed as failed:
            kind = Kind.TIMEOUT if failed.timed_out else Kind.CONNECTION_ERROR
            outcome = Outcome(kind, error=f"{failed} ({display_url(target.push_url or '')})")
        self._origin_told(delivery, said_by(outcome))
        self._report(delivery, outcome, time.monotonic() - started)

    def _wait_out_hold(self, delivery: Delivery) -> bool:
        """Wait for the end of a Retry-After hold of the delivery's origin that came after
        its claim (the claim loop claims nothing for a held origin); True: send it now.
        False: the job was released meanwhile, or the hold ends too late to leave the
        delivery its whole timeout within its lease, and the attempt was ended, retried when
        the hold is over."""
        job = delivery.claimed.job
        timeout = float(delivery.target.push_timeout_seconds or 1)
        while (held := self.origins.held_for(delivery.ticket.origin)) > 0:
            with self._lock:
                if job.id in self._released:
                    return False
            lease_left = ((job.lease_expires_at or 0) - self.clock.now_us()) / MICROS
            if held > lease_left - REPORT_SECONDS - timeout:
                self._report(delivery, Outcome(Kind.RETRY_AFTER, error=HELD_ERROR,
                                               retry_in_seconds=math.ceil(held)), None)
                return False
            time.sleep(min(held, _STOP_CHECK_SECONDS))
        return True

    def _origin_told(self, delivery: Delivery, said: Said) -> None:
        """Give the delivery's slot back to its origin, with what its outcome says of it."""
        if self.origins.finished(delivery.ticket, said):
            # The claim loop passed the origin by, full or held, and may idle until told of
            # new jobs: its jobs are claimable again.
            self.jobs.signal.notify_here()

    def _report(self, delivery: Delivery, outcome: Outcome, seconds: float | None) -> None:
        """Record the outcome; `seconds` the delivery took, None when it was never sent."""
        claimed = delivery.claimed
        job_id = claimed.job.id
        with self._lock:
            if job_id in self._released:
                return  # released at shutdown: the job is no longer ours to report on
        if outcome.error is not None:
            # What urllib3 or the receiver said may quote the url, query and all: the error
            # is stored and logged with the url in its display form (no secret of it).
            outcome = replace(outcome, error=scrub_url(outcome.error,
                                                       delivery.target.push_url or ""))
        if seconds is None:
            self.metrics.count(claimed.job.type, outcome.kind)
        else:
            self.metrics.finished(claimed.job.type, outcome.kind, seconds)
        try:
            if outcome.completed:
                self._complete(claimed, outcome)
            else:
                self.jobs.fail(self.caller, job_id, lease_token=claimed.lease_token,
                               error=outcome.error or outcome.kind.value,
                               retry_in_seconds=outcome.retry_in_seconds,
                               delivered=outcome.status)
        except (Conflict, NotFound) as refused:
            # The lease ran out first (the job was taken back) or an admin changed the job:
            # its new owner has the word.
            log.warning("dispatch: the outcome of job %d was refused: %s", job_id,
                        refused.detail)
        if outcome.kind is not Kind.COMPLETED:
            log.info("dispatch: job %d (%s) attempt %d: %s", job_id, claimed.job.type,
                     claimed.job.retry_count + 1, redact_error(outcome.error or "")[:300])

    def _end_attempt(self, delivery: Delivery, exc: Exception) -> None:
        claimed = delivery.claimed
        with self._lock:
            if claimed.job.id in self._released:
                return
        try:
            self.jobs.fail(self.caller, claimed.job.id, lease_token=claimed.lease_token,
                           error=DISPATCHER_ERROR.format(type(exc).__name__),
                           retry_in_seconds=None)
        except (Conflict, NotFound):
            pass  # its outcome was recorded before the fault, or the job is no longer ours
        except Exception:
            log.exception("dispatch: could not end the attempt of job %d; its lease will "
                          "expire", claimed.job.id)

    def _complete(self, claimed: Claimed, outcome: Outcome) -> None:
        try:
            self.jobs.complete(self.caller, claimed.job.id, lease_token=claimed.lease_token,
                               result=outcome.result, delivered=outcome.status)
        except ValidationFailed:
            # The body was a JSON object past the payload limit: completed, without it.
            self.jobs.complete(self.caller, claimed.job.id, lease_token=claimed.lease_token,
                               result=None, delivered=outcome.status)

    # -- stopping -------------------------------------------------------------------------

    def _finish_in_flight(self) -> None:
        deadline = time.monotonic() + self.grace_seconds
        with self._lock:
            self._lock.wait_for(lambda: not self._in_flight,
                                timeout=max(0.0, deadline - time.monotonic()))
            left = list(self._in_flight.values())
            self._released.update(d.claimed.job.id for d in left)
        # Queued, never sent, and sent without an answer alike: released.
        for delivery in left:
            claimed = delivery.claimed
            try:
                self.jobs.fail(self.caller, claimed.job.id, lease_token=claimed.lease_token,
                               error=RELEASED_ERROR, retry_in_seconds=0)
                self.metrics.count(claimed.job.type, Kind.RELEASED)
            except Exception:
                log.exception("dispatch: could not release job %d; its lease will expire",
                              claimed.job.id)
        if left:
            log.warning("dispatch: released %d delivery(ies) still in flight", len(left))

