"""The urls queuelog calls, and the origin a push url sends to: one rule for the operator's
allow lists (app/config.py) and for delivery and checks (app/types, app/jobs, app/dispatch).
A leaf: it imports nothing of queuelog's, so the settings table can use it without joining
the packages above it."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import unquote

if TYPE_CHECKING:
    from urllib3.util import Url

_DEFAULT_PORTS = {"http": 80, "https": 443}

_PORT = (r"(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}"
         r"|[1-9][0-9]{0,3})")
# A url queuelog calls (a push endpoint, a reservation's check): http or https; optional
# user:pass@ (sent as Basic auth); a host name or IPv4 address; an optional port 1..65535;
# then path and query in printable ASCII, no fragment (it is never sent). Percent-encode
# anything else. Strict on purpose: the pattern
# is also the API's documented one, so what it admits is exactly what is accepted.
HTTP_URL_PATTERN = (
    r"^[Hh][Tt][Tt][Pp][Ss]?://"
    r"(?:[A-Za-z0-9._~%!$&'()*+,;=:-]+@)?"
    r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?"
    rf"(?::{_PORT})?"
    r"(?:[/?][!$-~]*)?\Z"
)


def push_origin(url: str) -> str | None:
    """The origin a push url sends to, parsed as the dispatcher's HTTP client parses it
    (urllib3), so that what is checked is what is connected to: "scheme://host:port",
    lower-cased, the default port spelled out. None when it names no http(s) host."""
    parsed = _parsed(url)
    if parsed is None:
        return None
    scheme = (parsed.scheme or "").lower()
    if scheme not in _DEFAULT_PORTS or not parsed.host:
        return None
    return f"{scheme}://{parsed.host.lower()}:{parsed.port or _DEFAULT_PORTS[scheme]}"


def check_url_refusal(url: str, prefixes: tuple[str, ...]) -> str | None:
    """Why a reservation's check url may not be asked (None: it may): it must start with one
    of the operator's prefixes (QUEUELOG_CHECK_URL_ORIGINS), compared as the origin the
    client connects to and then the path, so that neither a look-alike host
    ("https://shop.example.evil/") nor a user:pass@ part passes for a listed one."""
    origin = push_origin(url)
    if origin is None:
        return "it names no http or https host"
    if not prefixes:
        return "QUEUELOG_CHECK_URL_ORIGINS is not set: the operator allows no check url"
    disguised = disguised_step_refusal(url)
    if disguised is not None:
        return disguised
    path = _path_of(url)
    for prefix in prefixes:
        if push_origin(prefix) == origin and path.startswith(_path_of(prefix)):
            return None
    return "it does not start with one of QUEUELOG_CHECK_URL_ORIGINS (the operator's list)"


def disguised_step_refusal(url: str) -> str | None:
    """Why a check url's path may not be sent as it is (None: it may): the part of the
    check url rule that needs no prefix list, so the dispatcher applies it again to the
    urls stored before it."""
    if _hides_a_step(_path_of(url)):
        return ("its path holds a dot segment or a slash in disguise (%2e%2e, ..;, %2f, %5c "
                "or a backslash): write the path plainly")
    return None


def _hides_a_step(path: str) -> bool:
    """Whether a path (literal dot segments already resolved, as the client resolves them)
    holds a segment that a receiver's decoding could turn into a step out of the prefix: one
    that decodes (as often as it decodes: a receiver may decode twice) to `.` or `..`,
    before any `;parameters` too (`..;` is `..` to some servers), or to something holding a
    `/` or a backslash. The prefix is compared on the path as sent; such a segment would make
    that comparison say nothing of the path the receiver serves."""
    for segment in path.split("/"):
        decoded = segment
        while "%" in decoded and (once := unquote(decoded)) != decoded:
            decoded = once
        if "/" in decoded or "\\" in decoded or decoded.split(";")[0] in {".", ".."}:
            return True
    return False


def _path_of(url: str) -> str:
    parsed = _parsed(url)
    if parsed is None:
        return ""
    return parsed.path or "/"


def _parsed(url: str) -> Url | None:
    """`url` as urllib3 parses it, None when it cannot. urllib3 is imported here, on the first
    url read, not with this module: every process that loads the app imports this module (its
    settings do), and urllib3 is 40 ms of CPU at each gunicorn worker's boot, where most
    servers never read a url."""
    from urllib3.exceptions import LocationParseError
    from urllib3.util import parse_url

    try:
        return parse_url(url.strip())
    except LocationParseError:
        return None
