"""PostgreSQL connections bound how long TCP may leave them hanging (app/storage/engine.py):
libpq's connect_timeout, tcp_user_timeout and keepalives on the service's end, the server's
keepalives and tcp_user_timeout on its end (sent in `options`, so that the server ends a
partitioned host's session and frees its locks). A setting the URL gives wins.

A database that accepts the connection and never answers stands here for one cut off; the
real partition (a link set down between two namespaced hosts and PostgreSQL) is
tests/e2e/test_two_hosts.py."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from app import create_app
from app.storage.connect_args import POSTGRES_CONNECT_TIMEOUT_SECONDS, postgres_connect_args
from app.storage.engine import make_engine
from tests.conftest import JOB_TYPES, PostgresServer

SERVER_OPTIONS = ("-c tcp_user_timeout=5000 -c tcp_keepalives_idle=5 "
                  "-c tcp_keepalives_interval=2 -c tcp_keepalives_count=3")


def test_the_limits_are_sent_unless_the_url_sets_its_own() -> None:
    assert postgres_connect_args(make_url("postgresql+psycopg://q@db/queue")) == {
        "connect_timeout": 3, "tcp_user_timeout": 5000, "keepalives": 1,
        "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3,
        "options": SERVER_OPTIONS}
    given = postgres_connect_args(make_url(
        "postgresql+psycopg://q@db/queue?connect_timeout=10&keepalives_idle=30"
        "&options=-c%20tcp_keepalives_idle%3D30"))
    assert "connect_timeout" not in given and "keepalives_idle" not in given
    assert given["tcp_user_timeout"] == 5000
    # The URL's options after the service's: its -c wins on the server.
    assert given["options"] == f"{SERVER_OPTIONS} -c tcp_keepalives_idle=30"


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    return postgres_server.create_database()


def _socket_options(fd: int) -> dict[str, int]:
    sock = socket.socket(fileno=os.dup(fd))
    try:
        return {
            "SO_KEEPALIVE": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            "TCP_KEEPIDLE": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            "TCP_KEEPINTVL": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            "TCP_KEEPCNT": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
            "TCP_USER_TIMEOUT": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
        }
    finally:
        sock.close()


def test_both_ends_of_a_pooled_connection_carry_the_limits(postgres_url: str) -> None:
    engine = make_engine(postgres_url)
    try:
        with engine.connect() as conn:
            server = {name: conn.exec_driver_sql(f"SHOW {name}").scalar() for name in (
                "tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count",
                "tcp_user_timeout")}
            raw: Any = conn.connection.dbapi_connection
            client = _socket_options(raw.pgconn.socket)
    finally:
        engine.dispose()
    assert server == {"tcp_keepalives_idle": "5", "tcp_keepalives_interval": "2",
                      "tcp_keepalives_count": "3", "tcp_user_timeout": "5000"}
    assert client == {"SO_KEEPALIVE": 1, "TCP_KEEPIDLE": 5, "TCP_KEEPINTVL": 2,
                      "TCP_KEEPCNT": 3, "TCP_USER_TIMEOUT": 5000}


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts TCP connections (the kernel completes them) and never answers:
    PostgreSQL's startup waits for ever."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield listener.getsockname()[1]
    listener.close()


def test_a_database_that_never_answers_is_a_503_within_the_connect_timeout(
        silent_server: int) -> None:
    app = create_app({"DATABASE_URL": f"postgresql+psycopg://q@127.0.0.1:{silent_server}/q",
                      "JOB_TYPES": JOB_TYPES, "TESTING": True})
    try:
        started = time.monotonic()
        answer = app.test_client().post("/jobs", json={"type": "email"},
                                        headers={"Authorization": "Bearer ql_unknown"})
        took = time.monotonic() - started
    finally:
        app.extensions["queuelog"].close()
    assert answer.status_code == 503, answer.get_data(as_text=True)
    assert answer.content_type == "application/problem+json"
    assert answer.headers["Retry-After"]
    # Given up at the connect timeout, not at TCP's own (minutes), and not at once.
    assert POSTGRES_CONNECT_TIMEOUT_SECONDS - 0.5 <= took < POSTGRES_CONNECT_TIMEOUT_SECONDS * 3
