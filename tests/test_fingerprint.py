"""`error_fingerprint`: how failed attempts group (contract section 19).

An error's variable parts (UUIDs, addresses, hex, quoted values, ids, numbers) become
placeholders and the rest is hashed, so that errors differing only in those parts share a
fingerprint and different messages do not. The errors below are written as the libraries
print them.
"""

from __future__ import annotations

import re

import pytest

from app.core.fingerprint import (
    FINGERPRINT_CHARS,
    FINGERPRINT_PATTERN,
    error_fingerprint,
    normalized_error,
)
from app.core.redaction import redact_error

CONNECT_REFUSED = ("connection to server at \"{ip}\", port {port} failed: Connection refused\n"
                   "\tIs the server running on that host and accepting TCP/IP connections?")
DUPLICATE_KEY = ("duplicate key value violates unique constraint \"{constraint}\"\n"
                 "DETAIL:  Key (id)=({id}) already exists.")
DEADLOCK = ("deadlock detected\nDETAIL:  Process {a} waits for ShareLock on transaction {t}; "
            "blocked by process {b}.")
URLLIB3_NEW_CONNECTION = (
    "HTTPSConnectionPool(host='{host}', port={port}): Max retries exceeded with url: "
    "/v1/charges/{charge} (Caused by NewConnectionError('<urllib3.connection.HTTPSConnection "
    "object at {obj}>: Failed to establish a new connection: {reason}'))")
READ_TIMEOUT = ("HTTPConnectionPool(host='{host}', port={port}): Read timed out. "
                "(read timeout={timeout})")
SMTP_REPLY = "({code}, b'{text}')"
RECIPIENTS_REFUSED = "SMTPRecipientsRefused({{'{rcpt}': ({code}, b'{text}')}})"
GMAIL_421 = "4.7.0 Try again later, closing connection. {mid} - gsmtp"
NO_SUCH_ACCOUNT = "5.1.1 The email account that you tried to reach does not exist."


# -- same problem, different variable parts: one group -----------------------------------------

@pytest.mark.parametrize("first,second", [
    # the contract's own example: numbers and addresses
    ("timeout after 30012 ms on 10.0.3.7:5432", "timeout after 29876 ms on 10.0.3.9:5432"),
    # Python builtins
    ("KeyError: 'user_42'", "KeyError: 'user_1337'"),
    ("ValueError: invalid literal for int() with base 10: 'abc'",
     "ValueError: invalid literal for int() with base 10: '12x'"),
    ("TimeoutError: [Errno 110] Connection timed out",
     "TimeoutError: [Errno 110] Connection timed out"),
    ('File "/srv/app/tasks.py", line 88, in send', 'File "/srv/app/mailer.py", line 12, in send'),
    ("TimeoutError: job 1001 did not finish in 30s", "TimeoutError: job 73 did not finish in 5s"),
    # Postfix names the recipient bare, in angle brackets
    ("550 5.1.1 <bob@example.com>: Recipient address rejected: User unknown in local "
     "recipient table", "550 5.1.1 <alice.smith+news@mail.example.org>: Recipient address "
     "rejected: User unknown in local recipient table"),
    ("RuntimeError: order #42 stuck, id=123", "RuntimeError: order #7 stuck, id=98765"),
    # psycopg
    (CONNECT_REFUSED.format(ip="10.0.3.7", port=5432),
     CONNECT_REFUSED.format(ip="10.0.3.9", port=6432)),
    (DUPLICATE_KEY.format(constraint="orders_pkey", id=1001),
     DUPLICATE_KEY.format(constraint="orders_pkey", id=982133)),
    (DEADLOCK.format(a=4242, t=991, b=4243), DEADLOCK.format(a=17, t=1208838, b=16)),
    ("could not connect to server: Connection refused (db-3.internal:5432)",
     "could not connect to server: Connection refused (db-12.internal:5433)"),
    ("connection to [::1]:5432 failed", "connection to [fe80::1ff:fe23:4567:890a]:5433 failed"),
    ("no route to 2001:db8::7", "no route to 2001:db8:0:0:1:0:0:1"),
    # urllib3
    (URLLIB3_NEW_CONNECTION.format(host="api.example.com", port=443, charge="ch_3MtwBw",
                                   obj="0x7f3a2b1c9d40",
                                   reason="[Errno 111] Connection refused"),
     URLLIB3_NEW_CONNECTION.format(host="api.stripe.com", port=8443, charge="ch_9XyZa1",
                                   obj="0x7f0e11aa2c10",
                                   reason="[Errno 111] Connection refused")),
    (READ_TIMEOUT.format(host="10.0.3.7", port=8080, timeout=30),
     READ_TIMEOUT.format(host="hooks.internal", port=80, timeout=2.5)),
    # requests
    ("404 Client Error: Not Found for url: https://api.example.com/v1/orders/1001",
     "404 Client Error: Not Found for url: https://api.example.com/v1/orders/77"),
    ("500 Server Error: Internal Server Error for url: http://10.0.3.7:8000/jobs/5f0c9a1e",
     "500 Server Error: Internal Server Error for url: http://10.0.3.8:8000/jobs/7be2d40c"),
    # smtplib
    (SMTP_REPLY.format(code=421, text=GMAIL_421.format(mid="x12sm345678abc.90")),
     SMTP_REPLY.format(code=421, text=GMAIL_421.format(mid="a7si2094736qkb.112"))),
    (RECIPIENTS_REFUSED.format(rcpt="bob@example.com", code=550, text=NO_SUCH_ACCOUNT),
     RECIPIENTS_REFUSED.format(rcpt="alice@example.org", code=550, text=NO_SUCH_ACCOUNT)),
    # ids in their common shapes
    ("lookup of 123e4567-e89b-12d3-a456-426614174000 failed",
     "lookup of 9F1C2B3A-0000-4D5E-8F90-AB12CD34EF56 failed"),
    ("checkout of 9fceb02d0ae598e95dc970b74767f19372d61af8 failed",
     "checkout of 4b825dc642cb6eb9a060e54bf8d69288fbee4904 failed"),
    ("request req_8f3a2b1c9d rejected", "request req_04e1a7c3bb rejected"),
    ("Processing  took 3 attempts\n\n", "Processing took 12 attempts"),
], ids=["contract example", "KeyError", "ValueError", "TimeoutError", "traceback line",
        "units", "postfix recipient", "ids", "psycopg refused", "psycopg duplicate key",
        "psycopg deadlock",
        "host:port", "IPv6 host:port", "IPv6", "urllib3 new connection", "urllib3 read timeout",
        "requests 404", "requests 500", "smtplib 421", "smtplib recipients refused", "uuid",
        "git sha", "request id", "whitespace"])
