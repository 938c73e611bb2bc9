"""A producer key's check url and check secret (contract §18), through the key service on both
engines: what its reservations take, what their checks are signed with, and the refusals."""

from __future__ import annotations

import re
from typing import Any

import pytest
from sqlalchemy import select

from app.core.callers import Role
from app.core.errors import ValidationFailed
from app.keys.service import KeyCommandError, KeyService
from app.storage.schema import api_keys
from tests.conftest import Api, Key

PREFIX = "https://shop.example/queuelog/"
CHECK_URL = "https://shop.example/queuelog/check"
SECRET = re.compile(r"qlchk_[A-Za-z0-9_-]{43}")


@pytest.fixture
def app_config(app_config: dict[str, Any]) -> dict[str, Any]:
    return {**app_config, "CHECK_URL_ORIGINS": PREFIX}


@pytest.fixture
def keys(app: Any, clock: Any) -> KeyService:
    return KeyService(app.extensions["queuelog"].db, clock, check_url_prefixes=(PREFIX,))


@pytest.fixture
def shop(keys: KeyService) -> Key:
    return Key("shop", keys.create_key("shop", Role.PRODUCER, check_url=CHECK_URL))


def reserve(api: Api, key: Key, seconds: int = 30) -> int:
    made = api.enqueue(key, reserve={"confirm_within_seconds": seconds})
    assert made.status_code == 201, made.json
    job_id: int = made.json["id"]
    return job_id


def due_checks(app: Any, clock: Any, seconds: int = 31) -> dict[int, Any]:
    """The checks due `seconds` from now, by job id."""
    clock.advance(seconds)
    return {due.reservation.job_id: due
            for due in app.extensions["queuelog"].jobs.reservations.due_checks(100)}


def stored(app: Any, name: str) -> dict[str, Any]:
    with app.extensions["queuelog"].db.read() as conn:
        row = conn.execute(select(api_keys).where(api_keys.c.name == name)).one()
    return dict(row._mapping)


def test_a_producer_created_with_a_check_url_lends_it_to_its_reservations(app, api, clock,
                                                                         shop):
    job_id = reserve(api, shop)

    due = due_checks(app, clock)[job_id]

    assert due.reservation.check_url == CHECK_URL
    assert due.check_secret is None  # none until `keys check-secret` makes one


def test_the_check_secret_made_is_strong_new_each_time_and_signs_the_checks(
        app, api, clock, keys, shop):
    job_id = reserve(api, shop)

    first = keys.rotate_check_secret("shop")
    second = keys.rotate_check_secret("shop")

    assert SECRET.fullmatch(first) and SECRET.fullmatch(second)
    assert first != second
    assert due_checks(app, clock)[job_id].check_secret == second  # the one before is gone
    assert stored(app, "shop")["check_secret"] == second


def test_a_changed_check_url_is_taken_by_later_reservations_and_earlier_ones_keep_theirs(
        app, api, clock, keys, shop):
    before = reserve(api, shop)
    other = PREFIX + "v2/check?shop=7"
    assert keys.set_check_url("shop", other).check_url == other
    after = reserve(api, shop)
    keys.set_check_url("shop", None)
    unchecked = reserve(api, shop)

    due = due_checks(app, clock)

    assert due[before].reservation.check_url == CHECK_URL
    assert due[after].reservation.check_url == other
    assert unchecked not in due  # no check url: released at its deadline instead
    # (by maintenance, which moving the clock past the deadline ran)
    assert api.get(shop, unchecked).json["status"] == "cancelled"
    assert app.extensions["queuelog"].jobs.reservations.release_overdue() == 0
    assert stored(app, "shop")["check_url"] is None


def test_a_reservations_own_check_url_wins_over_its_keys(app, api, clock, shop):
    own = PREFIX + "own"
    made = api.enqueue(shop, reserve={"confirm_within_seconds": 30, "check_url": own})

    assert due_checks(app, clock)[made.json["id"]].reservation.check_url == own


