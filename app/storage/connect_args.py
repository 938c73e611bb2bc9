"""What every PostgreSQL connection of the service is opened with: libpq's TCP limits and
the server's, the session's notification switch, and whether psycopg prepares statements."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import URL

# PostgreSQL reached over a network that drops packets rather than refusing them (a link or a
# switch port down, a partition, a peer gone without a RST): TCP alone waits about two minutes
# for an unanswered connect and about fifteen for an unacknowledged statement (the kernel's
# retransmissions), and a request, and the thread serving it, with it. Bounded here, on both
# ends of each connection:
# - connect_timeout: a connection not made (TCP and PostgreSQL's startup) within 3 s fails;
# - tcp_user_timeout: bytes sent and not acknowledged for 5 s end the connection. A slow
#   statement is not one: the server's kernel acknowledges it at once, however long it runs;
# - keepalives: an idle connection to a host gone silent is probed after 5 s, every 2 s, and
#   ended at the first probe unanswered past the 5 s above (7 s), so that the pool finds it
#   dead at its next checkout rather than sending a statement into it;
# - the same on the server's side, per session, through `options`: the server ends the
#   session of a host cut from it within about 7 s, and frees its locks, the maintenance
#   lead's advisory lock among them (app/storage/leadership.py), for another host to take.
# A request on a host cut from its database therefore answers 503 within about 8 s at worst
# (a statement on a dead pooled connection, 5 s, then a write's one attempt on a new
# connection, 3 s), and within about 3 s once its dead connections are gone
# (docs/OPERATIONS.md, "A host cut from the database"). A setting the URL's query gives wins
# (`?connect_timeout=10`); the URL's `options` are sent after these, so its `-c` wins too.
POSTGRES_CONNECT_TIMEOUT_SECONDS = 3
POSTGRES_TCP_USER_TIMEOUT_MS = 5_000
POSTGRES_KEEPALIVES_IDLE_SECONDS = 5
POSTGRES_KEEPALIVES_INTERVAL_SECONDS = 2
POSTGRES_KEEPALIVES_COUNT = 3
_CLIENT_TCP_LIMITS: dict[str, int] = {
    "connect_timeout": POSTGRES_CONNECT_TIMEOUT_SECONDS,
    "tcp_user_timeout": POSTGRES_TCP_USER_TIMEOUT_MS,
    "keepalives": 1,
    "keepalives_idle": POSTGRES_KEEPALIVES_IDLE_SECONDS,
    "keepalives_interval": POSTGRES_KEEPALIVES_INTERVAL_SECONDS,
    "keepalives_count": POSTGRES_KEEPALIVES_COUNT,
}
_SERVER_TCP_LIMITS = (
    f"-c tcp_user_timeout={POSTGRES_TCP_USER_TIMEOUT_MS} "
    f"-c tcp_keepalives_idle={POSTGRES_KEEPALIVES_IDLE_SECONDS} "
    f"-c tcp_keepalives_interval={POSTGRES_KEEPALIVES_INTERVAL_SECONDS} "
    f"-c tcp_keepalives_count={POSTGRES_KEEPALIVES_COUNT}")


def postgres_connect_args(url: URL, *, notify: bool = True,
                          prepared_statements: bool = True) -> dict[str, Any]:
    """The driver's parameters for a PostgreSQL connection (the comment above says why): the
    TCP limits the URL's query does not set itself, and the server's, before the URL's own
    `options`. (On a Unix socket both sides ignore them.) Without `notify`, the session has
    the database's triggers send no notification (migration 0025; QUEUELOG_NOTIFY=0).
    Without `prepared_statements`, psycopg prepares nothing (QUEUELOG_DB_PREPARED_STATEMENTS=0:
    a transaction pooler before PgBouncer 1.21 hands each transaction to any server session)."""
    query = url.query
    args: dict[str, Any] = {name: value for name, value in _CLIENT_TCP_LIMITS.items()
                            if name not in query}
    server = _SERVER_TCP_LIMITS if notify else f"{_SERVER_TCP_LIMITS} -c queuelog.notify=off"
    given = query.get("options")
    if given is None:
        args["options"] = server
    elif isinstance(given, str):
        args["options"] = f"{server} {given}"
    if not prepared_statements:
        args["prepare_threshold"] = None  # psycopg's: never prepare
    return args