def test_errors_differing_only_in_variable_parts_share_a_fingerprint(first: str,
                                                                  second: str) -> None:
    assert error_fingerprint(first) == error_fingerprint(second)


# -- different problems: different groups ------------------------------------------------------

@pytest.mark.parametrize("first,second", [
    (URLLIB3_NEW_CONNECTION.format(host="api.example.com", port=443, charge="ch_3MtwBw",
                                   obj="0x7f3a2b1c9d40",
                                   reason="[Errno 111] Connection refused"),
     URLLIB3_NEW_CONNECTION.format(host="api.example.com", port=443, charge="ch_3MtwBw",
                                   obj="0x7f3a2b1c9d40",
                                   reason="[Errno -2] Name or service not known")),
    ("404 Client Error: Not Found for url: https://api.example.com/v1/orders/1001",
     "500 Server Error: Internal Server Error for url: https://api.example.com/v1/orders/1001"),
    ("503 Server Error: Service Unavailable for url: https://api.example.com/v1/orders",
     "502 Server Error: Bad Gateway for url: https://api.example.com/v1/orders"),
    ("canceling statement due to statement timeout", DEADLOCK.format(a=4242, t=991, b=4243)),
    ("KeyError: 'user_42'", "ValueError: invalid literal for int() with base 10: 'user_42'"),
    ("ZeroDivisionError: division by zero", "ZeroDivisionError: float division by zero"),
    ('File "/srv/app/tasks.py", line 88, in send', 'File "/srv/app/tasks.py", line 88, in render'),
    (SMTP_REPLY.format(code=421, text=GMAIL_421.format(mid="x12sm345678abc.90")),
     SMTP_REPLY.format(code=550, text=NO_SUCH_ACCOUNT)),
    ("SMTPServerDisconnected: Connection unexpectedly closed",
     "SMTPServerDisconnected: please run connect() first"),
    (READ_TIMEOUT.format(host="10.0.3.7", port=8080, timeout=30),
     CONNECT_REFUSED.format(ip="10.0.3.7", port=8080)),
    # digits that are part of a name are kept
    ("UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte",
     "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xc3 in position 7: invalid "
     "continuation byte"),
    ("client encoding utf8 refused", "client encoding utf16 refused"),
    ("no module named psycopg2", "no module named psycopg"),
    ("s3 upload failed", "gcs upload failed"),
    ("ipv4 only", "ipv6 only"),
    ("ssl: TLSv1.2 not allowed", "ssl: TLSv1.3 not allowed"),
    # source file and line is not a host and port
    ("tasks.py:88: assertion failed", "mailer.py:88: assertion failed"),
    # case is kept
    ("Connection refused", "connection refused"),
], ids=["refused vs unknown host", "404 vs 500", "503 vs 502", "statement timeout vs deadlock",
        "KeyError vs ValueError", "int vs float division", "another function",
        "smtp 421 vs 550", "smtp disconnected", "read timeout vs refused",
        "start vs continuation byte", "utf8", "psycopg2", "s3", "ipv4", "TLS version",
        "file:line", "case"])
