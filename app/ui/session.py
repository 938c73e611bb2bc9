"""The dashboard's sessions, kept on the server. The cookie holds a random id and nothing
else; the database holds only the id's SHA-256 digest beside the admin key's id and the
expiry, as it holds only digests of API tokens. So nothing readable from the database can
present or sign a session, and deleting the row (sign-out, the key revoked, expiry) ends
it: a copied cookie dies with it. Every page reads the key again, so a revoked key's
sessions end at its next page.

A browser that has not signed in gets an id too (not stored): the sign-in form's CSRF token
is derived from it, and the id is replaced at sign-in, so no id chosen before survives it."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from datetime import timedelta
from typing import Any

from flask import Flask, Request, Response, current_app, request, session
from flask.sessions import SessionInterface, SessionMixin
from werkzeug.datastructures import CallbackDict

from app.core.callers import Caller, Role
from app.ui.repository import SessionRepository

SESSION_LIFETIME = timedelta(hours=8)
COOKIE_NAME = "queuelog_session"
UI_PREFIX = "/ui"
# What secrets.token_urlsafe(32) makes: anything else in the cookie is no id of ours.
_ID_SHAPE = re.compile(r"[A-Za-z0-9_-]{43}")
_CSRF_PURPOSE = b"queuelog dashboard CSRF token"


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("ascii")).hexdigest()


class DashboardSession(CallbackDict[str, Any], SessionMixin):
    """One browser's session: its id (from the cookie, or new), the admin key it signed in
    with (None before sign-in) and the data a page leaves for the next (flashes)."""

    def __init__(self, session_id: str, key_id: int | None, data: dict[str, Any],
                 *, new: bool) -> None:
        def changed(_: Any) -> None:
            self.modified = True

        super().__init__(data, changed)
        self.session_id, self.key_id, self.new = session_id, key_id, new
        self.modified = False

    def restart(self, key_id: int | None) -> None:
        """Go on under a fresh id (sent as a new cookie), signed in as `key_id` or not."""
        self.session_id, self.key_id, self.new = secrets.token_urlsafe(32), key_id, True
        self.clear()
        self.modified = False

    @property
    def digest(self) -> str:
        return _digest(self.session_id)

    def csrf_token(self) -> str:
        """The CSRF token of this session's forms: an HMAC of its id, which only the
        browser's cookie holds; a new id (sign-in, sign-out) makes the old forms' tokens
        worthless."""
        return hmac.new(self.session_id.encode("ascii"), _CSRF_PURPOSE,
                        hashlib.sha256).hexdigest()


class DashboardSessionInterface(SessionInterface):
    """Server-side sessions for the dashboard's paths alone: the JSON API never reads a
    cookie (its requests get Flask's null session)."""

    def open_session(self, app: Flask, request: Request) -> SessionMixin | None:
        if not is_dashboard(request.path):
            return self.make_null_session(app)
        session_id = request.cookies.get(COOKIE_NAME, "")
        if _ID_SHAPE.fullmatch(session_id):
            services = app.extensions["queuelog"]
            with services.db.read() as conn:
                stored = SessionRepository(conn).find_session(_digest(session_id),
                                                              services.clock.now_us())
            if stored is not None:
                return DashboardSession(session_id, stored.key_id, json.loads(stored.data),
                                        new=False)
            # Not (or no longer) signed in: the id still keys the sign-in form's CSRF token.
            return DashboardSession(session_id, None, {}, new=False)
        fresh = DashboardSession("", None, {}, new=True)
        fresh.restart(None)
        return fresh

    def save_session(self, app: Flask, session: SessionMixin, response: Response) -> None:
        if not isinstance(session, DashboardSession):
            return
        if session.key_id is not None and session.modified and not session.new:
            data = json.dumps(dict(session))
            app.extensions["queuelog"].db.run_write(
                lambda conn: SessionRepository(conn).save_data(session.digest, data))
        if session.new:
            # A signed-in session's cookie lasts as long as its row; an anonymous one, the
            # browser's session.
            max_age = int(SESSION_LIFETIME.total_seconds()) if session.key_id else None
            response.set_cookie(COOKIE_NAME, session.session_id, max_age=max_age,
                                path=UI_PREFIX, secure=request.is_secure, httponly=True,
                                samesite="Strict")


def is_dashboard(path: str) -> bool:
    return path == UI_PREFIX or path.startswith(UI_PREFIX + "/")


def _current() -> DashboardSession:
    current = session._get_current_object()  # type: ignore[attr-defined]
    assert isinstance(current, DashboardSession), "a dashboard path has a dashboard session"
    return current


def csrf_token() -> str:
    return _current().csrf_token()


def sign_in(key_id: int) -> None:
    """Start a fresh session for this admin key, under a new id (whatever the browser held
    before, and whichever session it was, is over)."""
    current, services = _current(), current_app.extensions["queuelog"]
    old = current.digest if current.key_id is not None else None
    current.restart(key_id)
    now = services.clock.now_us()
    expires_at = now + int(SESSION_LIFETIME.total_seconds() * 1_000_000)
    digest = current.digest

    def store(conn: Any) -> None:
        repo = SessionRepository(conn)
        if old is not None:
            repo.delete_session(old)
        repo.add_session(digest, key_id, now, expires_at)

    services.db.run_write(store)


def sign_out() -> None:
    """End this session: its row goes, so the cookie (and any copy of it) is refused."""
    current = _current()
    if current.key_id is not None:
        digest = current.digest
        current_app.extensions["queuelog"].db.run_write(
            lambda conn: SessionRepository(conn).delete_session(digest))
    current.restart(None)


def signed_in_caller() -> Caller | None:
    """The admin behind this session, read from the database now; None when there is none
    (no session, or it expired or was signed out), and None with every session of the key
    ended when the key is revoked or no longer an admin's."""
    current = _current()
    if current.key_id is None:
        return None
    keys = current_app.extensions["queuelog"].keys
    key = keys.live_key(current.key_id)
    if key is None or key.role != Role.ADMIN:
        key_id = current.key_id
        current_app.extensions["queuelog"].db.run_write(
            lambda conn: SessionRepository(conn).delete_sessions_of_key(key_id))
        current.restart(None)
        return None
    return keys.caller_of(key)  # type: ignore[no-any-return]
