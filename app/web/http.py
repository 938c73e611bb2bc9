"""Reading request bodies and query strings strictly, before any schema sees them."""

from __future__ import annotations

import json
import math
from collections.abc import Collection
from typing import Any

from flask import Response, request
from marshmallow import Schema
from werkzeug.exceptions import RequestEntityTooLarge

from app.core.errors import ValidationFailed
from app.web.fields import IdempotencyKeyHeaderSchema
from app.web.problems import UnsupportedMediaType

# How deeply JSON may nest, counted from the field that holds it: a payload or result
# object is level 1, so `{"a": {}}` is 2 levels deep. Far below what any recursive JSON
# code in the stack needs (about 1,000), so whatever is accepted can always be rendered.
MAX_JSON_DEPTH = 64

_TOO_DEEP = f"Nested deeper than {MAX_JSON_DEPTH} levels."


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    # A number like 1e400 parses to inf, which would be stored and served as `Infinity`.
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is beyond a double")
    return value


def _is_lone_surrogate_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _check_tree(body: Any, *, check_text: bool, envelopes: Collection[str] = ()) -> None:
    """Refuse JSON nested deeper than MAX_JSON_DEPTH and, with `check_text`, any text holding
    an unpaired surrogate. Iterative: no body, however deep, can exhaust the stack here.

    Depth is counted per field. Each member of the body object starts a field, and so does
    each member of an object in a list that is a member of the body (a batch's
    `jobs.3.payload`, complete-many's `items.0.result`), and each member of an object that
    is a member of the body named in `envelopes` (a schedule's `job.payload`): the API's own
    envelope does not count against the JSON a client stores, so one payload is accepted or
    refused alike wherever it is sent, and the error names the field that is too deep.
    """
    # (container, field path, its level within the field, what its members are):
    # "fields" members start fields; "items" elements are objects whose members do.
    stack: list[tuple[Any, tuple[Any, ...], int, str | None]] = [
        (body, (), 0, "fields" if isinstance(body, dict) else None)]
    while stack:
        container, field, level, role = stack.pop()
        if role is None:
            # Inside a field (most of the tree): no names to keep, only depth and text.
            if check_text:
                _check_texts(container)
            children = container.values() if isinstance(container, dict) else container
            for child in children:
                if isinstance(child, dict | list):
                    if level >= MAX_JSON_DEPTH:
                        raise _too_deep(field)
                    stack.append((child, field, level + 1, None))
            continue
        if check_text:
            _check_texts(container)
        members = container.items() if isinstance(container, dict) else enumerate(container)
        for key, child in members:
            if not isinstance(child, dict | list):
                continue
            if role == "fields" and level == 0 and key in envelopes and isinstance(child, dict):
                stack.append((child, (key,), 0, "fields"))  # its members start fields
            elif role == "fields":
                stack.append((child, (*field, key), 1,
                              "items" if level == 0 and isinstance(child, list) else None))
            elif isinstance(child, dict):  # an item of a list of objects: its members are fields
                stack.append((child, (*field, key), level + 1, "fields"))
            else:
                stack.append((child, (*field, key), level + 1, None))


def _check_texts(container: Any) -> None:
    """The keys and text values of one container: none may hold an unpaired surrogate."""
    texts = [*container.keys(), *container.values()] if isinstance(container, dict) else container
    if any(isinstance(text, str) and _is_lone_surrogate_text(text) for text in texts):
        raise _lone_surrogate()


def _too_deep(field: tuple[Any, ...]) -> ValidationFailed:
    name = ".".join(map(str, field)) or "_body"
    return ValidationFailed(f"The JSON in {name} is nested too deeply.",
                            errors={name: [_TOO_DEEP]})


def _lone_surrogate() -> ValidationFailed:
    return ValidationFailed("The body holds an unpaired UTF-16 surrogate.",
                            errors={"_body": ["Invalid Unicode."]})


