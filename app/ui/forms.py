"""What the dashboard's forms and query strings carry, read into the values the services
take. The rules themselves stay in the API's schemas (TypePatchSchema): a form is only text
to turn into their types first."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from marshmallow import Schema, ValidationError, fields, validate

from app.core.limits import CURSOR_CHARS, NAME_CHARS, TYPE_CHARS
from app.core.statuses import JobStatus
from app.jobs.web.requests import tag_field
from app.types.models import FAIRNESS_KEY, ON_FAILURE_BLOCK, ON_FAILURE_SKIP, ORDERING_KEY
from app.types.schemas import TypePatchSchema
from app.ui.charts import Period
from app.web.fields import QueryInteger, QueryNumber, StrictSchema, non_empty_text
from app.web.problems import flatten_errors
from app.workflows.models import WorkflowStatus

LIMIT_FIELDS = ("max_running", "max_running_per_key", "rate_per_second", "burst")
_patch_schema = TypePatchSchema()


class FormInvalid(ValueError):
    """A form or query string the dashboard cannot use; `messages` say why, by field."""

    def __init__(self, messages: dict[str, list[str]]) -> None:
        super().__init__("invalid form")
        self.messages = messages


class LimitsFormSchema(StrictSchema):
    """The limits form's text, in the forms the API's query strings take (ASCII digits
    only); TypePatchSchema then holds the values to its ranges."""

    max_running = QueryInteger(error_messages={"invalid": "Not a whole number."})
    max_running_per_key = QueryInteger(error_messages={"invalid": "Not a whole number."})
    rate_per_second = QueryNumber(error_messages={"invalid": "Not a number."})
    burst = QueryInteger(error_messages={"invalid": "Not a whole number."})


_limits_form = LimitsFormSchema()


def limits_patch(form: Mapping[str, str]) -> dict[str, Any]:
    """The PATCH a type's limits form asks for: an empty field clears its limit (burst: back
    to its default)."""
    texts = {name: form.get(name, "").strip() for name in LIMIT_FIELDS}
    try:
        given = _limits_form.load({name: text for name, text in texts.items() if text})
        loaded: dict[str, Any] = _patch_schema.load(
            {name: given.get(name) for name in LIMIT_FIELDS})
    except ValidationError as error:
        raise FormInvalid(flatten_errors(error.messages)) from None
    return loaded


# The key modes form's choices (docs/FLOW-CONTROL.md). A select cannot send null, so "off" stands
# for it; on_failure's null already means "skip", which the API takes as well.
OFF = "off"
KEY_MODE_CHOICES = {"fairness": (OFF, FAIRNESS_KEY), "ordering": (OFF, ORDERING_KEY),
                    "on_failure": (ON_FAILURE_SKIP, ON_FAILURE_BLOCK)}


class KeyModesFormSchema(StrictSchema):
    """The key modes form's text, one of the choices it offers; TypePatchSchema then holds
    the values to what the API accepts."""

    fairness = fields.String(validate=validate.OneOf(KEY_MODE_CHOICES["fairness"]))
    ordering = fields.String(validate=validate.OneOf(KEY_MODE_CHOICES["ordering"]))
    on_failure = fields.String(validate=validate.OneOf(KEY_MODE_CHOICES["on_failure"]))


_key_modes_form = KeyModesFormSchema()


def key_modes_patch(form: Mapping[str, str]) -> dict[str, Any]:
    """The PATCH a type's key modes form asks for: a field left out (or empty) is left as it
    is; "off" clears the mode."""
    texts = {name: form.get(name, "").strip() for name in KEY_MODE_CHOICES}
    try:
        given = _key_modes_form.load({name: text for name, text in texts.items() if text})
        loaded: dict[str, Any] = _patch_schema.load(
            {name: None if value == OFF else value for name, value in given.items()})
    except ValidationError as error:
        raise FormInvalid(flatten_errors(error.messages)) from None
    return loaded


# A page's opt-in auto-refresh (?refresh=on): it reloads itself, its filters kept.
REFRESH_ON = "on"


def _refresh() -> fields.String:
    return fields.String(validate=validate.OneOf([REFRESH_ON]))


# The jobs page's status filter: a status, or `scheduled` (pending, its run_at still ahead:
# what GET /types counts as scheduled).
SCHEDULED = "scheduled"
JOB_FILTER_STATUSES = (*(s.value for s in JobStatus), SCHEDULED)
NEWEST_FIRST, OLDEST_FIRST = "newest", "oldest"


# What the search box and the jobs list's error filter take: a line of text (a job's id, or
# words of an error) short enough to type; control characters refused, not searched for.
SEARCH_CHARS = 200


def search_text() -> fields.String:
    return fields.String(validate=[
        validate.Length(min=1, max=SEARCH_CHARS),
        validate.Regexp(r"^[^\x00-\x1f\x7f-\x9f]*\Z",
                        error="Must not contain control characters.")])


class JobFilterSchema(StrictSchema):
    """The jobs page's query string (empty fields are left out before loading): the
    filters (the error text's included), the order, where the page starts (after `cursor`,
    or before `before`), and whether it refreshes itself."""

    type = non_empty_text(TYPE_CHARS)
    status = fields.String(validate=validate.OneOf(JOB_FILTER_STATUSES))
    producer = non_empty_text(NAME_CHARS)
    tag = tag_field()
    # The failure groups whose newest error holds this text (or whose fingerprint it is).
    error = search_text()
    order = fields.String(validate=validate.OneOf([NEWEST_FIRST, OLDEST_FIRST]))
    cursor = non_empty_text(CURSOR_CHARS)
    before = non_empty_text(CURSOR_CHARS)
    refresh = _refresh()


_filter_schema = JobFilterSchema()


def _load_filters(schema: Schema, args: Mapping[str, str]) -> dict[str, str]:
    """A page's query string, its empty fields left out, or FormInvalid naming each mistake."""
    given = {name: value.strip() for name, value in args.items() if value.strip()}
    try:
        loaded: dict[str, str] = schema.load(given)
    except ValidationError as error:
        raise FormInvalid(flatten_errors(error.messages)) from None
    return loaded


