"""`queuelog schedules list|create|pause|resume|delete`, as the operator runs them."""

from __future__ import annotations

from typing import Any


def test_create_list_pause_resume_delete(runner: Any) -> None:
    created = runner.invoke(args=["schedules", "create", "nightly", "0 3 * * *", "--type",
                                  "email", "--payload", '{"to": "ops"}', "--timezone",
                                  "Europe/Berlin", "--catch-up", "none"])
    assert created.exit_code == 0, created.output
    assert "nightly" in created.output and "2027-01-16T02:00:00.000000Z" in created.output

    listed = runner.invoke(args=["schedules", "list"]).output.splitlines()
    assert listed[1].split()[:8] == ["nightly", "0", "3", "*", "*", "*", "Europe/Berlin",
                                     "none"]

    paused = runner.invoke(args=["schedules", "pause", "nightly"])
    assert paused.exit_code == 0 and " yes " in paused.output
    resumed = runner.invoke(args=["schedules", "resume", "nightly"])
    assert resumed.exit_code == 0 and " no " in resumed.output

    deleted = runner.invoke(args=["schedules", "delete", "nightly"])
    assert deleted.exit_code == 0
    assert runner.invoke(args=["schedules", "list"]).output.count("\n") == 1


def test_errors_name_the_field(runner: Any) -> None:
    bad = runner.invoke(args=["schedules", "create", "x", "0 25 * * *", "--type", "email"])
    assert bad.exit_code != 0
    assert "cron: hour field: 25 is out of range 0-23" in bad.output
    untyped = runner.invoke(args=["schedules", "create", "x", "@daily", "--type", "fax"])
    assert "job.type" in untyped.output
    assert runner.invoke(args=["schedules", "create", "x", "@daily", "--job",
                               '{"type": "pdf"}']).exit_code == 0
    taken = runner.invoke(args=["schedules", "create", "x", "@daily", "--type", "email"])
    assert taken.exit_code != 0 and "exists" in taken.output
    missing = runner.invoke(args=["schedules", "pause", "nobody"])
    assert missing.exit_code != 0 and "No such schedule" in missing.output


def test_create_pause_and_resume_print_the_row_under_the_list_header(runner: Any) -> None:
    header = runner.invoke(args=["schedules", "list"]).output.splitlines()[0]
    created = runner.invoke(args=["schedules", "create", "hourly-report", "@hourly", "--type",
                                  "email"])
    assert created.exit_code == 0, created.output
    lines = created.output.splitlines()
    assert lines[0] == header and lines[1].startswith("hourly-report ")
    paused = runner.invoke(args=["schedules", "pause", "hourly-report"]).output.splitlines()
    assert paused[0] == header and len(paused) == 2
