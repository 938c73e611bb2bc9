"""The dashboard's sessions kept on the server and its throttled sign-ins
(27.10): nothing read from the database presents or signs a session, sign-out and revocation
end a copied cookie, and guesses at tokens are refused past a count every process shares."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from flask import Flask
from flask.sessions import SecureCookieSessionInterface
from flask.testing import FlaskClient
from sqlalchemy import column, select, table, text

from app.core.callers import Role
from app.core.clock import ManualClock
from app.storage.engine import make_engine
from app.storage.migrations import upgrade
from app.storage.schema import metadata
from app.ui.throttle import FAILURES_OVERALL, FAILURES_PER_ADDRESS, WINDOW_SECONDS
from tests.conftest import Key
from tests.ui.conftest import csrf_of, post_form, sign_in


def _cookie(client: FlaskClient) -> str:
    cookie = client.get_cookie("queuelog_session", path="/ui")
    assert cookie is not None
    return cookie.value


def _with_cookie(app: Flask, value: str) -> FlaskClient:
    browser = app.test_client()
    browser.set_cookie("queuelog_session", value, path="/ui")
    return browser


def _signed_in(answer: Any) -> bool:
    return answer.status_code == 200


def _everything_stored(app: Flask) -> list[str]:
    """Every text value in every table of the database: what a reader of the file has."""
    values: list[str] = []
    with app.extensions["queuelog"].db.read() as conn:
        for stored in metadata.sorted_tables:
            for row in conn.execute(select(stored)):
                values += [value for value in row if isinstance(value, str)]
    return values


def test_nothing_in_the_database_presents_or_signs_an_admin_session(
        app: Flask, signed_in: FlaskClient, admin: Key) -> None:
    """The forgeries a reader of the database could try: any stored value as the cookie, or
    as the key Flask's signed cookies (what sessions were) are signed with."""
    cookie = _cookie(signed_in)
    stored = _everything_stored(app)
    assert stored, "the database holds the keys and the session"
    admin_id = app.extensions["queuelog"].keys.key_for_token(admin.token).id
    claims = {"key_id": admin_id, "issued_at": int(time.time()), "_permanent": True}
    for value in stored:
        assert not _signed_in(_with_cookie(app, value).get("/ui/")), value
        forger = Flask("forger")
        forger.secret_key = value
        forged = SecureCookieSessionInterface().get_signing_serializer(forger)
        assert forged is not None
        assert not _signed_in(_with_cookie(app, forged.dumps(claims)).get("/ui/")), value
    assert _signed_in(_with_cookie(app, cookie).get("/ui/"))  # the real cookie still works
    assert cookie not in stored and hashlib.sha256(cookie.encode()).hexdigest() in stored


def test_a_copied_cookie_is_refused_after_sign_out(app: Flask, signed_in: FlaskClient) -> None:
    copied = _cookie(signed_in)
    assert _signed_in(_with_cookie(app, copied).get("/ui/"))
    assert post_form(signed_in, "/ui/", "/ui/sign-out").status_code == 302
    answer = _with_cookie(app, copied).get("/ui/jobs")
    assert answer.status_code == 302 and answer.headers["Location"] == "/ui/sign-in"


def test_revoking_the_key_ends_every_session_it_signed_in(app: Flask, admin: Key) -> None:
    browsers = [app.test_client(), app.test_client()]
    for browser in browsers:
        assert sign_in(browser, admin).status_code == 302
    copied = _cookie(browsers[0])
    app.extensions["queuelog"].keys.revoke_key(admin.name)
    assert browsers[0].get("/ui/").status_code == 302
    # Ended in the database, not only for the browser that asked first.
    with app.extensions["queuelog"].db.read() as conn:
        assert conn.execute(text("SELECT count(*) FROM ui_sessions")).scalar_one() == 0
    for browser in (browsers[1], _with_cookie(app, copied)):
        assert browser.get("/ui/").status_code == 302


def test_signing_in_replaces_the_id_the_browser_held_before(
        client: FlaskClient, admin: Key) -> None:
    page = client.get("/ui/sign-in")
    before = _cookie(client)
    client.post("/ui/sign-in", data={"token": admin.token, "csrf_token": csrf_of(page.text)})
    assert _cookie(client) != before
    assert csrf_of(client.get("/ui/").text) != csrf_of(page.text)


