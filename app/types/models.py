"""A job type's settings and the flow-control rules a claim applies, free of HTTP and SQL.

A claim of limited types reads the settings and the running counts in its own transaction,
and `ClaimGate.for_claim` turns them into what the claim may take: the types it must pass
over, how many jobs of each limited type it may start, and which concurrency keys are full.
On SQLite, BEGIN IMMEDIATE makes that read final; on PostgreSQL the claim is checked again
(`ClaimGate.admits`) under the claimed types' row locks before it commits (app/types/service.py).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from app.core.clock import MICROS
from app.core.origins import push_origin

# A delivery's lease outlasts its timeout by this much: time to record the outcome.
PUSH_LEASE_MARGIN_SECONDS = 30
# A hair of slack: a bucket refilled to 0.9999999 by float arithmetic holds a whole token.
TOKEN_SLACK = 1e-9


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

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> TypeSettings:
        return cls(**row)

    @property
    def effective_burst(self) -> int:
        if self.burst is not None:
            return self.burst
        if self.rate_per_second is None:
            return 1
        return max(1, math.ceil(self.rate_per_second))

    @property
    def counts_running(self) -> bool:
        """Its claims must be serialised and count what runs: a cap or a rate is set."""
        return (self.max_running is not None or self.max_running_per_key is not None
                or self.rate_per_second is not None)

    @property
    def is_push(self) -> bool:
        return self.push_url is not None

    @property
    def is_limited(self) -> bool:
        """A claim must look at this type's row: it is paused, limited, or pushed (which
        only the dispatcher's claims take)."""
        return self.paused or self.counts_running or self.is_push

    def far_from_caps(self, running: RunningCounts, share: float) -> bool:
        """What runs of this type, and of each of its keys, is at most `share` of its cap."""
        if self.max_running is not None and sum(
                n for (t, _key), n in running.items() if t == self.type) > share * self.max_running:
            return False
        return self.max_running_per_key is None or all(
            n <= share * self.max_running_per_key
            for (t, key), n in running.items() if t == self.type and key is not None)

    def tokens_available(self, now_us: int) -> float:
        """The bucket refilled up to now (rate set); a full bucket when it was never spent.
        A clock that went back (another host's) refills nothing rather than draining."""
        if self.rate_per_second is None:
            return math.inf
        burst = float(self.effective_burst)
        if self.tokens is None or self.tokens_at is None:
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
        since = max(now_us, self.tokens_at or now_us)
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
                                  tokens_at=max(now_us, self.tokens_at or now_us))
        return updated

    def values(self) -> dict[str, Any]:
        """The row as stored."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


_PORT = (r"(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}"
         r"|[1-9][0-9]{0,3})")
# A push endpoint: http or https; optional user:pass@ (sent as Basic auth); a host name or
# IPv4 address; an optional port 1..65535; then path and query in printable ASCII, no
# fragment (it is never sent). Percent-encode anything else. Strict on purpose: the pattern
# is also the API's documented one, so what it admits is exactly what is accepted.
PUSH_URL_PATTERN = (
    r"^[Hh][Tt][Tt][Pp][Ss]?://"
    r"(?:[A-Za-z0-9._~%!$&'()*+,;=:-]+@)?"
    r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?"
    rf"(?::{_PORT})?"
    r"(?:[/?][!$-~]*)?\Z"
)


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
    # Not a limit: a push type is left to the dispatcher, and a worker's claim passing it
    # over is not counted as a skip.
    PUSH = "push"


# (type, concurrency_key or None) -> jobs running
RunningCounts = Mapping[tuple[str, str | None], int]


@dataclass(frozen=True)
class ClaimGate:
    """What one claim may take under flow control.

    `blocked` types are left out of the claim altogether (so their backlog costs it nothing);
    each type in `budgets` may start at most that many jobs; in each type of `key_caps`, a
    concurrency key may run at most its cap, and `key_running` holds what runs now.
    """

    blocked: Mapping[str, str] = field(default_factory=dict)
    budgets: Mapping[str, int] = field(default_factory=dict)
    key_caps: Mapping[str, int] = field(default_factory=dict)
    key_running: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    tokens: Mapping[str, float] = field(default_factory=dict)  # rated types' buckets, now
    # When each bucket was last filled: never earlier than a claim before this one had it
    # (a claim that read the clock, then waited for the row's lock, must not be credited
    # again with time its predecessor was already credited with).
    bucket_at: Mapping[str, int] = field(default_factory=dict)
    # The dispatcher's claim: only these types (the push types) may be taken. None: a
    # worker's claim, which never takes a push type (they are in `blocked`).
    only: frozenset[str] | None = None

    @classmethod
    def for_claim(cls, settings: Iterable[TypeSettings], running: RunningCounts,
                  now_us: int, *, push: bool = False) -> ClaimGate:
        """The gate of a worker's claim, or of the dispatcher's (`push`): each takes only
        its own kind of type, under the same limits. This is the one place that decides
        who claims a push type."""
        settings = list(settings)
        pushed = frozenset(s.type for s in settings if s.is_push)
        blocked: dict[str, str] = {}
        budgets: dict[str, int] = {}
        key_caps: dict[str, int] = {}
        key_running: dict[str, dict[str, int]] = {}
        tokens_now: dict[str, float] = {}
        bucket_at: dict[str, int] = {}
        for s in settings:
            if s.is_push != push:
                if s.is_push:
                    blocked[s.type] = SkipReason.PUSH
                continue
            if s.paused:
                blocked[s.type] = SkipReason.PAUSED
                continue
            budget = math.inf
            reason = ""
            if s.max_running is not None:
                total = sum(n for (t, _key), n in running.items() if t == s.type)
                budget = max(0, s.max_running - total)
                reason = SkipReason.MAX_RUNNING
            if s.rate_per_second is not None:
                tokens_now[s.type] = s.tokens_available(now_us)
                bucket_at[s.type] = max(now_us, s.tokens_at or now_us)
                tokens = whole_tokens(tokens_now[s.type])
                if tokens < budget:
                    budget, reason = max(0, tokens), SkipReason.RATE
            if budget <= 0:
                blocked[s.type] = reason
                continue
            if budget != math.inf:
                budgets[s.type] = int(budget)
            if s.max_running_per_key is not None:
                key_caps[s.type] = s.max_running_per_key
                key_running[s.type] = {key: n for (t, key), n in running.items()
                                       if t == s.type and key is not None}
        return cls(blocked, budgets, key_caps, key_running, tokens_now, bucket_at,
                   only=pushed if push else None)

    def allowed(self, wanted: frozenset[str]) -> frozenset[str]:
        """Of the `wanted` types, those this claim may read: not blocked, and push types
        alone for the dispatcher's claim."""
        if self.only is not None:
            wanted = wanted & self.only
        return wanted - frozenset(self.blocked)

    def full_keys(self, job_type: str) -> list[str]:
        """The concurrency keys of `job_type` at their cap now."""
        cap = self.key_caps.get(job_type)
        if cap is None:
            return []
        return sorted(key for key, n in self.key_running.get(job_type, {}).items() if n >= cap)

    def restricts(self, limit: int) -> bool:
        """False when a claim of up to `limit` jobs in plain claim order cannot break any
        limit: nothing blocked, every budget at least `limit`, and no key at its cap (nor,
        for a claim of several, any key cap, since one claim may meet a key twice). The
        claim then runs as it would without flow control, which keeps limits that are not
        reached cheap. The dispatcher's claim is always restricted: to the push types."""
        if (self.only is not None or self.blocked
                or any(budget < limit for budget in self.budgets.values())):
            return True
        if limit > 1:
            return bool(self.key_caps)
        return any(self.full_keys(job_type) for job_type in self.key_caps)

    def pick(self, job_type: str, candidates: Iterable[Any], limit: int) -> list[Any]:
        """The candidates of one type (rows with `concurrency_key`, in claim order) that the
        claim may take: at most its budget, and no key beyond its cap."""
        budget = min(limit, self.budgets.get(job_type, limit))
        cap = self.key_caps.get(job_type)
        running = dict(self.key_running.get(job_type, {}))
        chosen: list[Any] = []
        for row in candidates:
            if len(chosen) >= budget:
                break
            key = row.concurrency_key if cap is not None else None
            if cap is not None and key is not None:
                if running.get(key, 0) >= cap:
                    continue
                running[key] = running.get(key, 0) + 1
            chosen.append(row)
        return chosen

    def admits(self, claimed: Iterable[Any]) -> bool:
        """True when these claimed jobs (rows with `type` and `concurrency_key`, in claim
        order) fit the gate: none of a blocked type, and each type's within its budget and
        its key caps."""
        by_type: dict[str, list[Any]] = {}
        for job in claimed:
            by_type.setdefault(job.type, []).append(job)
        return all(job_type not in self.blocked
                   and len(self.pick(job_type, of_type, len(of_type))) == len(of_type)
                   for job_type, of_type in by_type.items())

    def budget(self, job_type: str, limit: int) -> int:
        return min(limit, self.budgets.get(job_type, limit))

    def buckets_after(self, claimed_types: Iterable[str]) -> dict[str, tuple[float, int]]:
        """(tokens, as of when) of each rated type's bucket once the claimed jobs (one type
        per job) are paid for; only the types that claimed something."""
        spent: dict[str, int] = {}
        for job_type in claimed_types:
            if job_type in self.tokens:
                spent[job_type] = spent.get(job_type, 0) + 1
        return {t: (max(0.0, self.tokens[t] - n), self.bucket_at[t]) for t, n in spent.items()}

