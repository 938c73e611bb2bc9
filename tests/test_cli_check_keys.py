"""`queuelog keys create --check-url`, `keys set-check-url` and `keys check-secret` (contract
§18) through Flask's CLI runner on both engines: what a producer's reservations then take,
the secret shown once, and every mistake as one line with nothing stored or shown."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import select

from app import create_app
from app.storage.schema import api_keys
from tests.conftest import Api, Key

PREFIX = "https://shop.example/queuelog/"
CHECK_URL = "https://shop.example/queuelog/check"
TOKEN = re.compile(r"ql_[A-Za-z0-9_-]{43}")
SECRET = re.compile(r"qlchk_[A-Za-z0-9_-]{43}")


@pytest.fixture
def app_config(app_config: dict[str, Any]) -> dict[str, Any]:
    return {**app_config, "CHECK_URL_ORIGINS": PREFIX}


def keys(runner: Any, *args: str) -> Any:
    return runner.invoke(args=["keys", *args])


def create_shop(runner: Any, *options: str) -> Key:
    result = keys(runner, "create", "shop", "--role", "producer", *options)
    assert result.exit_code == 0, result.output
    return Key("shop", result.stdout.splitlines()[-1])


def stored(app: Flask, name: str) -> dict[str, Any] | None:
    with app.extensions["queuelog"].db.read() as conn:
        row = conn.execute(select(api_keys).where(api_keys.c.name == name)).first()
    return None if row is None else dict(row._mapping)


def listed(runner: Any) -> dict[str, str]:
    """`keys list`'s rows by key name."""
    result = keys(runner, "list")
    assert result.exit_code == 0, result.output
    return {line.split()[0]: line for line in result.stdout.splitlines()[1:]}


def due_check(app: Flask, clock: Any, api: Api, key: Key) -> Any:
    """The check of a reservation `key` makes now, once it is due."""
    made = api.enqueue(key, reserve={"confirm_within_seconds": 30})
    assert made.status_code == 201, made.json
    clock.advance(31)
    dues = app.extensions["queuelog"].jobs.reservations.due_checks(100)
    return next(due for due in dues if due.reservation.job_id == made.json["id"])


def assert_one_line_error(result: Any, *phrases: str) -> None:
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for phrase in phrases:
        assert phrase in lines[0], lines[0]


def test_create_with_a_check_url_sets_the_url_its_reservations_are_checked_at(
        app, runner, api, clock):
    result = keys(runner, "create", "shop", "--role", "producer", "--check-url", CHECK_URL)

    assert result.exit_code == 0, result.output
    *said, token = result.stdout.splitlines()
    assert TOKEN.fullmatch(token)
    assert "queuelog keys check-secret shop" in "\n".join(said)
    assert "shop.example/queuelog/check" in listed(runner)["shop"]
    assert due_check(app, clock, api, Key("shop", token)).reservation.check_url == CHECK_URL


def test_set_check_url_changes_the_url_and_clear_removes_it(app, runner, api, clock):
    shop = create_shop(runner)
    assert listed(runner)["shop"].split()[-1] == "live"  # no check url: nothing shown

    set_ = keys(runner, "set-check-url", "shop", PREFIX + "v2")
    assert set_.exit_code == 0, set_.output
    assert "check-secret shop" in set_.stdout  # it has no secret yet
    assert listed(runner)["shop"].split()[-1] == "https://shop.example/queuelog/v2"
    assert due_check(app, clock, api, shop).reservation.check_url == PREFIX + "v2"

    cleared = keys(runner, "set-check-url", "shop", "--clear")
    assert cleared.exit_code == 0, cleared.output
    assert listed(runner)["shop"].split()[-1] == "live"
    assert stored(app, "shop")["check_url"] is None


def test_check_secret_prints_a_new_secret_once_alone_on_the_last_line(app, runner, api,
                                                                      clock):
    shop = create_shop(runner, "--check-url", CHECK_URL)

    first = keys(runner, "check-secret", "shop")
    second = keys(runner, "check-secret", "shop")

    secrets = []
    for result in (first, second):
        assert result.exit_code == 0, result.output
        secret = result.stdout.splitlines()[-1]
        assert SECRET.fullmatch(secret), secret
        assert result.output.count(secret) == 1
        secrets.append(secret)
    assert secrets[0] != secrets[1]
    assert due_check(app, clock, api, shop).check_secret == secrets[1]
    # Shown nowhere else: not by the list, not by a change of the url.
    again = keys(runner, "set-check-url", "shop", PREFIX + "v2")
    assert "check-secret" not in again.stdout  # it has one now
    for shown in (keys(runner, "list").output, again.output):
        assert secrets[1] not in shown and secrets[1].removeprefix("qlchk_")[:12] not in shown


