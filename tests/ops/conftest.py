"""Fixtures for tests that run real gunicorn processes."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from tests.servers import HOST, GunicornServer, free_port


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., GunicornServer]]:
    """start_server(argv, env) starts a server on a free port (QUEUELOG_BIND is set for it);
    every server started is killed, with its whole process group, when the test ends."""
    servers: list[GunicornServer] = []

    def start(argv: list[str], env: Mapping[str, str]) -> GunicornServer:
        port = free_port()
        server = GunicornServer(argv, {**env, "QUEUELOG_BIND": f"{HOST}:{port}"}, port=port,
                                logs=tmp_path)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.kill()
