"""The client's exceptions: one per answer a caller may want to catch, each carrying the
server's RFC 9457 problem (status, title, detail, field errors)."""

from __future__ import annotations

from typing import Any


class QueuelogError(Exception):
    """Every error this package raises."""


class ServerUnreachable(QueuelogError):
    """No answer from the server (connection refused or reset, timeout) after every attempt.

    For an enqueue this does not mean the job was not stored: the request may have reached
    the server before the connection broke. Sending it again with the same idempotency key
    (the client's own retries do) cannot create a second job.
    """


class WaitTimeout(QueuelogError, TimeoutError):
    """Client.wait: the job did not finish within the timeout. `job` is the job as last seen."""

    def __init__(self, message: str, job: dict[str, Any]) -> None:
        super().__init__(message)
        self.job = job


class ProblemError(QueuelogError):
    """The server answered with an error status and, normally, a problem document."""

    def __init__(self, status: int, title: str, detail: str,
                 errors: dict[str, list[str]] | None = None,
                 problem: dict[str, Any] | None = None,
                 retry_after: float | None = None) -> None:
        self.status = status
        self.title = title
        self.detail = detail
        self.errors = errors or {}
        self.problem = problem or {}
        self.retry_after = retry_after
        super().__init__(self._message())

    @property
    def type(self) -> str | None:
        """The URI naming the problem, e.g. …/validation-failed."""
        return self.problem.get("type")

    def _message(self) -> str:
        message = f"{self.status} {self.title}: {self.detail}"
        if self.errors:
            fields = "; ".join(f"{name}: {' '.join(messages)}"
                               for name, messages in sorted(self.errors.items()))
            message = f"{message} ({fields})"
        return message


class BadRequest(ProblemError):
    """400, 405, 415 and other 4xx answers the client did not expect: a bug in the call."""


class Unauthorized(ProblemError):
    """401: the token is missing, unknown or revoked."""


class Forbidden(ProblemError):
    """403: the key's role or limits (priority ceiling, types) do not allow this."""


class NotFound(ProblemError):
    """404: no such job, or one the caller may not see."""


class Conflict(ProblemError):
    """409: the job is not in a state that allows this; for a worker, its lease is gone."""


class PayloadTooLarge(ProblemError):
    """413: the request body is over the server's limit."""


class ValidationFailed(ProblemError):
    """422: the request did not validate; `errors` maps each field to its messages."""


class TooManyRequests(ProblemError):
    """429: sent sooner than the server takes it (a job's heartbeats and checkpoints, once a
    second each): nothing was done; `retry_after` says how many seconds to wait."""


class ServerError(ProblemError):
    """5xx after every attempt."""


class ServiceUnavailable(ServerError):
    """503 after every attempt: typically the database is not answering."""


_BY_STATUS: dict[int, type[ProblemError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: ValidationFailed,
    429: TooManyRequests,
    503: ServiceUnavailable,
}


def problem_error(status: int, problem: dict[str, Any] | None, reason: str,
                  retry_after: float | None = None) -> ProblemError:
    """The typed exception for an error answer; `problem` is the parsed body when it was a
    JSON object (a proxy in front of the server may answer with HTML instead)."""
    body = problem if isinstance(problem, dict) else {}
    title = body.get("title") if isinstance(body.get("title"), str) else reason
    detail = body.get("detail") if isinstance(body.get("detail"), str) else title
    raw_errors = body.get("errors")
    errors = ({str(k): [str(m) for m in v] if isinstance(v, list) else [str(v)]
               for k, v in raw_errors.items()} if isinstance(raw_errors, dict) else None)
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else BadRequest
    return cls(status, title or f"HTTP {status}", detail or f"HTTP {status}", errors, body,
               retry_after)
