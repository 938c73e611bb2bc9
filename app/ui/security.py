"""The dashboard's defences beside the session: CSRF tokens (Flask-WTF) on its forms, and the
headers every dashboard response carries."""

from __future__ import annotations

from flask import Flask, Response, request
from flask_wtf.csrf import CSRFProtect

from app.ui.session import SESSION_LIFETIME, is_dashboard

csrf = CSRFProtect()

# No script at all, styles only from our own static file, forms only to ourselves, never in
# a frame.
CONTENT_SECURITY_POLICY = ("default-src 'none'; style-src 'self'; img-src 'self'; "
                           "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Pages show payloads and errors: no copy of them kept by the browser or a proxy.
    "Cache-Control": "no-store",
}


def init_security(app: Flask) -> None:
    app.config.update(
        # Checked by the dashboard's own before_request alone (app/ui/routes.py): the JSON
        # API is not asked for tokens.
        WTF_CSRF_CHECK_DEFAULT=False,
        # A token lives as long as the session that holds it (at most 8 hours).
        WTF_CSRF_TIME_LIMIT=None,
        # Flask-WTF's https check wants a Referer header, which Referrer-Policy: no-referrer
        # withholds; the token and the SameSite=Strict cookie already stop cross-site posts.
        WTF_CSRF_SSL_STRICT=False,
        PERMANENT_SESSION_LIFETIME=SESSION_LIFETIME,
        SESSION_COOKIE_NAME="queuelog_session",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Strict",
        SESSION_COOKIE_PATH="/ui",
    )
    csrf.init_app(app)

    @app.after_request
    def dashboard_headers(response: Response) -> Response:
        if is_dashboard(request.path):
            response.headers.update(HEADERS)
        return response
