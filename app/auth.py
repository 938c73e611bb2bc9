"""Bearer-key authentication and role checks. Raises problems; never builds responses."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from flask import current_app, g, request

from app.errors import Forbidden, Unauthorized
from app.keys.models import Caller, Role

F = TypeVar("F", bound=Callable[..., Any])

# A token is printable ASCII without spaces; anything longer than this is no token of ours.
_MAX_TOKEN_LENGTH = 200


def bearer_token() -> str:
    header = request.headers.get("Authorization")
    if header is None:
        raise Unauthorized("Send an API key as 'Authorization: Bearer <token>'.")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if (scheme.lower() != "bearer" or not token or len(token) > _MAX_TOKEN_LENGTH
            or not token.isascii() or not token.isprintable() or " " in token):
        raise Unauthorized("The Authorization header is not 'Bearer <token>'.")
    return token


def authenticate() -> Caller:
    """The caller behind this request's bearer token; 401 when there is none that is live."""
    caller = current_app.extensions["queuelog"].keys.caller_for_token(bearer_token())
    if caller is None:
        raise Unauthorized("The API key is unknown or revoked.")
    g.caller = caller
    return caller


def current_caller() -> Caller:
    return g.caller


def require_roles(*roles: Role) -> Callable[[F], F]:
    """Authenticate the request and let it through only for the given roles (else 403)."""
    allowed = frozenset(roles)

    def decorate(view: F) -> F:
        @functools.wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            caller = authenticate()
            if caller.role not in allowed:
                raise Forbidden(f"A {caller.role.value} key may not use this route.")
            return view(*args, **kwargs)

        wrapper.allowed_roles = allowed  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate
