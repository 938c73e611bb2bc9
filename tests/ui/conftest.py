"""Helpers for the dashboard's tests through Flask's test client: sign in as a browser
would, read a page's CSRF token."""

from __future__ import annotations

import re
from typing import Any

import pytest
from flask.testing import FlaskClient

from tests.conftest import Key

_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
# The one script a page may carry: the live pages' own static file (docs/DASHBOARD.md).
LIVE_SCRIPT = '<script src="/ui/static/live.js" defer></script>'


def without_live_script(page: str) -> str:
    """The page without its live script's tag: what is left holds no `<script` at all when
    nothing a producer or worker sent became markup."""
    return page.replace(LIVE_SCRIPT, "")


def csrf_of(page: str) -> str:
    match = _CSRF.search(page)
    assert match is not None, "the page has no form with a CSRF token"
    return match.group(1)


def sign_in(client: FlaskClient, key: Key) -> Any:
    token = csrf_of(client.get("/ui/sign-in").get_data(as_text=True))
    return client.post("/ui/sign-in", data={"token": key.token, "csrf_token": token})


def post_form(client: FlaskClient, page: str, action: str,
              data: dict[str, str] | None = None) -> Any:
    """Post `action`'s form as the browser would from `page` (its CSRF token included)."""
    token = csrf_of(client.get(page).get_data(as_text=True))
    return client.post(action, data={**(data or {}), "csrf_token": token})


@pytest.fixture
def signed_in(client: FlaskClient, admin: Key) -> FlaskClient:
    answer = sign_in(client, admin)
    assert answer.status_code == 302 and answer.headers["Location"] == "/ui/"
    return client
