"""Reading request bodies and query strings strictly, before any schema sees them."""

from __future__ import annotations

import json
import math
from typing import Any

from flask import request
from marshmallow import Schema

from app.errors import UnsupportedMediaType, ValidationFailed


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    # A number like 1e400 parses to inf, which would be stored and served as `Infinity`.
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is beyond a double")
    return value


def _has_lone_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(v) for v in value)
    return False


def parse_json(raw: bytes) -> Any:
    """Strict JSON: UTF-8, no NaN or Infinity (nor numbers that overflow to it), no unpaired
    surrogate escapes."""
    try:
        value = json.loads(raw, parse_constant=_reject_constant, parse_float=_finite_float)
    except (ValueError, RecursionError):
        raise ValidationFailed("The body is not valid JSON.",
                               errors={"_body": ["Invalid JSON."]}) from None
    # Only an escape like "\ud800" can smuggle in an unpaired surrogate, which no database
    # column can store; look for one only when the raw text could hold it.
    if b"\\u" in raw and _has_lone_surrogate(value):
        raise ValidationFailed("The body holds an unpaired UTF-16 surrogate.",
                               errors={"_body": ["Invalid Unicode."]})
    return value


def json_body() -> dict[str, Any]:
    """The request's JSON object; an empty body counts as {}.

    415 for a non-JSON content type, 413 (from Werkzeug) past MAX_CONTENT_LENGTH,
    422 for malformed JSON or a body that is not an object.
    """
    raw = request.get_data(cache=True)
    if not raw:
        return {}
    if not request.is_json:
        raise UnsupportedMediaType("Send the body as application/json.")
    value = parse_json(raw)
    if not isinstance(value, dict):
        raise ValidationFailed("The body must be a JSON object.",
                               errors={"_body": ["Must be a JSON object."]})
    return value


def load_body(schema: Schema) -> dict[str, Any]:
    loaded: dict[str, Any] = schema.load(json_body())
    return loaded


def load_query(schema: Schema) -> dict[str, Any]:
    """Query parameters through `schema`; a parameter given twice is refused, not guessed at."""
    args = request.args
    repeated = [key for key in args if len(args.getlist(key)) > 1]
    if repeated:
        raise ValidationFailed("A query parameter was given more than once.",
                               errors={key: ["Give this parameter once."] for key in repeated})
    loaded: dict[str, Any] = schema.load(args.to_dict())
    return loaded
