"""The dashboard's defences beside the session: a CSRF token on every form (derived from the
session's id, app/ui/session.py), and the headers every dashboard response carries."""

from __future__ import annotations

import hmac

from flask import Flask, Response, request
from werkzeug.exceptions import BadRequest

from app.ui.session import csrf_token, is_dashboard

# Scripts only from our own static files (the live pages' live.js: no inline script, no
# eval), which may ask only our own origin (its JSON twins) and may not write HTML into a
# page (Trusted Types, with no policy to make any); styles only from our own static file,
# forms only to ourselves, never in a frame.
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; connect-src 'self'; "
                           "style-src 'self'; img-src 'self'; form-action 'self'; "
                           "frame-ancestors 'none'; base-uri 'none'; "
                           "require-trusted-types-for 'script'; trusted-types 'none'")
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Pages show payloads and errors: no copy of them kept by the browser or a proxy.
    "Cache-Control": "no-store",
}
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class CSRFRefused(BadRequest):
    description = "The form came without a valid CSRF token."


def check_csrf() -> None:
    """Refuse a dashboard form posted without its session's token. The JSON API is never
    asked: its bearer keys are no ambient credential a forged cross-site request could use."""
    if request.method in _SAFE_METHODS:
        return
    sent = request.form.get("csrf_token", "")
    if not hmac.compare_digest(sent.encode("utf-8", "surrogatepass"),
                               csrf_token().encode("ascii")):
        raise CSRFRefused()


def init_security(app: Flask) -> None:
    app.jinja_env.globals["csrf_token"] = csrf_token

    @app.after_request
    def dashboard_headers(response: Response) -> Response:
        if is_dashboard(request.path):
            response.headers.update(HEADERS)
        return response
