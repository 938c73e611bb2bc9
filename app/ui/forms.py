"""What the dashboard's forms and query strings carry, read into the values the services
take. The rules themselves stay in the API's schemas (TypePatchSchema): a form is only text
to turn into their types first."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from marshmallow import ValidationError, fields, validate

from app.errors import flatten_errors
from app.jobs.models import JobStatus
from app.jobs.schemas import StrictSchema
from app.types.schemas import TypePatchSchema

LIMIT_FIELDS = ("max_running", "max_running_per_key", "rate_per_second", "burst")
_patch_schema = TypePatchSchema()


class FormInvalid(ValueError):
    """A form or query string the dashboard cannot use; `messages` say why, by field."""

    def __init__(self, messages: dict[str, list[str]]) -> None:
        super().__init__("invalid form")
        self.messages = messages


def _number(text: str, *, whole: bool) -> int | float:
    value = float(text) if not whole else int(text, 10)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def limits_patch(form: Mapping[str, str]) -> dict[str, Any]:
    """The PATCH a type's limits form asks for: an empty field clears its limit (burst: back
    to its default)."""
    patch: dict[str, Any] = {}
    errors: dict[str, list[str]] = {}
    for name in LIMIT_FIELDS:
        text = form.get(name, "").strip()
        if not text:
            patch[name] = None
            continue
        try:
            patch[name] = _number(text, whole=name != "rate_per_second")
        except ValueError:
            kind = "a number" if name == "rate_per_second" else "a whole number"
            errors[name] = [f"Not {kind}."]
    if errors:
        raise FormInvalid(errors)
    try:
        loaded: dict[str, Any] = _patch_schema.load(patch)
    except ValidationError as error:
        raise FormInvalid(flatten_errors(error.messages)) from None
    return loaded


def _optional_text(length: int) -> fields.String:
    return fields.String(validate=validate.Length(1, length))


class JobFilterSchema(StrictSchema):
    """The jobs page's query string (empty fields are left out before loading)."""

    type = _optional_text(100)
    status = fields.String(validate=validate.OneOf([s.value for s in JobStatus]))
    producer = _optional_text(100)
    cursor = _optional_text(200)


_filter_schema = JobFilterSchema()


def job_filters(args: Mapping[str, str]) -> dict[str, str]:
    given = {name: value for name, value in args.items() if value.strip()}
    try:
        loaded: dict[str, str] = _filter_schema.load(given)
    except ValidationError as error:
        raise FormInvalid(flatten_errors(error.messages)) from None
    return loaded
