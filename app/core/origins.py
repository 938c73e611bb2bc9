"""The origin a push url sends to: one rule for the operator's allow list (app/config.py) and
for delivery (app/types, app/dispatch). A leaf: it imports nothing of queuelog's, so the
settings table can use it without joining the packages above it."""

from __future__ import annotations

from urllib3.exceptions import LocationParseError
from urllib3.util import parse_url

_DEFAULT_PORTS = {"http": 80, "https": 443}


def push_origin(url: str) -> str | None:
    """The origin a push url sends to, parsed as the dispatcher's HTTP client parses it
    (urllib3), so that what is checked is what is connected to: "scheme://host:port",
    lower-cased, the default port spelled out. None when it names no http(s) host."""
    try:
        parsed = parse_url(url.strip())
    except LocationParseError:
        return None
    scheme = (parsed.scheme or "").lower()
    if scheme not in _DEFAULT_PORTS or not parsed.host:
        return None
    return f"{scheme}://{parsed.host.lower()}:{parsed.port or _DEFAULT_PORTS[scheme]}"
