"""Who a caller is: the roles a key can have, and the authenticated caller of one request."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from app.core.priorities import Priority


class Role(enum.StrEnum):
    PRODUCER = "producer"
    WORKER = "worker"
    ADMIN = "admin"


@dataclass(slots=True)
class Caller:
    """The authenticated key behind one request. A worker's identity is `name`.

    `live_checked` says whether this request has seen the key live in the database; a key
    found in the process's cache is checked inside the request's own transaction instead
    of in one of its own (see KeyService.confirm_live).
    """

    name: str
    role: Role
    max_priority: Priority
    allowed_types: frozenset[str] | None
    token_digest: str = ""
    live_checked: bool = False
    # The service's own caller (the push dispatcher): no key stands behind it, and its
    # name (with a ':', which no key name has) cannot be taken by one.
    internal: bool = False

    @property
    def is_admin(self) -> bool:
        return self.role is Role.ADMIN