def test_a_check_urls_credentials_and_query_values_are_never_shown(runner):
    url = "https://bob:hunter2@shop.example/queuelog/check?sig=s3cr3t"

    created = keys(runner, "create", "shop", "--role", "producer", "--check-url", url)
    changed = keys(runner, "set-check-url", "shop", url.replace("check", "recheck"))
    listing = keys(runner, "list")

    for result in (created, changed, listing):
        assert result.exit_code == 0, result.output
        for secret in ("bob", "hunter2", "s3cr3t"):
            assert secret not in result.output
    assert "https://shop.example/queuelog/recheck?sig=***" in listing.stdout


@pytest.mark.parametrize(("args", "phrases"), [
    pytest.param(["create", "shop", "--role", "producer", "--check-url",
                  "https://shop.example.evil/queuelog/check"],
                 ["The check url is refused", "does not start with one of",
                  "QUEUELOG_CHECK_URL_ORIGINS"], id="create: refused url"),
    pytest.param(["create", "shop", "--role", "producer", "--check-url", "shop.example/x"],
                 ["The check url is refused", "not an http or https url"],
                 id="create: not a url"),
    pytest.param(["create", "shop", "--role", "worker", "--check-url", CHECK_URL],
                 ["--check-url", "producer"], id="create: a worker"),
    pytest.param(["set-check-url", "billing", "https://evil.example/queuelog/check"],
                 ["The check url is refused", "QUEUELOG_CHECK_URL_ORIGINS"],
                 id="set: refused url"),
    pytest.param(["set-check-url", "nobody", CHECK_URL], ["no key named 'nobody'"],
                 id="set: unknown key"),
    pytest.param(["set-check-url", "renderer", CHECK_URL],
                 ["'renderer' has the role worker", "only a producer key"], id="set: a worker"),
    pytest.param(["set-check-url", "gone", CHECK_URL], ["'gone' is revoked"],
                 id="set: a revoked key"),
    pytest.param(["set-check-url", "billing"], ["--clear"], id="set: no url"),
    pytest.param(["set-check-url", "billing", CHECK_URL, "--clear"], ["not both"],
                 id="set: a url and --clear"),
    pytest.param(["check-secret", "nobody"], ["no key named 'nobody'"],
                 id="secret: unknown key"),
    pytest.param(["check-secret", "boss"], ["'boss' has the role admin", "only a producer key"],
                 id="secret: an admin"),
])
def test_each_mistake_is_one_line_and_changes_nothing(app, runner, args, phrases):
    for name, role in (("billing", "producer"), ("renderer", "worker"), ("boss", "admin"),
                       ("gone", "producer")):
        assert keys(runner, "create", name, "--role", role).exit_code == 0
    assert keys(runner, "revoke", "gone").exit_code == 0
    before = {name: stored(app, name) for name in ("billing", "renderer", "boss", "gone")}

    result = keys(runner, *args)

    assert_one_line_error(result, *phrases)
    assert not TOKEN.search(result.output) and not SECRET.search(result.output)
    assert stored(app, "shop") is None
    assert {name: stored(app, name) for name in before} == before


@pytest.fixture
def unset_app(app_config: dict[str, Any]) -> Iterator[Flask]:
    """The app of a shell where QUEUELOG_CHECK_URL_ORIGINS is not set."""
    application = create_app({k: v for k, v in app_config.items() if k != "CHECK_URL_ORIGINS"})
    yield application
    application.extensions["queuelog"].db.engine.dispose()


def test_without_check_url_origins_no_check_url_is_taken(unset_app):
    runner = unset_app.test_cli_runner()
    assert keys(runner, "create", "billing", "--role", "producer").exit_code == 0

    created = keys(runner, "create", "shop", "--role", "producer", "--check-url", CHECK_URL)
    changed = keys(runner, "set-check-url", "billing", CHECK_URL)

    for result in (created, changed):
        assert_one_line_error(result, "QUEUELOG_CHECK_URL_ORIGINS is not set")
    assert stored(unset_app, "shop") is None
    assert stored(unset_app, "billing")["check_url"] is None
    # A secret needs no list: a reservation's own check url is signed with it too.
    assert SECRET.fullmatch(keys(runner, "check-secret", "billing").stdout.splitlines()[-1])
