"""Creating, listing, revoking and checking API keys."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
from collections.abc import Iterable
from dataclasses import replace

from sqlalchemy import Connection

from app.core.callers import Caller, Role
from app.core.clock import Clock
from app.core.errors import Unauthorized, ValidationFailed
from app.core.limits import NAME_CHARS, PUSH_URL_CHARS
from app.core.origins import HTTP_URL_PATTERN, check_url_refusal
from app.core.priorities import Priority
from app.keys.models import ApiKey
from app.keys.repository import KeyRepository
from app.storage.engine import Database

TOKEN_PREFIX = "ql_"  # noqa: S105 (a marker, not a secret)
TOKEN_BYTES = 32  # 256 bits of entropy
CHECK_SECRET_PREFIX = "qlchk_"  # noqa: S105 (a marker, not a secret)
CACHED_KEYS = 10_000
_NAME = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9._\-]{{0,{NAME_CHARS.max - 1}}}\Z")
_HTTP_URL = re.compile(HTTP_URL_PATTERN)


class KeyCommandError(ValueError):
    """An operator's key command cannot be carried out; the message says why."""


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_check_secret() -> str:
    """A producer key's check secret: 256 bits, as text (its UTF-8 bytes are the HMAC key)."""
    return CHECK_SECRET_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)


