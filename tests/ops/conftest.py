"""Fixtures for tests that run real gunicorn processes."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from tests.ops.servers import Server
from tests.servers import free_port


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """start_server(argv, env) runs a server on a free port (QUEUELOG_BIND is set for it);
    every server started is killed, with its whole process group, when the test ends."""
    servers: list[Server] = []

    def start(argv: list[str], env: Mapping[str, str]) -> Server:
        port = free_port()
        server = Server(argv, {**env, "QUEUELOG_BIND": f"127.0.0.1:{port}"}, port, tmp_path)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.kill()
