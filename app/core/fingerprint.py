"""The fingerprint of a failed attempt's error (docs/OPERATIONS.md): the error with its
variable parts replaced by placeholders, hashed, so that failures group by problem.

    timeout after 30012 ms on 10.0.3.7:5432   -> timeout after <num> ms on <addr>
    timeout after 29876 ms on 10.0.3.9:5432   -> timeout after <num> ms on <addr>

The errors seen here are already redacted (app/core/redaction.py) and cut to
STORED_ERROR_CHARS.max, so no secret is ever part of what is hashed.

The passes run most specific first, each on the previous one's output (a later pass never
sees the inside of an earlier placeholder: none holds a digit, a quote or a colon):

1. whitespace runs -> one space
2. UUIDs -> <uuid>
3. addresses -> <addr>: a URL's authority (user@host:port), [v6]:port, IPv6, IPv4(:port),
   dotted-host:port and localhost:port; email addresses (bare or <in brackets>, as an SMTP
   server names a recipient) -> <email>
4. runs of 8 or more hex digits: 0x-prefixed, or bare with a digit and a letter a-f in them
   (so neither a word nor a decimal id, which stays a <num> however long it grows) -> <hex>
5. quoted values ('...', "...", b'...' and the typographic \u2018...\u2019, \u201c...\u201d)
   -> <str>, unless the quoted text holds whitespace: that is a message quoted inside the
   message (a wrapped exception's repr, an SMTP reply) and where the meaning is, so it is
   kept and its own variable parts are replaced by the other passes. A quoted **name** is
   kept too, since it says which thing failed, not with which data: one word of a name's
   characters (a dotted path, a call's "()") after a word that says a name follows (key,
   attribute, field, column, module, reading, invoke, ...: _NAMING_WORDS), as a whole
   Python KeyError's message, or before " object", " is null", " is not defined" or
   " is undefined". So KeyError: 'address' and KeyError: 'n' are two problems, where
   invalid literal for int() with base 10: 'abc' and '12x' are one; the name's own digits
   are still taken by the passes below ('user_42' and 'user_1337' are one key shape)
6. ids glued into a word (x12sm345678abc, job1001, a1b2c3): a letter-led word with two or
   more digit runs or a run of 4+ digits -> <id>; shorter ones are names and stay (utf8,
   http2, psycopg2, ipv4, s3, base64, sha256)
7. numbers not inside a word, signed, with decimals and any unit glued on (30012ms, 5s,
   -2, 4.7.0, 3MtwBw) -> <num>; a word's dotted suffix (python3.11, TLSv1.3) stays

Case is kept: "Connection refused" and "connection refused" come from different code, and
the normalized text is what a reader of the docs and tests sees.

Every pattern runs in linear time: an unbounded run is only tried where a run starts
(a lookbehind), and nothing inside it can be split two ways. (An error of 100,000
characters, ERROR_CHARS.max, is normalized in milliseconds.)
"""

from __future__ import annotations

import hashlib
import re

from app.core.limits import ERROR_CHARS

FINGERPRINT_CHARS = 16  # length of the hex digest returned
# A fingerprint as a request may name one; anchored at the end, so that `.match` (as
# marshmallow's validate.Regexp calls it) checks the whole string, as `.fullmatch` does.
FINGERPRINT_PATTERN = re.compile(rf"^[0-9a-f]{{{FINGERPRINT_CHARS}}}\Z")
# What is hashed: enough of a message to tell problems apart, at a bounded cost.
NORMALIZED_CHARS = 1000

_WHITESPACE = re.compile(r"\s+")

_H = "[0-9A-Fa-f]"
_UUID = re.compile(rf"(?<![A-Za-z0-9]){_H}{{8}}-{_H}{{4}}-{_H}{{4}}-{_H}{{4}}-{_H}{{12}}"
                   r"(?![A-Za-z0-9])")

_PORT = r"(?::[0-9]{1,5})?"
# scheme://authority: the authority (credentials, already masked, host and port) is the
# address; the path stays (its ids are taken by the passes below).
_URL = re.compile(r"(?P<scheme>(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]{0,63}://)"
                  r"[^\s/?#'\"<>(),;\\]{1,255}")
# [::1]:5432 (not a slice: no identifier or bracket before it)
_BRACKETED_V6 = re.compile(rf"(?<![A-Za-z0-9_\])])\[[0-9A-Fa-f.]{{0,39}}:[0-9A-Fa-f:.]{{0,39}}"
                           rf"(?:%[A-Za-z0-9_.]{{1,16}})?\]{_PORT}")
# A bare IPv6 address has all 8 groups or a "::"; that keeps times (12:30:45) out.
_GROUPS = rf"{_H}{{1,4}}(?::{_H}{{1,4}}){{0,6}}"
_IPV6 = re.compile(rf"(?<![A-Za-z0-9:.[])(?:{_H}{{1,4}}(?::{_H}{{1,4}}){{7}}"
                   rf"|(?:{_GROUPS})?::{_GROUPS}|{_GROUPS}::)"
                   rf"(?:%[A-Za-z0-9_.]{{1,16}})?(?![A-Za-z0-9:])")
_IPV4 = re.compile(rf"(?<![A-Za-z0-9.])(?:[0-9]{{1,3}}\.){{3}}[0-9]{{1,3}}{_PORT}"
                   r"(?![A-Za-z0-9]|\.[0-9])")
# host:port where host is localhost or dotted (db-3.internal:5432, api.example.com:443);
# a dotless name before a colon is as often a key (retries:5), and stays. A source file
# and its line (tasks.py:88) is not an address: its extension is not taken as a TLD.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_SOURCE_EXTENSIONS = ("py|pyx|pyi|js|mjs|cjs|ts|tsx|jsx|rb|go|rs|java|kt|scala|c|h|cc|cpp|hpp"
                      "|cs|php|pl|sh|sql|lua|ex|exs|erl|swift|json|yaml|yml|toml|ini|cfg|txt"
                      "|html|xml|csv|log|md")