def test_different_messages_get_different_fingerprints(first: str, second: str
                                                      ) -> None:
    assert error_fingerprint(first) != error_fingerprint(second)


# -- names say which thing failed: real errors of four languages -------------------------------

PYTHON_KEY_ERROR = """Traceback (most recent call last):
  File "/srv/app/venv/lib/python3.11/site-packages/queuelog_client/worker.py", line {line}, in _run
    result = handler(job)
  File "/srv/app/jobs/welcome.py", line 41, in send_welcome
    to = payload[{key!r}]
KeyError: {key!r}"""
PYTHON_ATTRIBUTE = """Traceback (most recent call last):
  File "/srv/app/jobs/invoice.py", line {line}, in render
    total = order.{attr}
AttributeError: 'NoneType' object has no attribute '{attr}'"""
NODE_TYPE_ERROR = """TypeError: Cannot read properties of undefined (reading '{prop}')
    at sendWelcome (/srv/app/jobs/welcome.js:{line}:27)
    at Worker.run (/srv/app/node_modules/queuelog/worker.js:88:19)
    at process.processTicksAndRejections (node:internal/process/task_queues:95:5)"""
GO_PANIC = """panic: json: unknown field "{field}"

goroutine {goroutine} [running]:
main.handle({pointer})
\t/srv/app/main.go:{line} +0x1d
main.main()
\t/srv/app/main.go:17 +0x65"""
JAVA_NPE = ("java.lang.NullPointerException: Cannot invoke \"String.length()\" because "
            '"{path}" is null\n'
            "\tat com.example.jobs.Welcome.send(Welcome.java:{line})\n"
            "\tat com.example.queue.Runner.run(Runner.java:88)\n"
            "\tat java.base/java.lang.Thread.run(Thread.java:1583)")
PYTHON_VALUE = """Traceback (most recent call last):
  File "/srv/app/jobs/import.py", line {line}, in parse
    count = int(row["count"])
ValueError: invalid literal for int() with base 10: {value!r}"""
NODE_CUSTOMER = """Error: unknown customer '{customer}'
    at lookup (/srv/app/jobs/bill.js:{line}:11)"""


@pytest.mark.parametrize("template,names", [
    (PYTHON_KEY_ERROR, [{"key": "address"}, {"key": "n"}]),
    (PYTHON_ATTRIBUTE, [{"attr": "total"}, {"attr": "currency"}]),
    (NODE_TYPE_ERROR, [{"prop": "email"}, {"prop": "name"}]),
    (GO_PANIC, [{"field": "amount_cents"}, {"field": "currency"}]),
    (JAVA_NPE, [{"path": "customer.email"}, {"path": "customer.phone"}]),
], ids=["python KeyError", "python AttributeError", "node TypeError", "go panic",
        "java NullPointerException"])
def test_a_failure_naming_another_key_or_attribute_is_another_group(
        template: str, names: list[dict[str, str]]) -> None:
    """The same code failing on another key, attribute, field or property is another
    problem; the same one at another line of a new release, another goroutine or address,
    is the same."""
    line_varies = [{"line": 31, "goroutine": 1, "pointer": "0xc000012345"},
                   {"line": 207, "goroutine": 18, "pointer": "0xc0000a8f10"}]
    first, second = ({**varies, **name} for varies, name in zip(line_varies, names, strict=True))
    assert (error_fingerprint(template.format(**first))
            != error_fingerprint(template.format(**second)))
    same_name = {**line_varies[1], **names[0]}
    assert (error_fingerprint(template.format(**first))
            == error_fingerprint(template.format(**same_name)))


@pytest.mark.parametrize("template,data", [
    (PYTHON_VALUE, [{"value": "abc"}, {"value": "12x"}]),
    (NODE_CUSTOMER, [{"customer": "acme-corp"}, {"customer": "globex"}]),
    (PYTHON_KEY_ERROR, [{"key": "user_42"}, {"key": "user_1337"}]),
], ids=["python ValueError", "node unknown customer", "a key's digits"])
def test_the_data_a_failure_quotes_does_not_split_its_group(
        template: str, data: list[dict[str, str]]) -> None:
    first, second = ({"line": 31, **values} for values in data)
    assert (error_fingerprint(template.format(**first))
            == error_fingerprint(template.format(**second)))


# -- what is hashed ----------------------------------------------------------------------------

