"""A job type's settings and the arithmetic of its limits (the token bucket, how near its caps
it runs), free of HTTP and SQL. What a claim may take under them is app/types/flow.py's."""

from __future__ import annotations

import functools
import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from app.core.clock import MICROS
from app.core.origins import HTTP_URL_PATTERN, push_origin
from app.jobs.domain.flow import RunningCounts, running_by_type
from app.jobs.tx.key_rules import KeyMode
from app.jobs.usecases.retention import RetentionWindows
from app.types.protection import circuit
from app.types.protection.budget import RetryBudgetSettings
from app.types.protection.circuit import CircuitSettings

# The values of a type's key-mode settings (docs/FLOW-CONTROL.md); each may also be null.
FAIRNESS_KEY = "key"
ORDERING_KEY = "key"
ON_FAILURE_BLOCK = "block"
ON_FAILURE_SKIP = "skip"
KEYS_PER_PRODUCER = "producer"
KEYS_SHARED = "shared"

# A delivery's lease outlasts its timeout by this much: time to record the outcome.
PUSH_LEASE_MARGIN_SECONDS = 30
# A hair of slack: a bucket refilled to 0.9999999 by float arithmetic holds a whole token.
TOKEN_SLACK = 1e-9
# A bucket stamped more than this ahead of now was stamped before the wall clock was stepped
# back (or by a host whose clock is that far ahead). Left as it is, it would refill nothing
# and every spend would stamp it in the future again: the type would stall for as long as
# the step. So beyond this it counts full at now: at most one burst more than the rate, once
# per step. Within it nothing changes: a claim that read the clock and then waited for the
# type's row (PostgreSQL), or a host a little behind the others (NTP keeps them within
# milliseconds), only waits that long for refills, and the rate holds across hosts. Small,
# because a step back shorter than this stalls a rated type for as long as the step.
CLOCK_STEP_TOLERANCE_US = 5 * MICROS


def whole_tokens(tokens: float) -> float:
    """The tokens a claim may spend of a bucket holding `tokens` (inf: no rate)."""
    return tokens if math.isinf(tokens) else math.floor(tokens + TOKEN_SLACK)


