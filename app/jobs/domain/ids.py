"""Job ids in URLs: ASCII digits naming an integer the database can hold, else no route (404)."""

from __future__ import annotations

from typing import Any

from werkzeug.routing import BaseConverter, ValidationError

from app.core.limits import JOB_ID


class JobIdConverter(BaseConverter):
    """`/jobs/<id:job_id>`. Werkzeug's `int` converter matches `\\d`, which takes any
    Unicode digit (Arabic-Indic one-seven would name job 17), and has no ceiling."""

    regex = r"[0-9]{1,19}"
    weight = 50  # as Werkzeug's number converters: a literal segment still wins
    part_isolating = True

    def to_python(self, value: str) -> int:
        job_id = int(value)
        if not JOB_ID.min <= job_id <= JOB_ID.max:
            raise ValidationError()
        return job_id

    def to_url(self, value: Any) -> str:
        return str(int(value))
