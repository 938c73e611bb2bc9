"""Bearer-key authentication and role checks. Raises problems; never builds responses (the
error handlers in app/web/problems.py render every one)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from flask import Flask, Response, current_app, g, request
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from app.core.callers import Caller, Role
from app.core.errors import Forbidden, Unauthorized
from app.core.limits import TOKEN_CHARS

F = TypeVar("F", bound=Callable[..., Any])

_REVOKED = "The API key is unknown or revoked."


def bearer_token() -> str:
    header = request.headers.get("Authorization")
    if header is None:
        raise Unauthorized("Send an API key as 'Authorization: Bearer <token>'.")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    # A token is printable ASCII without spaces; anything longer is no token of ours.
    if (scheme.lower() != "bearer" or not token or len(token) > TOKEN_CHARS.max
            or not token.isascii() or not token.isprintable() or " " in token):
        raise Unauthorized("The Authorization header is not 'Bearer <token>'.")
    return token


def authenticate() -> Caller:
    """The caller behind this request's bearer token; 401 when there is none that is live.

    A key this process has seen before is not looked up again here: the request's own
    transaction confirms it is still live, and `init_auth` makes sure of it for answers
    that ran none.
    """
    caller: Caller | None = current_app.extensions["queuelog"].keys.caller_for_token(
        bearer_token())
    if caller is None:
        raise Unauthorized(_REVOKED)
    g.caller = caller
    return caller


def current_caller() -> Caller:
    caller: Caller = g.caller
    return caller


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


def init_auth(app: Flask) -> None:
    @app.after_request
    def confirm_key_still_live(response: Response) -> Response:
        # Answers that ran no transaction confirming the key (an error before the service
        # was reached, a claim with nothing to look for, a metrics scrape) ask now: a key
        # revoked since this process cached it gets its 401 on its very next request.
        caller: Caller | None = g.get("caller")
        if (caller is None or caller.live_checked or response.status_code == 401
                or response.status_code >= 500):
            return response
        try:
            live = current_app.extensions["queuelog"].keys.is_live(caller)
        except (OperationalError, PoolTimeoutError) as error:
            return _answer(error)
        return response if live else _answer(Unauthorized(_REVOKED))


def _answer(error: Exception) -> Response:
    """The error handlers' answer to `error`: a hook that runs after the request cannot
    raise to them, so it asks them."""
    return current_app.make_response(current_app.handle_user_exception(error))
