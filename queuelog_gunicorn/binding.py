"""The addresses gunicorn listens on, and a check that they are free before it starts.

In one place because two read it: the gunicorn configuration (conf.py) and `queuelog serve`,
which checks the addresses first so that a port in use is one line naming the address and
the setting that chooses another, not gunicorn's five retries and "Can't connect".
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence

BIND_VARIABLE = "QUEUELOG_BIND"


def configured_binds(environ: Mapping[str, str] = os.environ) -> list[str]:
    """QUEUELOG_BIND (comma-separated), else all interfaces on $PORT, else loopback:8000."""
    if environ.get(BIND_VARIABLE):
        raw = environ[BIND_VARIABLE]
    elif environ.get("PORT"):
        # Platforms that hand out a PORT route to the container from outside: listen on all.
        raw = f"0.0.0.0:{int(environ['PORT'])}"
    else:
        # Nothing said: stay on loopback. The container image sets QUEUELOG_BIND=0.0.0.0:8000.
        raw = "127.0.0.1:8000"
    return [address.strip() for address in raw.split(",") if address.strip()]


def address_of(host: str | None, port: int | None, configured: Sequence[str]) -> str:
    """The one address `queuelog serve --host/--port` names. What is not given comes from the
    first TCP address configured (configured_binds), else from 127.0.0.1:8000: `--port 9000`
    under QUEUELOG_BIND=0.0.0.0:8000 listens on 0.0.0.0:9000."""
    first = next((target for address in configured
                  if (target := _host_and_port(address)) is not None), None)
    default_host, default_port = first or ("127.0.0.1", 8000)
    chosen = (host or default_host).strip("[]")
    if ":" in chosen:  # an IPv6 address, bracketed as gunicorn reads it
        chosen = f"[{chosen}]"
    return f"{chosen}:{port or default_port}"


def _host_and_port(address: str) -> tuple[str, int] | None:
    """(host, port) of a TCP address as gunicorn reads it; None for unix: and fd:// ones."""
    if address.startswith(("unix:", "fd://")):
        return None
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        return None  # gunicorn itself says what is wrong with it
    return host.strip("[]") or "0.0.0.0", int(port)  # noqa: S104 (":8000", as gunicorn reads it)


def first_unbindable(addresses: Sequence[str]) -> tuple[str, str] | None:
    """The first TCP address that cannot be bound now and why (another process listens
    there: "Address already in use"), or None. Bound as gunicorn binds (SO_REUSEADDR), and
    released at once."""
    for address in addresses:
        target = _host_and_port(address)
        if target is None:
            continue
        try:
            infos = socket.getaddrinfo(target[0], target[1], type=socket.SOCK_STREAM)
        except OSError:
            continue  # an unknown host: gunicorn's own message names it
        family, kind, proto, _, sockaddr = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                return address, exc.strerror or str(exc)
    return None