@pytest.mark.parametrize("url", [
    pytest.param("https://shop.example.evil/queuelog/check", id="look-alike host"),
    pytest.param("https://shop.example@evil.example/queuelog/check", id="user part"),
    pytest.param("https://shop.example/elsewhere", id="another path"),
    pytest.param("https://shop.example:8443/queuelog/check", id="another port"),
    pytest.param("http://shop.example/queuelog/check", id="another scheme"),
    pytest.param("ftp://shop.example/queuelog/check", id="not http"),
    pytest.param("https://shop.example/queuelog/check#part", id="fragment"),
    pytest.param("https://shop.example/queuelog/a b", id="space"),
    pytest.param("shop.example/queuelog/check", id="no scheme"),
    pytest.param(PREFIX + "x" * 2000, id="too long"),
    pytest.param(PREFIX + "%2e%2e/metrics", id="encoded dots"),
    pytest.param(PREFIX + "..%2Fmetrics", id="encoded slash"),
    pytest.param(PREFIX + "..%5cmetrics", id="encoded backslash"),
])
def test_a_refused_check_url_is_never_stored(app, keys, url):
    keys.create_key("plain", Role.PRODUCER)

    with pytest.raises(ValidationFailed) as created:
        keys.create_key("shop", Role.PRODUCER, check_url=url)
    with pytest.raises(ValidationFailed) as changed:
        keys.set_check_url("plain", url)

    for refused in (created.value, changed.value):
        assert refused.detail.startswith("The check url is refused: ")
        assert refused.errors is not None and list(refused.errors) == ["check_url"]
        assert url not in refused.detail  # it may carry credentials: never quoted
    assert [key.name for key in keys.list_keys()] == ["plain"]
    assert stored(app, "plain")["check_url"] is None


def test_with_no_check_url_origins_set_every_check_url_is_refused(app, clock):
    unset = KeyService(app.extensions["queuelog"].db, clock)
    unset.create_key("shop", Role.PRODUCER)

    with pytest.raises(ValidationFailed, match="QUEUELOG_CHECK_URL_ORIGINS is not set"):
        unset.set_check_url("shop", CHECK_URL)
    with pytest.raises(ValidationFailed, match="QUEUELOG_CHECK_URL_ORIGINS is not set"):
        unset.create_key("shop-2", Role.PRODUCER, check_url=CHECK_URL)
    assert unset.set_check_url("shop", None).check_url is None  # clearing needs no list


@pytest.mark.parametrize("role", [Role.WORKER, Role.ADMIN])
def test_only_a_producer_key_has_a_check_url_or_a_check_secret(app, keys, role):
    with pytest.raises(KeyCommandError, match="producer"):
        keys.create_key("other", role, check_url=CHECK_URL)
    keys.create_key("other", role)

    with pytest.raises(KeyCommandError, match="only a producer key"):
        keys.set_check_url("other", CHECK_URL)
    with pytest.raises(KeyCommandError, match="only a producer key"):
        keys.rotate_check_secret("other")

    assert (stored(app, "other")["check_url"], stored(app, "other")["check_secret"]) == (
        None, None)


def test_an_unknown_key_has_no_check_url_or_secret_to_change(keys):
    with pytest.raises(KeyCommandError, match="no key named 'nobody'"):
        keys.set_check_url("nobody", CHECK_URL)
    with pytest.raises(KeyCommandError, match="no key named 'nobody'"):
        keys.rotate_check_secret("nobody")


def test_a_revoked_keys_check_url_stays_but_its_secret_may_still_be_rotated(
        app, api, clock, keys, shop):
    job_id = reserve(api, shop)
    keys.revoke_key("shop")

    with pytest.raises(KeyCommandError, match="revoked"):
        keys.set_check_url("shop", PREFIX + "v2")
    # Its reservations made before the revocation are still checked, signed with the new one.
    secret = keys.rotate_check_secret("shop")

    due = due_checks(app, clock)[job_id]
    assert (due.reservation.check_url, due.check_secret) == (CHECK_URL, secret)