class KeyService:
    def __init__(self, db: Database, clock: Clock, *,
                 check_url_prefixes: tuple[str, ...] = ()) -> None:
        self.db = db
        self.clock = clock
        # QUEUELOG_CHECK_URL_ORIGINS: a key's check url must start with one (none: no url).
        self.check_url_prefixes = check_url_prefixes
        # Live keys seen by this process, by digest. A key's name, role and limits never
        # change, only its revocation, which every request confirms in its transaction.
        # (Its check url and secret do change: they are read where they are used, never
        # from here.)
        self._cache: dict[str, ApiKey] = {}
        self._cache_lock = threading.Lock()

    def create_key(self, name: str, role: Role, *, max_priority: Priority | None = None,
                   job_types: Iterable[str] | None = None,
                   known_types: frozenset[str] | None = None,
                   check_url: str | None = None) -> str:
        """Store a new key and return its token. The token is shown once and never stored.

        `check_url`, a producer's only, is asked about its reservations left unanswered
        (docs/JOBS.md); a url the operator's prefixes refuse raises ValidationFailed. The key
        has no check secret until rotate_check_secret makes one.

        `known_types`, from an operator's command, are the job types configured where the
        command runs: the types of the key must be among them, and with none configured
        there is nothing to check a type against, so types are refused (else one shell would
        accept a misspelt type that another refuses). None (callers inside the service,
        tests) checks nothing.
        """
        if not _NAME.match(name):
            raise KeyCommandError(f"a key name is {NAME_CHARS.min}-{NAME_CHARS.max} letters, "
                                  "digits, '.', '_' or '-'")
        if max_priority is not None and role is not Role.PRODUCER:
            raise KeyCommandError("--max-priority is a producer's ceiling; admins enqueue at "
                                  "any priority and workers do not enqueue")
        if check_url is not None:
            if role is not Role.PRODUCER:
                raise KeyCommandError("--check-url is a producer's: only producers reserve "
                                      "jobs")
            self._check_check_url(check_url)
        if max_priority is None:
            max_priority = Priority.CRITICAL if role is Role.ADMIN else Priority.MEDIUM
        types = sorted({t.strip() for t in job_types or () if t.strip()}) or None
        if types and role is Role.ADMIN:
            raise KeyCommandError("--types limits producers and workers; admins see every type")
        if types and known_types is not None:
            if not known_types:
                raise KeyCommandError(
                    "--types needs QUEUELOG_JOB_TYPES set here as the service has it, to "
                    "check the types against; set it and run the command again")
            unknown = sorted(set(types) - known_types)
            if unknown:
                raise KeyCommandError(
                    f"not among QUEUELOG_JOB_TYPES ({', '.join(sorted(known_types))}): "
                    f"{', '.join(unknown)}")
        token = TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)
        with self.db.write() as conn:
            keys = KeyRepository(conn)
            # Revoked keys keep their rows, so a name is never reused by another key.
            if keys.find_by_name(name) is not None:
                raise KeyCommandError(
                    f"a key named {name!r} exists or existed; choose another name")
            keys.insert_key({
                "name": name,
                "role": role.value,
                "token_digest": token_digest(token),
                "max_priority": int(max_priority),
                "job_types": ",".join(types) if types else None,
                "created_at": self.clock.now_us(),
                "revoked_at": None,
                "check_url": check_url,
            })
        return token

    def set_check_url(self, name: str, url: str | None) -> ApiKey:
        """Set (None: clear) a live producer key's check url; the key as it is now.
        Reservations made from now on take it; those made before keep the one they took."""
        if url is not None:
            self._check_check_url(url)
        with self.db.write() as conn:
            keys = KeyRepository(conn)
            key = self._producer_key(keys, name)
            if key.revoked_at is not None:
                raise KeyCommandError(f"the key {name!r} is revoked: no reservation of its "
                                      "will take a check url again")
            keys.set_check_url(name, url)
        return replace(key, check_url=url)

    def rotate_check_secret(self, name: str) -> str:
        """Give a producer key a new check secret and return it (shown once; the one before
        stops signing at once). A revoked key's may be rotated too: reservations it made
        before its revocation are still checked, signed with it."""
        secret = new_check_secret()
        with self.db.write() as conn:
            keys = KeyRepository(conn)
            self._producer_key(keys, name)
            keys.set_check_secret(name, secret)
        return secret

    @staticmethod
    def _producer_key(keys: KeyRepository, name: str) -> ApiKey:
        key = keys.find_by_name(name)
        if key is None:
            raise KeyCommandError(f"no key named {name!r}")
        if key.role != Role.PRODUCER.value:
            raise KeyCommandError(f"the key {name!r} has the role {key.role}: only a "
                                  "producer key has a check url and a check secret")
        return key

    def _check_check_url(self, url: str) -> None:
        """Raise ValidationFailed unless the url is one the API would take as a reserve's
        check url: its form, then the operator's prefixes. The message never quotes the url
        (it may carry credentials)."""
        if len(url) > PUSH_URL_CHARS.max or not _HTTP_URL.match(url):
            reason = ("it is not an http or https url of at most "
                      f"{PUSH_URL_CHARS.max} characters: a host name or IPv4 address, an "
                      "optional port 1-65535, then printable ASCII and no fragment "
                      "(percent-encode the rest)")
        else:
            reason = check_url_refusal(url, self.check_url_prefixes) or ""
        if reason:
            raise ValidationFailed(f"The check url is refused: {reason}.",
                                   errors={"check_url": [f"Refused: {reason}."]})

    def list_keys(self) -> list[ApiKey]:
        with self.db.read() as conn:
            return KeyRepository(conn).list_keys()

    def revoke_key(self, name: str) -> None:
        with self.db.write() as conn:
            if not KeyRepository(conn).revoke_key(name, self.clock.now_us()):
                raise KeyCommandError(f"no live key named {name!r}")

    def caller_for_token(self, token: str) -> Caller | None:
        """The key this token belongs to, or None (unknown or revoked).

        A key seen live before comes from this process's cache, unconfirmed: the request's
        own transaction confirms it (confirm_live), so a revocation still takes effect on the
        very next request without a separate database round trip on every request.
        """
        digest = token_digest(token)
        key = self._cache.get(digest)
        if key is not None:
            return self._caller(key, live_checked=False)
        key = self._live_key_of(digest)
        if key is None:
            return None
        self._remember(key)
        return self._caller(key, live_checked=True)

    def key_for_token(self, token: str) -> ApiKey | None:
        """The live key this token belongs to, read from the database now (the dashboard's
        sign-in); None when it is unknown or revoked."""
        return self._live_key_of(token_digest(token))

    def live_key(self, key_id: int) -> ApiKey | None:
        """The key with this id if it is still live, read from the database now; None once
        it is revoked (the dashboard asks on every page)."""
        with self.db.read() as conn:
            return KeyRepository(conn).find_live_by_id(key_id)

    def caller_of(self, key: ApiKey) -> Caller:
        """The caller a live key, just read from the database, acts as."""
        return self._caller(key, live_checked=True)

    def _live_key_of(self, digest: str) -> ApiKey | None:
        with self.db.read() as conn:
            key = KeyRepository(conn).find_by_digest(digest)
        # The lookup is by digest; comparing the digests again in constant time keeps the
        # answer from depending on how much of a guessed token matched.
        if key is None or not hmac.compare_digest(key.token_digest, digest):
            return None
        return None if key.revoked_at is not None else key

    def confirm_live(self, conn: Connection, caller: Caller) -> None:
        """Within the caller's transaction: raise Unauthorized unless its key is still live.
        The service's own caller has no key and is always live."""
        if not caller.live_checked and not caller.internal:
            if not KeyRepository(conn).is_live(caller.token_digest):
                self._forget(caller.token_digest)
                raise Unauthorized("The API key is unknown or revoked.")
            caller.live_checked = True

    def is_live(self, caller: Caller) -> bool:
        """Ask the database now (for answers that ran no transaction of their own)."""
        with self.db.read() as conn:
            live = KeyRepository(conn).is_live(caller.token_digest)
        if not live:
            self._forget(caller.token_digest)
        return live

    @staticmethod
    def _caller(key: ApiKey, *, live_checked: bool) -> Caller:
        return Caller(name=key.name, role=Role(key.role),
                      max_priority=Priority(key.max_priority),
                      allowed_types=key.allowed_types, token_digest=key.token_digest,
                      live_checked=live_checked)

    def _remember(self, key: ApiKey) -> None:
        with self._cache_lock:
            self._cache[key.token_digest] = key
            while len(self._cache) > CACHED_KEYS:
                self._cache.pop(next(iter(self._cache)))

    def _forget(self, digest: str) -> None:
        with self._cache_lock:
            self._cache.pop(digest, None)
