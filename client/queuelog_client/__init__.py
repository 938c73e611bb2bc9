"""A Python client for queuelog, on the standard library alone (no Flask, no SQLAlchemy).

    from queuelog_client import Client, Worker

`Client` enqueues, reads, claims and reports jobs over HTTP; `Worker` runs a handler on
claimed jobs (also `queuelog worker …` or `python -m queuelog_client worker …`), whose
durable steps and waits (`job.step`, `job.sleep`, `job.wait_for_event`,
`job.wait_for_token`) survive the job's suspends; a wait that timed out raises
`WaitTimedOut`.
`verify_signature` checks a push delivery's Queuelog-Signature header in a receiver;
`verify_check` checks a reservation's check in the producer's check endpoint
(`Client.reserve`).
"""

from queuelog_client._version import __version__
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
    TooManyRequests,
    Unauthorized,
    ValidationFailed,
    WaitTimeout,
)
from queuelog_client.signature import (
    CheckRequest,
    SignatureError,
    verify_check,
    verify_signature,
)
from queuelog_client.steps import WaitTimedOut
from queuelog_client.worker import (
    CancelRequested,
    ClaimedJob,
    RetryLater,
    Worker,
    load_handler,
)

__all__ = [
    "BadRequest",
    "CancelRequested",
    "CheckRequest",
    "ClaimedJob",
    "Client",
    "Conflict",
    "Forbidden",
    "NotFound",
    "PayloadTooLarge",
    "ProblemError",
    "QueuelogError",
    "RetryLater",
    "ServerError",
    "ServerUnreachable",
    "ServiceUnavailable",
    "SignatureError",
    "TooManyRequests",
    "Unauthorized",
    "ValidationFailed",
    "WaitTimedOut",
    "WaitTimeout",
    "Worker",
    "__version__",
    "load_handler",
    "verify_check",
    "verify_signature",
]
