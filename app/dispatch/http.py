"""The dispatcher's HTTP client: one pooled urllib3 PoolManager for every delivery.

Why urllib3 (httpx was the other candidate; docs/PUSH.md, "The HTTP client"): its PoolManager keeps
connections alive per host and is safe to share between the delivery threads, with
`maxsize` connections per host and `block=True`, so a dispatcher never opens more than its
concurrency to one receiver; `Timeout(connect, read, total)` bounds each phase; with
`retries=False` it neither retries nor follows a redirect (a 3xx comes back as the answer).
It is already installed beside queuelog (requests and schemathesis build on it), where
httpx would bring five packages of its own for the same three properties.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from urllib.parse import unquote

import urllib3
from urllib3.exceptions import HTTPError, NewConnectionError, ProtocolError, TimeoutError
from urllib3.util import parse_url

# Connecting is quick or it is not happening: at most this long (within the timeout).
MAX_CONNECT_SECONDS = 10.0
_CHUNK = 16_384


@dataclass(frozen=True)
class Answer:
    """A receiver's answer: its status, the first bytes of its body (at most the read
    limit; `truncated` when there was more), and its Retry-After header."""

    status: int
    body: bytes
    truncated: bool
    retry_after: str | None


class DeliveryFailed(Exception):
    """No answer: the connection failed, or the time ran out (`timed_out`)."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


@dataclass(frozen=True)
class Endpoint:
    """A push url made ready to send to: credentials taken out into a Basic header."""

    url: str
    authorization: str | None

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parsed = parse_url(url)
        authorization = None
        if parsed.auth is not None:
            user, _, password = parsed.auth.partition(":")
            pair = f"{unquote(user)}:{unquote(password)}".encode()
            authorization = "Basic " + base64.b64encode(pair).decode("ascii")
        bare = parsed._replace(auth=None).url
        return cls(bare, authorization)


class PushClient:
    """POSTs deliveries through one pool; thread-safe."""

    def __init__(self, max_connections_per_host: int) -> None:
        self.pool = urllib3.PoolManager(
            num_pools=64, maxsize=max_connections_per_host, block=True, retries=False)

    def post(self, endpoint: Endpoint, body: bytes, headers: dict[str, str],
             timeout_seconds: float, max_body_bytes: int) -> Answer:
        """POST `body`; the answer, its body read up to `max_body_bytes` (+1 to tell it was
        longer). Raises DeliveryFailed when no answer came within `timeout_seconds` (from
        the start of connecting to the end of reading) or the connection failed."""
        if endpoint.authorization is not None:
            headers = {**headers, "Authorization": endpoint.authorization}
        deadline = time.monotonic() + timeout_seconds
        timeout = urllib3.Timeout(connect=min(MAX_CONNECT_SECONDS, timeout_seconds),
                                  read=timeout_seconds, total=timeout_seconds)
        try:
            response = self.pool.request("POST", endpoint.url, body=body, headers=headers,
                                         timeout=timeout, preload_content=False,
                                         redirect=False, retries=False)
        except NewConnectionError as exc:
            # Before TimeoutError: urllib3 makes a refused connection a ConnectTimeoutError
            # too, for compatibility.
            raise DeliveryFailed(f"connection failed: {_reason(exc)}") from None
        except TimeoutError:
            raise DeliveryFailed(f"timed out after {timeout_seconds:g} s waiting for the "
                                 "receiver to answer", timed_out=True) from None
        except (HTTPError, OSError) as exc:
            raise DeliveryFailed(f"connection failed: {_reason(exc)}") from None
        try:
            data, truncated = self._read(response, deadline, max_body_bytes)
        except TimeoutError:
            response.close()
            raise DeliveryFailed(f"timed out after {timeout_seconds:g} s reading the "
                                 "receiver's answer", timed_out=True) from None
        except (ProtocolError, HTTPError, OSError) as exc:
            raise DeliveryFailed(f"connection failed while reading the answer: "
                                 f"{_reason(exc)}") from None
        finally:
            response.release_conn()
        return Answer(response.status, data, truncated, response.headers.get("Retry-After"))

    @staticmethod
    def _read(response: urllib3.BaseHTTPResponse, deadline: float,
              limit: int) -> tuple[bytes, bool]:
        """Read up to limit + 1 bytes, never past the deadline: each read waits at most the
        time left (a receiver dribbling its answer cannot stretch a delivery past its
        timeout, and so past its lease)."""
        parts: list[bytes] = []
        size = 0
        while size <= limit:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("deadline")
            sock = getattr(getattr(response, "connection", None), "sock", None)
            if sock is not None:
                sock.settimeout(left)
            chunk = response.read(min(_CHUNK, limit + 1 - size))
            if not chunk:
                break
            parts.append(chunk)
            size += len(chunk)
        data = b"".join(parts)
        if len(data) > limit:
            # The rest is not wanted: the connection cannot be reused with it unread.
            response.close()
            return data[:limit], True
        return data, False


def _reason(exc: BaseException) -> str:
    # urllib3 wraps the cause (refused, reset, name not known); its innermost text says it
    # best. The dispatcher redacts whatever is stored or logged.
    cause = getattr(exc, "reason", None) or exc.__cause__ or exc
    return f"{type(cause).__name__}: {cause}"
