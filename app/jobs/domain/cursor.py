"""The opaque cursors of the listings: the last id (GET /jobs) or name (GET /schedules) a page
showed, versioned and encoded."""

from __future__ import annotations

import base64
import binascii
import re

from app.core.errors import ValidationFailed
from app.core.limits import JOB_ID

_ASCII_DIGITS = re.compile(r"[0-9]{1,19}")


def encode_cursor(last_id: int) -> str:
    return base64.urlsafe_b64encode(f"v1:{last_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    """The last id a page showed; ValidationFailed for a cursor this service did not issue."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        version, _, last_id = text.partition(":")
        # ASCII digits only: str.isdigit and int() would also take other scripts' digits.
        if (version != "v1" or not _ASCII_DIGITS.fullmatch(last_id)
                or int(last_id) > JOB_ID.max):
            raise ValueError(cursor)
        return int(last_id)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise ValidationFailed("The cursor is not one this service issued.",
                               errors={"cursor": ["Invalid cursor."]}) from None


def encode_name_cursor(last_name: str) -> str:
    return base64.urlsafe_b64encode(f"n1:{last_name}".encode()).decode().rstrip("=")


def decode_name_cursor(cursor: str, valid: re.Pattern[str]) -> str:
    """The last name a page showed, which `valid` matches; ValidationFailed for a cursor this
    service did not issue."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        version, _, last_name = text.partition(":")
        if version != "n1" or not valid.match(last_name):
            raise ValueError(cursor)
        return last_name
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise ValidationFailed("The cursor is not one this service issued.",
                               errors={"cursor": ["Invalid cursor."]}) from None