@pytest.mark.parametrize("error,expected", [
    ("timeout after 30012 ms on 10.0.3.7:5432", "timeout after <num> ms on <addr>"),
    (URLLIB3_NEW_CONNECTION.format(host="api.example.com", port=443, charge="ch_3MtwBw",
                                   obj="0x7f3a2b1c9d40",
                                   reason="[Errno 111] Connection refused"),
     "HTTPSConnectionPool(host=<str>, port=<num>): Max retries exceeded with url: "
     "/v1/charges/ch_<num> (Caused by NewConnectionError('<urllib3.connection.HTTPSConnection "
     "object at <hex>>: Failed to establish a new connection: [Errno <num>] Connection "
     "refused'))"),
    (DUPLICATE_KEY.format(constraint="orders_pkey", id=1001),
     "duplicate key value violates unique constraint \"orders_pkey\" DETAIL: Key (id)=(<num>) "
     "already exists."),
    (SMTP_REPLY.format(code=421, text=GMAIL_421.format(mid="x12sm345678abc.90")),
     "(<num>, b'<num> Try again later, closing connection. <id>.<num> - gsmtp')"),
    ("404 Client Error: Not Found for url: https://api.example.com/v1/orders/1001",
     "<num> Client Error: Not Found for url: https://<addr>/v1/orders/<num>"),
    ("job 123e4567-e89b-12d3-a456-426614174000 on db-3.internal:5432, [::1]:5432, fe80::1, "
     "commit 9fceb02d0ae5, took 30012ms, retry -1, ref \u201cx\u201d, got \u2018y\u2019 "
     "(utf8, http2, s3, base64)",
     "job <uuid> on <addr>, <addr>, <addr>, commit <hex>, took <num>, retry <num>, ref <str>, "
     "got <str> (utf8, http2, s3, base64)"),
], ids=["contract example", "urllib3", "psycopg", "smtplib", "requests", "each placeholder"])
def test_the_normalized_error_shows_the_placeholders(error: str, expected: str) -> None:
    assert normalized_error(error) == expected


def test_the_fingerprint_is_16_lowercase_hex_digits_and_stable() -> None:
    fingerprint = error_fingerprint("timeout after 30012 ms on 10.0.3.7:5432")

    assert FINGERPRINT_CHARS == 16
    assert re.fullmatch(r"[0-9a-f]{16}", fingerprint)
    # A change here (of the placeholders or the hash) splits every stored failure group.
    assert fingerprint == "7f05597e7f042c23"


def test_the_fingerprint_pattern_accepts_a_fingerprint_and_nothing_longer_or_other() -> None:
    fingerprint = error_fingerprint("ZeroDivisionError: division by zero")

    assert FINGERPRINT_PATTERN.match(fingerprint)
    assert FINGERPRINT_PATTERN.fullmatch(fingerprint)
    for wrong in (fingerprint + "0", fingerprint[:-1], fingerprint.upper(), "g" * 16, ""):
        assert not FINGERPRINT_PATTERN.match(wrong)


def test_a_secret_is_never_part_of_what_is_hashed() -> None:
    first = redact_error("auth failed: password=hunter2 for db")
    second = redact_error("auth failed: password=swordfish for db")

    assert "hunter2" not in normalized_error(first)
    assert error_fingerprint(first) == error_fingerprint(second)


def test_only_the_first_part_of_a_long_error_is_hashed() -> None:
    head = "boom: " + "x " * 600

    assert len(normalized_error(head + "tail one")) == 1000
    assert error_fingerprint(head + "tail one") == error_fingerprint(head + "tail two")


def test_an_empty_error_has_a_fingerprint() -> None:
    assert normalized_error(" \n\t") == ""
    assert re.fullmatch(r"[0-9a-f]{16}", error_fingerprint(""))


@pytest.mark.parametrize("error", [
    "a-" * 50_000, "0x" * 50_000, "'" * 100_000, "1." * 50_000, "a." * 50_000, "1:" * 50_000,
    "\\'" * 50_000, "b'" * 50_000, '"' + "a " * 50_000, "x://" + "a:" * 50_000,
    "[" + ":" * 99_999, "a1" * 50_000, "f" * 100_000, "a" * 99_990 + ".internal:5432",
    "a@" * 50_000, "a." * 49_990 + "@", "a@b." * 25_000,
], ids=["a-a-", "0x0x", "quotes", "1.1.", "a.a.", "1:1:", "escaped quotes", "b'b'",
        "unclosed quote", "url", "brackets", "a1a1", "hex", "long host", "a@a@", "a.a.@",
        "a@b.a@b."])
def test_a_long_adversarial_error_is_normalized(error: str) -> None:
    # Quadratic patterns would take minutes here; linear ones take milliseconds.
    assert len(normalized_error(error)) <= 1000
    assert re.fullmatch(r"[0-9a-f]{16}", error_fingerprint(error))