@dataclass(frozen=True)
class TypeSettings:
    """One row of job_types; a type never changed has `defaults(type)`. Times in µs."""

    type: str
    paused: bool = False
    max_running: int | None = None
    max_running_per_key: int | None = None
    rate_per_second: float | None = None
    burst: int | None = None  # None: ceil(rate_per_second), at least 1
    tokens: float | None = None  # the token bucket as of tokens_at
    tokens_at: int | None = None
    last_claim_at: int | None = None
    updated_at: int | None = None
    push_url: str | None = None  # set: a push type, delivered by the dispatcher
    push_timeout_seconds: int | None = None
    push_secret: str | None = None
    fairness: str | None = None  # "key": claims take turns across concurrency keys
    ordering: str | None = None  # "key": one job per concurrency key at a time, in order
    on_failure: str | None = None  # of an ordered key: "skip" (None) or "block"
    # Retention of its finished jobs, in seconds (docs/OPERATIONS.md): None the default, 0 for ever.
    retention_completed_seconds: int | None = None
    retention_failed_seconds: int | None = None
    retention_cancelled_seconds: int | None = None
    # Whose are its concurrency keys (migration 0021): None each producer's own, "shared" one
    # key for every producer of the type (docs/FLOW-CONTROL.md).
    key_scope: str | None = None
    # Protection (migration 0028, docs/FLOW-CONTROL.md): the breaker's and the retry budget's
    # settings as stored (compact JSON; None: off), where the circuit stands (None: closed),
    # since when, opened by which failure group (JSON), and the budget's schedule.
    circuit: str | None = None
    circuit_state: str | None = None
    circuit_since: int | None = None
    circuit_opened_by: str | None = None
    retry_budget: str | None = None
    retry_budget_at: int | None = None
    # Priority aging (migration 0029): seconds per level a pending job rises (None: off).
    aging_seconds: int | None = None

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> TypeSettings:
        return cls(**row)

    @classmethod
    def from_values(cls, values: Sequence[Any]) -> TypeSettings:
        """From a job_types row's values in column order (the driver's tuple, where SQLite
        gives `paused` as 0 or 1)."""
        settings = cls(*values)
        return replace(settings, paused=bool(settings.paused))

    @property
    def effective_burst(self) -> int:
        if self.burst is not None:
            return self.burst
        if self.rate_per_second is None:
            return 1
        return max(1, math.ceil(self.rate_per_second))

    @property
    def counts_running(self) -> bool:
        """Its claims must be serialised and count what runs: a cap or a rate is set, or its
        circuit is open or half-open."""
        return (self.max_running is not None or self.max_running_per_key is not None
                or self.rate_per_second is not None or self.circuit_state is not None)

    @functools.cached_property
    def circuit_settings(self) -> CircuitSettings | None:
        return CircuitSettings.parse(self.circuit)

    @functools.cached_property
    def retry_budget_settings(self) -> RetryBudgetSettings | None:
        return RetryBudgetSettings.parse(self.retry_budget)

    @property
    def is_protected(self) -> bool:
        """A breaker or a retry budget is set: its attempts are tallied."""
        return self.circuit is not None or self.retry_budget is not None

    def circuit_cap(self, now_us: int) -> int | None:
        """The most of its jobs its circuit lets run at `now_us` (None: no cap)."""
        return circuit.cap(self.circuit_settings, self.circuit_state, self.circuit_since,
                           now_us)

    @property
    def is_push(self) -> bool:
        return self.push_url is not None

    @property
    def is_fair(self) -> bool:
        return self.fairness == FAIRNESS_KEY

    @property
    def is_limited(self) -> bool:
        """A claim must look at this type's row: it is paused, limited, pushed (which only
        the dispatcher's claims take) or fair (whose claims read round order)."""
        return self.paused or self.counts_running or self.is_push or self.is_fair

    @property
    def key_mode(self) -> KeyMode:
        """Its key modes (fairness, ordering, on_failure), as the job transactions apply
        them."""
        return KeyMode(fair=self.is_fair, ordered=self.ordering == ORDERING_KEY,
                       block_on_failure=self.on_failure == ON_FAILURE_BLOCK,
                       shared=self.key_scope == KEYS_SHARED)

    def retention(self, defaults: RetentionWindows) -> RetentionWindows:
        """How long its finished jobs are kept: its own windows, the defaults where it has
        none (None: kept until purged by hand)."""

        def window(own: int | None, default: int | None) -> int | None:
            chosen = default if own is None else own
            return chosen or None  # 0: for ever

        return RetentionWindows(
            window(self.retention_completed_seconds, defaults.completed),
            window(self.retention_failed_seconds, defaults.failed),
            window(self.retention_cancelled_seconds, defaults.cancelled))

    def far_from_caps(self, running: RunningCounts, share: float) -> bool:
        """What runs of this type, and of each of its keys, is at most `share` of its cap. A
        tripped circuit's cap (none, one, a wave) is never far."""
        if self.circuit_state is not None:
            return False
        if (self.max_running is not None
                and running_by_type(running).get(self.type, 0) > share * self.max_running):
            return False
        return self.max_running_per_key is None or all(
            n <= share * self.max_running_per_key
            for (t, key), n in running.items() if t == self.type and key is not None)

    def clock_stepped_back(self, now_us: int) -> bool:
        """The bucket is stamped further ahead of `now_us` than hosts' clocks differ: the
        wall clock was stepped back since it was spent (CLOCK_STEP_TOLERANCE_US)."""
        return self.tokens_at is not None and self.tokens_at - now_us > CLOCK_STEP_TOLERANCE_US

    def bucket_at(self, now_us: int) -> int:
        """The time the bucket is counted from at `now_us`, and stamped with when spent: its
        own, never earlier than now; now itself after a step back of the clock."""
        if self.tokens_at is None or self.clock_stepped_back(now_us):
            return now_us
        return max(now_us, self.tokens_at)

    def tokens_available(self, now_us: int) -> float:
        """The bucket refilled up to now (rate set); a full bucket when it was never spent,
        or when the clock was stepped back since (how long ago that was is unknown). A clock
        a little behind (another host's) refills nothing rather than draining."""
        if self.rate_per_second is None:
            return math.inf
        burst = float(self.effective_burst)
        if self.tokens is None or self.tokens_at is None or self.clock_stepped_back(now_us):
            return burst
        elapsed = max(0, now_us - self.tokens_at) / MICROS
        return min(burst, self.tokens + self.rate_per_second * elapsed)

    def next_token_at(self, now_us: int) -> int | None:
        """When the bucket next holds a whole token; None when it holds one now (or no rate
        is set). The bucket is refilled from its last fill, never earlier than `now_us`."""
        if self.rate_per_second is None:
            return None
        tokens = self.tokens_available(now_us)
        if whole_tokens(tokens) >= 1:
            return None
        since = self.bucket_at(now_us)
        at = since + math.ceil((1.0 - TOKEN_SLACK - tokens) / self.rate_per_second * MICROS)
        # The float arithmetic may miss by a microsecond: the claim's own rule has the word.
        while at - 1 > since and whole_tokens(self.tokens_available(at - 1)) >= 1:
            at -= 1
        while whole_tokens(self.tokens_available(at)) < 1:
            at += 1
        return at

    def changed(self, now_us: int, patch: Mapping[str, Any]) -> TypeSettings:
        """These settings with `patch` applied at `now_us`. A new rate or burst keeps the
        tokens already in the bucket (at most the new burst); a first rate starts full."""
        updated = replace(self, **patch, updated_at=now_us)
        if "rate_per_second" in patch or "burst" in patch:
            if updated.rate_per_second is None:
                updated = replace(updated, tokens=None, tokens_at=None)
            else:
                held = (self.tokens_available(now_us) if self.rate_per_second is not None
                        else math.inf)
                updated = replace(updated, tokens=min(held, float(updated.effective_burst)),
                                  tokens_at=self.bucket_at(now_us))
        return updated

    def values(self) -> dict[str, Any]:
        """The row as stored."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


# A push endpoint: an http(s) url as app/core/origins.py states it (a check url too).
PUSH_URL_PATTERN = HTTP_URL_PATTERN


def push_origin_refusal(url: str, allowed: frozenset[str] | None) -> str | None:
    """Why a push url may not be delivered to under the operator's allow list (None: it may;
    no list: any origin may)."""
    if allowed is None or push_origin(url) in allowed:
        return None
    return ("its origin is not in QUEUELOG_PUSH_ALLOWED_ORIGINS (the operator's list of "
            "push origins)")


def new_push_secret() -> str:
    """A signing secret: 256 bits, as text (its UTF-8 bytes are the HMAC key)."""
    return "qlsec_" + secrets.token_urlsafe(32)


def defaults(job_type: str) -> TypeSettings:
    return TypeSettings(type=job_type)


class SkipReason:
    """Why a claim passed over a type or a key (the label of the skip counter)."""

    PAUSED = "paused"
    MAX_RUNNING = "max_running"
    RATE = "rate"
    KEY_MAX_RUNNING = "max_running_per_key"
    CIRCUIT = "circuit"
