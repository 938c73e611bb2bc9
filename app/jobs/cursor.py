"""The opaque cursor of GET /jobs: the last id a page showed, versioned and encoded."""

from __future__ import annotations

import base64
import binascii

from app.errors import ValidationFailed

# No job has an id past 64 bits, and neither database can bind one as its id type.
MAX_JOB_ID = 2**63 - 1


def encode_cursor(last_id: int) -> str:
    return base64.urlsafe_b64encode(f"v1:{last_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    """The last id a page showed; ValidationFailed for a cursor this service did not issue."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        version, _, last_id = text.partition(":")
        if version != "v1" or not last_id.isdigit() or int(last_id) > MAX_JOB_ID:
            raise ValueError(cursor)
        return int(last_id)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise ValidationFailed("The cursor is not one this service issued.",
                               errors={"cursor": ["Invalid cursor."]}) from None
