"""Scrubbing secrets out of worker error text before it is stored (docs/SECURITY.md), and
the one display form of a push url, without its credentials or query values."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from app.core.limits import STORED_ERROR_CHARS

MASK = "***"

_SECRET_NAMES = r"(?:password|passwd|pwd|secret|token|api_key|authorization)"  # noqa: S105

# scheme://user:pass@host -> scheme://***@host. A password may itself hold "@": everything up
# to the last "@" before the host (the first "/", "?", "#" or space) is hidden.
# (The scheme and the key names below are bounded or unprefixed so that every pattern runs in
# linear time: an unbounded `[A-Za-z0-9…]*` tried from each position made a 100,000-character
# error of letters and hyphens take minutes to redact.)
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]{0,63}://)[^/?#\s]+@")
# "password": "value" (JSON form; escaped quotes inside the value included), and the same
# with single quotes, as Python prints a dict: {'password': 'value'}; the value may also be
# a bytes literal (b'value') or any other scalar: a number, true/false/null, True/False/None.
_JSON_PAIR = re.compile(
    rf'(?P<key>["\'][A-Za-z0-9_\-]*{_SECRET_NAMES}["\']\s*:\s*)'
    rf'(?:(?P<open>b?")(?:[^"\\]|\\.)*"|(?P<open_single>b?\')(?:[^\'\\]|\\.)*\''
    r"|-?[0-9][0-9.eE+\-]*|(?:true|false|null|none)\b)",
    re.IGNORECASE,
)
# An unquoted value's characters, and the closing brackets that may end the text around it.
_CLOSERS = r"[)\]}>]"
_BARE = r"[^\s,;&'\")\]}>]"
# password=value, password: value, Authorization: Basic abc (up to the end of the value)
_PLAIN_PAIR = re.compile(
    # (no `\b[A-Za-z0-9_\-]*` prefix: it matched the same keys, db_password included, since
    # the prefix stays in the text either way, but cost quadratic time on "a-a-a-…")
    rf"(?P<key>{_SECRET_NAMES}\b\s*[=:]\s*)"
    # a quoted value (password="a b", password='x', password=b'x') whole; else up to a
    # delimiter. A closing bracket belongs to the value only when more of the value follows
    # it: the `)` of "(password=hunter2)", the `]` of "[token=x]" close the text around the
    # value and stay. (The two classes are disjoint, so this runs in linear time.)
    rf"(?P<value>b?\"(?:[^\"\\]|\\.)*\"|b?'(?:[^'\\]|\\.)*'"
    rf"|[\"']?(?:(?:Bearer|Basic|Token)\s+)?{_BARE}+(?:{_CLOSERS}+{_BARE}+)*)",
    re.IGNORECASE,
)
_BEARER = re.compile(r"\bBearer\s+[A-Za-z0-9\-._~+/]+=*", re.IGNORECASE)


def _masked_json_value(match: re.Match[str]) -> str:
    """The pair with its value masked; a quoted value keeps its quotes (and b prefix)."""
    if match["open"]:
        return f'{match["key"]}{match["open"]}{MASK}"'
    if match["open_single"]:
        return f"{match['key']}{match['open_single']}{MASK}'"
    return f"{match['key']}{MASK}"


def redact_error(text: str) -> str:
    """The error with credentials masked, then cut to STORED_ERROR_CHARS.max characters.

    Redaction runs on the whole text first, so a secret straddling the cut is masked too.
    """
    text = _URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{MASK}@", text)
    text = _JSON_PAIR.sub(_masked_json_value, text)
    text = _PLAIN_PAIR.sub(lambda m: f"{m['key']}{MASK}", text)
    text = _BEARER.sub(f"Bearer {MASK}", text)
    return text[:STORED_ERROR_CHARS.max]


# A path segment shown as it is: one that reads as a word (hooks, notify.json, v2). Any
# other (a token, an id, anything percent-encoded) may be a secret, and is masked.
_WORD_SEGMENT = re.compile(r"(?:[a-z][a-z_-]{0,23}|v[0-9]{1,2})(?:\.[a-z]{1,8})?\Z")
_PARAMETER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,31}\Z")


def display_url(url: str) -> str:
    """A push url as it may be shown (to admins: a producer never sees one) or written to a
    log or an attempt's error: scheme, host and port; the path's shape, each segment that is
    not a plain word masked; the query's parameter names, never a value; never user:pass@.
    (The url itself is not shown again once set: it may carry a signature in its query or
    a token in its path.)

        https://bob:pw@hooks.example.com/services/T0A1/B2C3?sig=abc&code=9
        -> https://hooks.example.com/services/***/***?sig=***&code=***
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return MASK
    host = parts.hostname
    if not parts.scheme or not host:
        return MASK
    shown = f"{parts.scheme.lower()}://{f'[{host}]' if ':' in host else host}"
    if port is not None:
        shown += f":{port}"
    shown += "/".join(segment if not segment or _WORD_SEGMENT.match(segment) else MASK
                      for segment in parts.path.split("/"))
    if parts.query:
        # A pair without "=" is a value alone (?s3cr3t): masked whole, like an odd name.
        pairs = (pair.partition("=") for pair in parts.query.split("&"))
        shown += "?" + "&".join(f"{name}={MASK}" if sep and _PARAMETER_NAME.match(name)
                                else MASK for name, sep, _ in pairs)
    return shown


def scrub_url(text: str, url: str) -> str:
    """`text` (an error, a traceback) with every form of `url` it may quote (whole, without
    its credentials, or the request target alone) in its display form."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return text.replace(url, MASK) if url else text
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    bare = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
    shown = display_url(url)
    shown_target = shown.split("/", 3)[3] if shown.count("/") >= 3 else ""
    for form, replacement in ((url, shown), (bare, shown), (target, "/" + shown_target)):
        if len(form) > 1:  # "/" alone says nothing and is everywhere
            text = text.replace(form, replacement)
    return text
