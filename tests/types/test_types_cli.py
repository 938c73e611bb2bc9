"""`queuelog types list` and `queuelog types set`: flow control for operators without an admin
key at hand, through the same service as PATCH /types."""

from __future__ import annotations

from typing import Any

import pytest


def test_set_changes_the_named_settings_and_list_shows_them(runner, client, admin, api,
                                                            producer):
    api.enqueue(producer, type="sync")

    result = runner.invoke(args=["types", "set", "sync", "--paused", "--max-running", "3",
                                 "--rate", "2.5"])

    assert result.exit_code == 0, result.output
    assert "paused=yes max_running=3" in result.output and "burst=3" in result.output
    shown = client.get("/types/sync", headers=admin.headers).json
    assert (shown["paused"], shown["max_running"], shown["rate_per_second"]) == (True, 3, 2.5)

    listed = runner.invoke(args=["types", "list"])
    assert listed.exit_code == 0, listed.output
    sync_line = next(line for line in listed.output.splitlines() if line.startswith("sync"))
    assert sync_line.split()[:6] == ["sync", "yes", "3", "-", "2.5", "3"]
    assert sync_line.split()[6] == "1"  # pending


def test_resume_and_clear_undo_the_settings(runner, client, admin):
    runner.invoke(args=["types", "set", "email", "--paused", "--max-running-per-key", "2",
                        "--burst", "7"])

    result = runner.invoke(args=["types", "set", "email", "--resume",
                                 "--clear-max-running-per-key", "--clear-burst"])

    assert result.exit_code == 0, result.output
    shown = client.get("/types/email", headers=admin.headers).json
    assert (shown["paused"], shown["max_running_per_key"], shown["burst"]) == (False, None, 1)


@pytest.mark.parametrize("args,message", [
    (["fax", "--paused"], "not a configured job type"),
    (["email"], "nothing to change"),
    (["email", "--max-running", "0"], "0"),
    (["email", "--rate", "1", "--clear-rate"], "not both"),
])
def test_bad_invocations_change_nothing_and_say_why(runner, client, admin, args: Any,
                                                    message: str):
    result = runner.invoke(args=["types", "set", *args])

    assert result.exit_code != 0
    assert message in result.output
    assert client.get("/types/email", headers=admin.headers).json["max_running"] is None


def test_list_shows_the_finished_counts_and_no_burst_without_a_rate(runner, client, admin,
                                                                     api):
    listed = runner.invoke(args=["types", "list"]).output.splitlines()
    header = listed[0].split()
    assert {"completed", "failed", "cancelled"} <= set(header)
    email = dict(zip(header, next(line for line in listed if line.startswith("email ")).split(),
                     strict=False))
    assert email["rate/s"] == "-" and email["burst"] == "-"
    assert email["completed"] == email["failed"] == email["cancelled"] == "0"
    result = runner.invoke(args=["types", "set", "email", "--max-running", "2"])
    assert result.exit_code == 0, result.output
    assert "burst=-" in result.output
    result = runner.invoke(args=["types", "set", "email", "--rate", "2.5"])
    assert "burst=3" in result.output


def test_set_turns_fairness_and_ordering_on_and_off(runner, client, admin):
    result = runner.invoke(args=["types", "set", "sync", "--fairness", "key", "--ordering",
                                 "key", "--on-failure", "block"])
    assert result.exit_code == 0, result.output
    assert "fairness=key ordering=key on_failure=block" in result.output
    shown = client.get("/types/sync", headers=admin.headers).json
    assert (shown["fairness"], shown["ordering"], shown["on_failure"]) == ("key", "key", "block")

    result = runner.invoke(args=["types", "set", "sync", "--fairness", "off", "--ordering",
                                 "off"])
    assert "fairness=off ordering=off on_failure=block" in result.output
    bad = runner.invoke(args=["types", "set", "sync", "--ordering", "tenant"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output
