"""Reservations' checks (docs/JOBS.md): the dispatcher asks a reservation's check url, after its
deadline, whether its producer committed.

    GET <check_url>?job_id=<id>&idempotency_key=<key, or empty>
    Queuelog-Job-Id: <id>
    Queuelog-Attempt: <the check's number: 1, 2, ...>
    Queuelog-Signature: t=<unix s>,v1=...,v2=...   (the push scheme, the query for the body)

The HMAC key is the producer key's check secret (`queuelog keys check-secret NAME`); the
producer checks it with queuelog_client.signature.verify_check. 200 {"commit": true}
confirms the job, {"commit": false} releases it (exactly these bodies: answered_commit);
anything else (another status or body, a timeout, no connection) is asked again after a
backoff, until the ticker releases the job 24 hours after its deadline
(app/jobs/usecases/reservations.py). Redirects are not followed. A check names its own job by
id, and an answer says nothing but its commit: no answer can reach another job, let alone another
producer's.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from app.core.clock import MICROS, Clock
from app.core.origins import disguised_step_refusal
from app.core.redaction import display_url
from app.dispatch.http import DeliveryFailed, Endpoint, PushClient
from app.jobs.sql.reservation_repository import DueCheck
from app.jobs.usecases.reservations import Reservations
from queuelog_client.signature import SIGNATURE_HEADER, signature_header

log = logging.getLogger(__name__)

# An answer is a small JSON object: more than this is not one.
MAX_ANSWER_BYTES = 4096
# Between the unanswered checks of one reservation: 1 s, doubling, at most 5 minutes.
BACKOFF_SECONDS = (1.0, 300.0)


@dataclass(frozen=True)
class CheckSettings:
    """How the dispatcher asks checks (QUEUELOG_CHECK_*, app/config.py, where the defaults
    are documented): at most `concurrency` at once, at most `per_origin` of them at one
    origin, each answered whole within `timeout_seconds` or given up."""

    concurrency: int = 64
    per_origin: int = 16
    timeout_seconds: float = 5.0


def check_target(check_url: str, job_id: int, idempotency_key: str | None) -> tuple[str, str]:
    """The url a check GETs and its whole query string, as sent and signed (a check url's
    own query, if it has one, comes first)."""
    base, _, own = check_url.partition("?")
    ours = urlencode({"job_id": job_id, "idempotency_key": idempotency_key or ""})
    query = f"{own}&{ours}" if own else ours
    return f"{base}?{query}", query


class _NotAnAnswer(ValueError):
    """The body is not exactly one of the two answers."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    if len({key for key, _ in pairs}) != len(pairs):
        # JSON leaves duplicate keys to the reader; "last wins" would let
        # {"commit": false, "commit": true} mean what a reader that keeps the first does not.
        raise _NotAnAnswer("a key appears twice")
    return dict(pairs)


def answered_commit(status: int, body: bytes) -> bool | None:
    """What a check's answer decides: True (commit), False (release), None (ask again).

    Only 200 with a body that is exactly {"commit": true} or {"commit": false} (JSON, any
    whitespace, UTF-8) decides: another key beside it, a key twice, a value that is not a
    JSON boolean, anything else is no answer. The Content-Type is not read: the body is."""
    if status != 200:
        return None
    try:
        answer = json.loads(body.decode("utf-8"), object_pairs_hook=_unique_keys)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(answer, dict) or list(answer) != ["commit"]:
        return None
    commit = answer["commit"]
    return commit if isinstance(commit, bool) else None


def backoff_us(checks_before: int) -> int:
    """How long after its `checks_before + 1`-th unanswered check a reservation is asked
    again."""
    first, longest = BACKOFF_SECONDS
    return round(min(first * 2.0 ** min(checks_before, 32), longest) * MICROS)


class CheckAsker:
    """Asks one check and records what its answer decides; thread-safe."""

    def __init__(self, reservations: Reservations, client: PushClient, clock: Clock, *,
                 timeout_seconds: float) -> None:
        self.reservations = reservations
        self.client = client
        self.clock = clock
        self.timeout_seconds = timeout_seconds

    def ask(self, check: DueCheck, sent: Callable[[], None] = lambda: None) -> None:
        """Ask the check, then record what its answer decides; `sent` is called between,
        once the receiver is done with (or was never sent) the request."""
        reservation = check.reservation
        check_url = reservation.check_url or ""
        commit = None
        # A url stored before the rule refused such paths (a key's, say): never sent.
        refused = disguised_step_refusal(check_url)
        try:
            if refused is not None:
                why = f"not asked: the check url is refused: {refused}"
            else:
                commit, why = self._send(check)
        finally:
            sent()
        if commit is not None:
            self.reservations.answer_check(reservation.job_id, commit=commit,
                                           check_url=check_url)
            return
        delay = backoff_us(reservation.checks)
        log.info("check of job %d at %s: %s, neither commit nor release; asking again in "
                 "%.0f s", reservation.job_id, display_url(check_url), why, delay / MICROS)
        self.reservations.check_again(check, next_check_at=self.clock.now_us() + delay)

    def _send(self, check: DueCheck) -> tuple[bool | None, str]:
        """The signed GET: what its answer decides, and what happened, for the log."""
        reservation = check.reservation
        url, query = check_target(reservation.check_url or "", reservation.job_id,
                                  check.idempotency_key)
        attempt = reservation.checks + 1
        headers = {"Queuelog-Job-Id": str(reservation.job_id),
                   "Queuelog-Attempt": str(attempt), "Accept": "application/json"}
        if check.check_secret is not None:
            headers[SIGNATURE_HEADER] = signature_header(
                check.check_secret, int(time.time()), query.encode("ascii"),
                job_id=reservation.job_id, attempt=attempt)
        try:
            answer = self.client.get(Endpoint.parse(url), headers, self.timeout_seconds,
                                     MAX_ANSWER_BYTES)
        except DeliveryFailed as failed:
            return None, ("no answer (timed out)" if failed.timed_out
                          else "no answer (no connection)")
        commit = None if answer.truncated else answered_commit(answer.status, answer.body)
        return commit, f"answered {answer.status}"
