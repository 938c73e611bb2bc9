"""A Python client for queuelog, on the standard library alone (no Flask, no SQLAlchemy).

    from queuelog_client import Client

`Client` enqueues, reads, claims and reports jobs over HTTP.
"""

from queuelog_client.client import Client
from queuelog_client.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    ProblemError,
    QueuelogError,
    ServerError,
    ServerUnreachable,
    ServiceUnavailable,
    Unauthorized,
    ValidationFailed,
)

__all__ = [
    "BadRequest",
    "Client",
    "Conflict",
    "Forbidden",
    "NotFound",
    "PayloadTooLarge",
    "ProblemError",
    "QueuelogError",
    "ServerError",
    "ServerUnreachable",
    "ServiceUnavailable",
    "Unauthorized",
    "ValidationFailed",
]