def test_a_form_token_of_one_session_is_refused_in_another(
        app: Flask, signed_in: FlaskClient, admin: Key) -> None:
    other = app.test_client()
    sign_in(other, admin)
    foreign = csrf_of(other.get("/ui/").text)
    answer = signed_in.post("/ui/types/email/pause", data={"csrf_token": foreign})
    assert answer.status_code == 400 and "CSRF" in answer.text


def test_a_cookie_that_is_no_id_of_ours_is_a_fresh_anonymous_session(
        app: Flask) -> None:
    for value in ("", "x" * 43 + "!", "ü" * 43, "a" * 500):
        browser = _with_cookie(app, value)
        assert browser.get("/ui/").status_code == 302
        assert browser.get("/ui/sign-in").status_code == 200


# -- throttling ----------------------------------------------------------------------------

WRONG = "ql_wrong"  # a token no key has


def _guess(client: FlaskClient, token: str = WRONG, address: str = "192.0.2.1") -> Any:
    environ = {"REMOTE_ADDR": address}
    page = client.get("/ui/sign-in", environ_base=environ)
    return client.post("/ui/sign-in", environ_base=environ,
                       data={"token": token, "csrf_token": csrf_of(page.text)})


def test_failed_sign_ins_from_one_address_are_refused_for_the_rest_of_the_window(
        client: FlaskClient, admin: Key, clock: ManualClock) -> None:
    for _ in range(FAILURES_PER_ADDRESS):
        assert _guess(client).status_code == 401
    refused = _guess(client, admin.token)  # the right token too: it is not even looked at
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["Retry-After"]) <= WINDOW_SECONDS
    assert "Too many failed sign-ins" in refused.text
    assert _guess(client, admin.token, address="192.0.2.2").status_code == 302
    clock.advance(WINDOW_SECONDS)
    assert _guess(client, admin.token).status_code == 302


def test_failed_sign_ins_from_many_addresses_are_throttled_together(
        client: FlaskClient, admin: Key) -> None:
    for number in range(FAILURES_OVERALL):
        address = f"198.51.100.{number // (FAILURES_PER_ADDRESS - 1)}"
        assert _guess(client, address=address).status_code == 401, number
    assert _guess(client, admin.token, address="203.0.113.9").status_code == 429


def test_every_process_counts_the_same_failures(app_config: dict[str, Any],
                                                admin: Key) -> None:
    from app import create_app

    first, second = create_app(app_config), create_app(app_config)
    for _ in range(FAILURES_PER_ADDRESS):
        assert _guess(first.test_client()).status_code == 401
    assert _guess(second.test_client(), admin.token).status_code == 429
    for built in (first, second):
        built.extensions["queuelog"].db.engine.dispose()


# -- the migration -------------------------------------------------------------------------

def test_the_upgrade_removes_the_stored_session_key_and_keeps_the_rest(
        empty_db_url: str) -> None:
    """0013 on a database 0012 filled: the plaintext key goes with its table, keys and jobs
    stay, and sessions start empty."""
    upgrade(empty_db_url, "0012")
    engine = make_engine(empty_db_url, pooled=False)
    secret = {"name": "ui_session", "value": "s" * 64, "created_at": 1}
    key = {"name": "ops", "role": Role.ADMIN.value, "token_digest": "d" * 64,
           "max_priority": 10, "created_at": 1}
    with engine.begin() as conn:
        conn.execute(table("service_secrets", *map(column, secret)).insert(), secret)
        conn.execute(table("api_keys", *map(column, key)).insert(), key)
    upgrade(empty_db_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT name FROM api_keys")).scalars().all() == ["ops"]
        assert conn.execute(text("SELECT count(*) FROM ui_sessions")).scalar_one() == 0
        dumped = json.dumps([list(row) for kept in ("api_keys", "ui_sessions")
                             for row in conn.execute(select(metadata.tables[kept]))])
        tables = set(engine.dialect.get_table_names(conn))
    engine.dispose()
    assert "service_secrets" not in tables and "s" * 64 not in dumped
