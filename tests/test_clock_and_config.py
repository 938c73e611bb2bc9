"""Time on the wire and settings from the environment."""

from __future__ import annotations

import pytest

from app.config import ConfigError, load_settings
from app.core.clock import parse_rfc3339, to_rfc3339


@pytest.mark.parametrize("text,expected", [
    ("1970-01-01T00:00:00Z", "1970-01-01T00:00:00.000000Z"),
    ("2026-11-30T04:40:43.123456Z", "2026-11-30T04:40:43.123456Z"),
    ("2026-11-30T05:40:43.1234567+01:00", "2026-11-30T04:40:43.123456Z"),
    ("2026-11-30t04:40:43z", "2026-11-30T04:40:43.000000Z"),
    ("2026-11-29T23:40:43-05:00", "2026-11-30T04:40:43.000000Z"),
])
def test_rfc3339_round_trips_through_utc_microseconds(text, expected):
    assert to_rfc3339(parse_rfc3339(text)) == expected


@pytest.mark.parametrize("text", ["2026-11-30", "2026-11-30T04:40:43", "20261130T044043Z",
                                  "2026-13-01T00:00:00Z", "2026-11-30T04:40:43+0100", "now"])
def test_rfc3339_without_an_offset_or_malformed_is_refused(text):
    with pytest.raises(ValueError):
        parse_rfc3339(text)


def test_settings_have_the_contract_defaults():
    settings = load_settings({})
    assert settings["LEASE_SECONDS"] == 300
    assert settings["MAX_PAYLOAD_BYTES"] == 65_536
    assert settings["MAX_CONTENT_LENGTH"] == 1024 * 1024
    assert settings["RETRY_BACKOFF_SECONDS"] == 1
    assert settings["RETRY_BACKOFF_MAX_SECONDS"] == 3600
    assert settings["JOB_TYPES"] == frozenset()
    assert settings["METRICS_PUBLIC"] is False
    assert settings["SQLITE_SYNCHRONOUS"] == "FULL"


def test_settings_are_read_from_queuelog_variables():
    settings = load_settings({"QUEUELOG_JOB_TYPES": "email, pdf,,", "QUEUELOG_LEASE_SECONDS": "60",
                              "QUEUELOG_METRICS_PUBLIC": "1"})
    assert settings["JOB_TYPES"] == {"email", "pdf"}
    assert settings["LEASE_SECONDS"] == 60
    assert settings["METRICS_PUBLIC"] is True


@pytest.mark.parametrize("variable,value", [("QUEUELOG_LEASE_SECONDS", "0"),
                                            ("QUEUELOG_LEASE_SECONDS", "ten"),
                                            ("QUEUELOG_METRICS_PUBLIC", "maybe"),
                                            ("QUEUELOG_SQLITE_SYNCHRONOUS", "FAST"),
                                            ("QUEUELOG_LISTEN_DATABASE_URL", "not a url"),
                                            ("QUEUELOG_LISTEN_DATABASE_URL",
                                             "sqlite:///queue.sqlite3")])
def test_a_bad_setting_stops_the_service_with_its_name(variable, value):
    with pytest.raises(ConfigError, match=variable):
        load_settings({variable: value})
