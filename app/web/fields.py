"""The fields and schemas every blueprint shares: strict JSON numbers and booleans, query-string
numbers, timestamps, priority labels, idempotency keys, paging, and a listing's body."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from marshmallow import RAISE, Schema, ValidationError, fields, validate

from app.core.clock import parse_rfc3339, to_rfc3339
from app.core.limits import CURSOR_CHARS, KEY_CHARS, PAGE_BYTES, PAGE_ITEMS, Limit
from app.core.priorities import PRIORITY_LABELS, Priority

T = TypeVar("T")

_ASCII_DIGITS = re.compile(r"[0-9]{1,18}")
_ASCII_DECIMAL = re.compile(r"[0-9]{1,18}(\.[0-9]{1,18})?")
PRINTABLE_ASCII = re.compile(r"^[\x20-\x7e]+\Z")
PRINTABLE_ASCII_TEXT = validate.Regexp(PRINTABLE_ASCII, error="Must be printable ASCII.")
# A label a person reads as sent (a worker's instance): printable ASCII, no space at either
# end, so no control character, no invisible or look-alike one, and never spaces alone.
PRINTABLE_LABEL = validate.Regexp(
    re.compile(r"^[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?\Z"),
    error="Must be printable ASCII, with no space at either end.")


def within(limit: Limit[int] | Limit[float]) -> validate.Range:
    """A number's bounds, from the table of limits (and so into /openapi.json)."""
    return validate.Range(limit.min, limit.max)


def length_within(limit: Limit[int]) -> validate.Length:
    """A text's or a list's length bounds, from the table of limits."""
    return validate.Length(min=limit.min, max=limit.max)


def idempotency_key_field(**options: Any) -> fields.String:
    """An idempotency key, in the `Idempotency-Key` header or in a body alike: KEY_CHARS of
    printable ASCII. (HTTP drops spaces at the ends of a header value before it gets here.)"""
    return fields.String(validate=[length_within(KEY_CHARS), PRINTABLE_ASCII_TEXT], **options)


class StrictInteger(fields.Integer):
    """An integer that is a JSON number: no strings, no floats, and booleans are not integers."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(strict=True, **kwargs)

    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> int:
        if isinstance(value, bool):
            raise self.make_error("invalid")
        return super()._deserialize(value, attr, data, **kwargs)


class QueryInteger(fields.Integer):
    """An integer in a query string: ASCII digits only. int() would also take other
    scripts' digits, surrounding spaces, a sign or underscores ("5_0" is 50)."""

    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> int:
        if not isinstance(value, str) or not _ASCII_DIGITS.fullmatch(value):
            raise self.make_error("invalid")
        return int(value)


class QueryNumber(fields.Float):
    """A number in a query string or a form: ASCII digits with an optional fraction, for the
    reason QueryInteger gives (float() also takes "1_0", "nan", "1e9", spaces and other
    scripts' digits)."""

    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> float:
        if not isinstance(value, str) or not _ASCII_DECIMAL.fullmatch(value):
            raise self.make_error("invalid")
        return float(value)


class StrictNumber(fields.Float):
    """A JSON number (integer or fraction): no strings, no booleans, no NaN or infinity."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(allow_nan=False, **kwargs)

    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.make_error("invalid")
        return super()._deserialize(value, attr, data, **kwargs)


class PriorityLabel(fields.String):
    """A priority label on the wire (case-insensitive), a Priority in the code."""

    # A string on the wire (so /openapi.json says "string"), a Priority once loaded.
    def _deserialize(  # type: ignore[override]
            self, value: Any, attr: Any, data: Any, **kwargs: Any) -> Priority:
        text = super()._deserialize(value, attr, data, **kwargs)
        try:
            return Priority.from_label(text)
        except ValueError:
            raise ValidationError(f"Must be one of: {', '.join(PRIORITY_LABELS)}.") from None

    def _serialize(self, value: Any, attr: Any, obj: Any, **kwargs: Any) -> str | None:
        return None if value is None else Priority(value).label


class Timestamp(fields.String):
    """An RFC 3339 date-time with an offset on the wire, microseconds since the epoch inside."""

    # A string on the wire (so /openapi.json says "string"), microseconds once loaded.
    def _deserialize(  # type: ignore[override]
            self, value: Any, attr: Any, data: Any, **kwargs: Any) -> int:
        text = super()._deserialize(value, attr, data, **kwargs)
        try:
            return parse_rfc3339(text)
        except (ValueError, OverflowError):
            raise ValidationError("Must be an RFC 3339 date-time with an offset.") from None

    def _serialize(self, value: Any, attr: Any, obj: Any, **kwargs: Any) -> str | None:
        return to_rfc3339(value)


# PostgreSQL can neither store nor compare text holding NUL; no type, cursor, worker name,
# lease token, cron line or progress message has one, so it is refused here (422) instead
# of failing in the database (500).
NO_NUL = validate.Regexp(r"^[^\x00]*\Z", error="Must not contain NUL characters.")


def non_empty_text(limit: Limit[int]) -> fields.String:
    return fields.String(validate=[length_within(limit), NO_NUL])


class StrictSchema(Schema):
    class Meta:
        unknown = RAISE


class IdempotencyKeyHeaderSchema(Schema):
    """The `Idempotency-Key` request header, checked as a body's idempotency_key is."""

    idempotency_key = idempotency_key_field(data_key="Idempotency-Key", required=True)


class EmptySchema(StrictSchema):
    """For routes that take no fields: an empty body or {} only."""


class PageQuerySchema(StrictSchema):
    """The paging of every listing (GET /jobs, GET /schedules): one rule for limit and cursor."""

    limit = QueryInteger(load_default=PAGE_ITEMS.default, validate=within(PAGE_ITEMS))
    cursor = non_empty_text(CURSOR_CHARS)


class StrictBoolean(fields.Boolean):
    """true or false as JSON: no 1, no "yes"."""

    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> bool:
        if not isinstance(value, bool):
            raise self.make_error("invalid")
        return value


def _compact(value: Any) -> bytes:
    # As Flask renders JSON here: compact, UTF-8 as it is (app.json.ensure_ascii is off).
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def render_page(name: str, page: Sequence[T], shown: Callable[[T], Any],
                cursor_after: Callable[[T], str], next_cursor: str | None, *,
                longest_cursor: str, max_bytes: int = PAGE_BYTES.max) -> bytes:
    """A listing's body, `{"<name>": [...], "next_cursor": …}`: the page's items in order
    while they fit in `max_bytes`. A page cut short by size carries the cursor after its last
    item. It always holds its first item, so that listing moves on even past an item larger
    than the budget."""
    parts: list[bytes] = []
    envelope = b'{"' + name.encode() + b'":[],"next_cursor":}'
    size = len(envelope) + len(_compact(longest_cursor))
    for position, item in enumerate(page):
        part = _compact(shown(item))
        size += len(part) + (1 if parts else 0)
        if parts and size > max_bytes:
            next_cursor = cursor_after(page[position - 1])
            break
        parts.append(part)
    return b"".join([b'{"', name.encode(), b'":[', b",".join(parts), b'],"next_cursor":',
                     _compact(next_cursor), b"}"])
