"""Hosts of their own on this machine: Linux network namespaces (`ip netns`), each linked to
the root namespace by two veth pairs on addresses of 10.213.0.0/16, as a host is linked to
its clients and to its database.

- the front link carries HTTP: the tests (in the root namespace) call the host's address;
- the back link carries the database: the host reaches PostgreSQL at the root end's address
  (the cluster listens on every address and trusts 10.213.0.0/16:
  .ci/postgres_for_namespaces).

Cutting the back link's root end (`ip link set … down`) cuts the host from its database the
way a failed switch port or a partition does: its packets are dropped, nothing answers, no
RST comes back, while the tests still reach it over the front link.

Every name carries the pid of the process that made it (`qlh-<pid>-<host>`; its veths
`qh<pid><host><f|b>[n]`, within the 15 characters a link name may have), so that two runs
never collide, and what a crashed run left behind (its process gone) is removed by the next.
Needs root.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

SUBNET = ipaddress.ip_network("10.213.0.0/16")
_NAMESPACE = re.compile(r"^qlh-(\d+)-")
_LINK = re.compile(r"^qh(\d+)[a-z][fb]n?$")
IP_TIMEOUT_SECONDS = 10


class NamespaceError(RuntimeError):
    """`ip` refused a step; the message is its own."""


def ip(*args: str, namespace: str | None = None) -> str:
    """Run `ip args…` (in `namespace`, when given) and return its output."""
    argv = ["ip", *args] if namespace is None else ["ip", "netns", "exec", namespace, "ip", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=IP_TIMEOUT_SECONDS,
                          check=False)
    if done.returncode != 0:
        raise NamespaceError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


def why_namespaces_cannot_be_made() -> str | None:
    """Why this process cannot make network namespaces, or None when it can."""
    if os.geteuid() != 0:
        return "needs root (ip netns add, ip link add)"
    if shutil.which("ip") is None:
        return "needs iproute2's ip"
    try:
        ip("netns", "list")
    except (NamespaceError, OSError) as error:
        return f"ip netns does not work here: {error}"
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_leftovers() -> None:
    """Delete the namespaces and veths a run whose process is gone left behind (a crash, a
    kill -9 of pytest). Deleting a namespace deletes the veth ends inside it, and with them
    their peers."""
    for line in ip("netns", "list").splitlines():
        name = line.split()[0] if line.split() else ""
        found = _NAMESPACE.match(name)
        if found and not _alive(int(found.group(1))):
            with contextlib.suppress(NamespaceError):
                ip("netns", "delete", name)
    for line in ip("-o", "link", "show").splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        found = _LINK.match(name)
        if found and not _alive(int(found.group(1))):
            with contextlib.suppress(NamespaceError):
                ip("link", "delete", name)


def free_block() -> ipaddress.IPv4Network:
    """A /24 of SUBNET no address of this machine's root namespace is in, starting from one
    the pid chooses (two runs at once start apart)."""
    used = {ipaddress.ip_interface(field).ip
            for line in ip("-o", "-4", "addr", "show").splitlines()
            for field in line.split()[3:4]}
    blocks = list(SUBNET.subnets(new_prefix=24))[1:-1]
    start = os.getpid() % len(blocks)
    for block in blocks[start:] + blocks[:start]:
        if not any(address in block for address in used):
            return block
    raise NamespaceError(f"every /24 of {SUBNET} holds an address of this machine")


@dataclass(frozen=True)
class Link:
    """A veth pair: `root` end in the root namespace, `inner` end in the host's; a /30."""

    root: str
    inner: str
    root_address: str
    inner_address: str

    def cut(self) -> None:
        """Set the root end down: whatever the host sends on this link is dropped."""
        ip("link", "set", self.root, "down")

    def restore(self) -> None:
        ip("link", "set", self.root, "up")


@dataclass(frozen=True)
class NamespaceHost:
    """A network namespace with a front link (the host's HTTP address: `address`) and a back
    link (the database: reached at `database_address`, the root end's)."""

    namespace: str
    front: Link
    back: Link

    @property
    def address(self) -> str:
        return self.front.inner_address

    @property
    def database_address(self) -> str:
        return self.back.root_address

    def run(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside the namespace (ip netns exec execs it: same process)."""
        return ["ip", "netns", "exec", self.namespace, *argv]


class Namespaces:
    """Makes NamespaceHosts in a /24 of its own, and deletes every one it made (destroy())."""

    def __init__(self) -> None:
        remove_leftovers()
        self.block = free_block()
        self._addresses = self.block.subnets(new_prefix=30)
        self.made: list[str] = []
        self._links: list[str] = []

    def _link(self, namespace: str, name: str) -> Link:
        pair = next(self._addresses)
        root_address, inner_address = list(pair.hosts())
        root, inner = name, f"{name}n"
        ip("link", "add", root, "type", "veth", "peer", "name", inner)
        self._links.append(root)
        ip("link", "set", inner, "netns", namespace)
        ip("addr", "add", f"{root_address}/30", "dev", root)
        ip("link", "set", root, "up")
        ip("addr", "add", f"{inner_address}/30", "dev", inner, namespace=namespace)
        ip("link", "set", inner, "up", namespace=namespace)
        return Link(root, inner, str(root_address), str(inner_address))

    def host(self, tag: str) -> NamespaceHost:
        """A new host; `tag` is one lowercase letter, unique among this run's hosts."""
        assert re.fullmatch(r"[a-z]", tag), tag
        namespace = f"qlh-{os.getpid()}-{tag}"
        ip("netns", "add", namespace)
        self.made.append(namespace)
        ip("link", "set", "lo", "up", namespace=namespace)
        prefix = f"qh{os.getpid()}{tag}"
        return NamespaceHost(namespace, self._link(namespace, f"{prefix}f"),
                             self._link(namespace, f"{prefix}b"))

    def destroy(self) -> None:
        """Delete every veth and namespace made (each step tried, whatever failed before).
        The veths go first, synchronously (deleting one end deletes its peer); a namespace's
        own end of the kernel goes away in the background once it is deleted, and only once
        no process is left in it."""
        errors = []
        existing = ip("-o", "link", "show")
        for link in self._links:
            if f" {link}:" in existing or f" {link}@" in existing:
                try:
                    ip("link", "delete", link)
                except NamespaceError as error:
                    errors.append(str(error))
        for namespace in self.made:
            try:
                ip("netns", "delete", namespace)
            except NamespaceError as error:
                errors.append(str(error))
        self.made.clear()
        self._links.clear()
        if errors:
            raise NamespaceError("; ".join(errors))