def job_filters(args: Mapping[str, str]) -> dict[str, str]:
    return _load_filters(_filter_schema, args)


# The workflows page's status filter: a workflow's status, as GET /workflows?status= takes.
WORKFLOW_FILTER_STATUSES = tuple(s.value for s in WorkflowStatus)


class WorkflowFilterSchema(StrictSchema):
    """The workflows page's query string: the status filter and where the page starts."""

    status = fields.String(validate=validate.OneOf(WORKFLOW_FILTER_STATUSES))
    cursor = non_empty_text(CURSOR_CHARS)


_workflow_filter_schema = WorkflowFilterSchema()


def workflow_filters(args: Mapping[str, str]) -> dict[str, str]:
    return _load_filters(_workflow_filter_schema, args)


class FailureFilterSchema(StrictSchema):
    """The failures page's query string: the type whose groups are shown."""

    type = non_empty_text(TYPE_CHARS)


_failure_filter_schema = FailureFilterSchema()


def failure_filters(args: Mapping[str, str]) -> dict[str, str]:
    return _load_filters(_failure_filter_schema, args)


class ChartFilterSchema(StrictSchema):
    """The query string of the pages with charts (the overview, a type's page): the period
    they show and whether they refresh themselves."""

    period = fields.String(validate=validate.OneOf([period.value for period in Period]))
    refresh = _refresh()


_chart_filter_schema = ChartFilterSchema()


def chart_filters(args: Mapping[str, str]) -> dict[str, str]:
    return _load_filters(_chart_filter_schema, args)


class SearchSchema(StrictSchema):
    """The search box's query string (every page's header): a job's id, or error text."""

    q = search_text()


_search_schema = SearchSchema()


def search_query(args: Mapping[str, str]) -> str:
    """What the search box sent, trimmed ("" for nothing), or FormInvalid saying why not."""
    return _load_filters(_search_schema, args).get("q", "")