def parse_json(raw: bytes, envelopes: Collection[str] = (), *,
               field: str | None = None) -> Any:
    """Strict JSON: UTF-8, no NaN or Infinity (nor numbers that overflow to it), no unpaired
    surrogate escapes, nothing nested deeper than MAX_JSON_DEPTH within a field (the members
    of the body's objects named in `envelopes` are fields, as the body's own are).

    With `field`, `raw` is judged as the value of that field of a body: what a push receiver
    answers is the `result` a worker's complete would send, under the same rules."""
    try:
        # Decoded here, strictly: json.loads would decode bytes with "surrogatepass", letting
        # a surrogate encoded straight into the UTF-8 (b"\xed\xa0\x80") through unescaped.
        text = raw.decode("utf-8")
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        # Only a body nested hundreds of levels deep exhausts the parser's recursion.
        raise ValidationFailed("The body is nested too deeply.",
                               errors={"_body": [_TOO_DEEP]}) from None
    except ValueError:
        raise ValidationFailed("The body is not valid JSON.",
                               errors={"_body": ["Invalid JSON."]}) from None
    # Only an escape like "\ud800" can smuggle in an unpaired surrogate, which no database
    # column can store; look for one only when the raw text could hold it. Nesting deeper
    # than the limit needs more than MAX_JSON_DEPTH brackets; most bodies have far fewer.
    check_text = b"\\u" in raw
    if check_text or raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH:
        if isinstance(value, dict | list):
            _check_tree(value if field is None else {field: value}, check_text=check_text,
                        envelopes=envelopes)
        elif check_text and isinstance(value, str) and _is_lone_surrogate_text(value):
            raise _lone_surrogate()
    return value


def _read_body() -> bytes:
    """The whole body, or 413 when it is longer than the cap: never a truncated prefix.

    A body with a Content-Length past the cap is refused by Werkzeug before it is read. A
    chunked body has no length to check, and Werkzeug's stream stops silently at the cap,
    so it is read with the cap one byte higher: a body that fills that byte is too large.
    """
    cap = request.max_content_length
    if request.content_length is not None or cap is None:
        return request.get_data(cache=True)
    request.max_content_length = cap + 1
    raw = request.get_data(cache=True)
    if len(raw) > cap:
        raise RequestEntityTooLarge()
    return raw


def json_body(envelopes: Collection[str] = ()) -> dict[str, Any]:
    """The request's JSON object; an empty body counts as {}. `envelopes`: see parse_json.

    415 for a non-JSON content type, 413 past MAX_CONTENT_LENGTH,
    422 for malformed JSON or a body that is not an object.
    """
    raw = _read_body()
    if not raw:
        return {}
    if not request.is_json:
        raise UnsupportedMediaType("Send the body as application/json.")
    value = parse_json(raw, envelopes)
    if not isinstance(value, dict):
        raise ValidationFailed("The body must be a JSON object.",
                               errors={"_body": ["Must be a JSON object."]})
    return value


def no_content() -> Response:
    """A 204: no body, hence no Content-Type (Werkzeug would otherwise say text/html)."""
    response = Response(status=204)
    del response.headers["Content-Type"]
    return response


def load_body(schema: Schema, envelopes: Collection[str] = ()) -> dict[str, Any]:
    """The body through `schema`; `envelopes` names the members that hold a body of their
    own (a schedule's `job`: a POST /jobs body), whose members' JSON depth counts from there."""
    loaded: dict[str, Any] = schema.load(json_body(envelopes))
    return loaded


def refuse_query_parameters() -> None:
    """A blueprint's before_request for routes that take no query parameters: one given is a
    client's mistake, said at once (422) rather than silently ignored."""
    if request.args:
        raise ValidationFailed("This route takes no query parameters.",
                               errors={name: ["Unknown query parameter."]
                                       for name in request.args})


def load_query(schema: Schema) -> dict[str, Any]:
    """Query parameters through `schema`; a parameter given twice is refused, not guessed at."""
    args = request.args
    repeated = [key for key in args if len(args.getlist(key)) > 1]
    if repeated:
        raise ValidationFailed("A query parameter was given more than once.",
                               errors={key: ["Give this parameter once."] for key in repeated})
    loaded: dict[str, Any] = schema.load(args.to_dict())
    return loaded


def idempotency_key_header() -> str | None:
    """The request's Idempotency-Key header, checked as an idempotency key (1..255 printable
    ASCII; ValidationFailed otherwise); None without one."""
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return None
    loaded: str = IdempotencyKeyHeaderSchema().load({"Idempotency-Key": key})["idempotency_key"]
    return loaded
