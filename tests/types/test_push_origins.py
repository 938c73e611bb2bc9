"""QUEUELOG_PUSH_ALLOWED_ORIGINS: the operator's list of origins a push url may name, held
when a url is set (422) and again when a job is delivered (a type set before the list
changed is refused delivery, never sent)."""

from __future__ import annotations

from typing import Any

import pytest

from app.config import ConfigError, load_settings
from tests.types.test_push_settings import patch

ALLOWED = "https://Hooks.Example.com, http://10.0.0.5:8080/"


def test_the_list_is_read_as_normalised_origins():
    settings = load_settings({"QUEUELOG_PUSH_ALLOWED_ORIGINS": ALLOWED})
    assert settings["PUSH_ALLOWED_ORIGINS"] == {"https://hooks.example.com:443",
                                                "http://10.0.0.5:8080"}
    assert load_settings({})["PUSH_ALLOWED_ORIGINS"] is None


@pytest.mark.parametrize("value", ["", " , ", "https://h.example/path", "ftp://h.example",
                                   "https://u:p@h.example", "h.example", "https://h?x=1"])
def test_a_list_that_is_not_origins_names_its_variable(value):
    with pytest.raises(ConfigError, match="QUEUELOG_PUSH_ALLOWED_ORIGINS"):
        load_settings({"QUEUELOG_PUSH_ALLOWED_ORIGINS": value})


@pytest.fixture
def app_config(app_config: dict[str, Any]) -> dict[str, Any]:
    return {**app_config, "PUSH_ALLOWED_ORIGINS": ALLOWED}


@pytest.mark.parametrize("url", ["https://hooks.example.com/a?sig=1",
                                 "HTTPS://HOOKS.EXAMPLE.COM:443/b",
                                 "https://bob:pw@hooks.example.com/c",
                                 "http://10.0.0.5:8080/"])
def test_a_push_url_of_a_listed_origin_is_accepted(client, admin, url):
    assert patch(client, admin, "email", push={"url": url}).status_code == 200


@pytest.mark.parametrize("url", ["http://hooks.example.com/a", "https://hooks.example.com:8443/",
                                 "https://evil.example/x", "http://10.0.0.5/x",
                                 "http://127.0.0.1:8080/x",
                                 "https://hooks.example.com@evil.example/x",
                                 "https://hooks.example.com.evil.example/x"])
def test_a_push_url_of_another_origin_is_a_422_naming_the_list(client, admin, url):
    response = patch(client, admin, "email", push={"url": url})
    assert response.status_code == 422, response.json
    assert response.headers["Content-Type"] == "application/problem+json"
    assert "push.url" in response.json["errors"]
    assert "QUEUELOG_PUSH_ALLOWED_ORIGINS" in response.json["detail"]
    assert client.get("/types/email", headers=admin.headers).json["push"] is None


def test_settings_other_than_push_are_not_held_by_the_list(client, admin):
    assert patch(client, admin, "email", max_running=3).status_code == 200
    assert patch(client, admin, "email", push=None).status_code == 200