_HOST_PORT = re.compile(rf"(?<![A-Za-z0-9_.\-/@:])(?:localhost|(?:{_LABEL}\.)+"
                        rf"(?!(?:{_SOURCE_EXTENSIONS}):)[A-Za-z][A-Za-z0-9-]{{0,62}})"
                        r":[0-9]{1,5}(?![0-9])")

# An email address, bare or in <angle brackets> as SMTP servers quote a recipient.
_EMAIL = re.compile(rf"(?<![A-Za-z0-9._%+\-])[A-Za-z0-9._%+\-]{{1,64}}@(?:{_LABEL}\.)+"
                    r"[A-Za-z]{2,63}(?![A-Za-z0-9\-])")

_HEX = re.compile(rf"(?<![A-Za-z0-9])(?:0[xX]{_H}{{8,}}"
                  rf"|(?={_H}*[0-9])(?={_H}*[A-Fa-f]){_H}{{8,}})(?![A-Za-z0-9])")

# An opening quote has no letter or digit before it (an apostrophe, doesn't, has); the
# value ends at the next quote of its kind. (No escapes: with them an unclosed quote could
# be rescanned from each later one, in quadratic time.)
_QUOTED = re.compile(r"(?<![A-Za-z0-9_])b?(?:'[^']*'|\"[^\"]*\")"
                     "|\u2018[^\u2019]*\u2019|\u201c[^\u201d]*\u201d")
_HAS_SPACE = re.compile(r"\s")

_GLUED_DIGITS = re.compile(r"(?<![A-Za-z0-9])[A-Za-z]+[0-9][A-Za-z0-9]*")
_DIGIT_RUN = re.compile(r"[0-9]+")

_NUMBER = re.compile(r"(?<![A-Za-z0-9])(?<![A-Za-z][0-9]\.)-?[0-9]+(?:\.[0-9]+)*"
                     r"(?:[eE][+-]?[0-9]+)?[A-Za-z0-9]*")


# The words after which a quoted word is the name of what failed (compared in lower case):
# Python's AttributeError, NameError, ImportError; Node's "(reading 'x')" and "Cannot find
# module"; Go's encoding/json and text/template; Java's helpful NullPointerException;
# PostgreSQL's relation, column, constraint, ... does not exist or was violated.
_NAMING_WORDS = frozenset({
    "argument", "attribute", "class", "column", "constraint", "database", "extension",
    "field", "function", "header", "index", "invoke", "key", "member", "method", "module",
    "name", "named", "option", "parameter", "property", "reading", "relation", "role",
    "schema", "sequence", "setting", "table", "trigger", "type", "variable", "view",
})
# One word of a name's characters, quoted: a dotted path, a call's trailing "()".
_NAME = re.compile(r"b?.[A-Za-z_$][A-Za-z0-9_$.\-]{0,99}(?:\(\))?.\Z")
# The word before a quote, in the 40 characters before it, past spaces and an opening paren.
_WORD_BEFORE = re.compile(r"([A-Za-z]+)[ (]{1,3}\Z")
_NAMED_BEFORE = re.compile(r"(?:\A|[\s.:])KeyError: \Z")
_NAMED_AFTER = re.compile(r" (?:object\b|is null\b|is not defined\b|is undefined\b)")


def _names_the_failure(match: re.Match[str]) -> bool:
    """Whether the quoted word `match` is a name that says which thing failed (pass 5)."""
    if not _NAME.match(match[0]):
        return False
    before = match.string[max(0, match.start() - 40):match.start()]
    word = _WORD_BEFORE.search(before)
    return bool((word is not None and word[1].lower() in _NAMING_WORDS)
                or _NAMED_BEFORE.search(before)
                or _NAMED_AFTER.match(match.string, match.end()))


def _quoted(match: re.Match[str]) -> str:
    if _HAS_SPACE.search(match[0]) or _names_the_failure(match):
        return match[0]
    return "<str>"


def _glued(match: re.Match[str]) -> str:
    runs = _DIGIT_RUN.findall(match[0])
    return "<id>" if len(runs) > 1 or max(map(len, runs)) >= 4 else match[0]


def normalized_error(error: str) -> str:
    """The error with its variable parts replaced by placeholders (shown nowhere but tests and
    docs): <uuid>, <addr>, <email>, <hex>, <str>, <id>, <num>; whitespace collapsed, cut to
    NORMALIZED_CHARS."""
    text = _WHITESPACE.sub(" ", error[:ERROR_CHARS.max])
    text = _UUID.sub("<uuid>", text)
    text = _URL.sub(lambda m: f"{m['scheme']}<addr>", text)
    text = _EMAIL.sub("<email>", text)
    for address in (_BRACKETED_V6, _IPV6, _IPV4, _HOST_PORT):
        text = address.sub("<addr>", text)
    text = _HEX.sub("<hex>", text)
    text = _QUOTED.sub(_quoted, text)
    text = _GLUED_DIGITS.sub(_glued, text)
    text = _NUMBER.sub("<num>", text)
    return text.strip()[:NORMALIZED_CHARS]


def error_fingerprint(error: str) -> str:
    """16 lowercase hex chars: a hash (blake2b) of normalized_error(error). Changing the
    normalization or the hash splits every stored group: tests pin one value."""
    normalized = normalized_error(error).encode("utf-8", "surrogatepass")
    return hashlib.blake2b(normalized, digest_size=FINGERPRINT_CHARS // 2).hexdigest()
