"""`redact_error`: what a worker's error text loses before it is stored (contract section 4).

URL credentials, the values of password, passwd, pwd, secret, token, api_key and
authorization in `k=v`, `k: v` and JSON `"k": "v"` forms, and Bearer tokens are masked with
`***`; then the text is cut to 2,000 characters. Everything else is kept as written.
"""

from __future__ import annotations

import pytest

from app.core.limits import STORED_ERROR_CHARS
from app.core.redaction import MASK, display_url, redact_error, scrub_url

NAMES = ["password", "passwd", "pwd", "secret", "token", "api_key", "authorization"]


def test_the_mask_and_the_cut_are_the_contracts():
    assert MASK == "***"
    assert STORED_ERROR_CHARS.max == 2000


# -- URL credentials ---------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("postgres://user:pass@host/db", "postgres://***@host/db"),
    ("could not connect to postgresql+psycopg://app:s3cr3t@10.0.0.5:5432/jobs: timeout",
     "could not connect to postgresql+psycopg://***@10.0.0.5:5432/jobs: timeout"),
    ("redis://:only-a-password@cache:6379/0", "redis://***@cache:6379/0"),
    ("amqp://guest:guest@rabbit//", "amqp://***@rabbit//"),
    ("GET https://deploy:ghp_abc123@github.com/org/repo.git failed",
     "GET https://***@github.com/org/repo.git failed"),
    ('dsn="mysql://root:toor@db/app"', 'dsn="mysql://***@db/app"'),
], ids=["postgres", "driver-qualified scheme", "password only", "amqp", "https in a sentence",
        "inside quotes"])
def test_url_credentials_are_masked_and_the_host_and_path_kept(text, expected):
    assert redact_error(text) == expected


# -- key = value, key: value, "key": "value" ---------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_the_value_of_each_secret_name_is_masked_in_key_equals_value_form(name):
    text = f"login failed {name}=hunter2 for bob"

    assert redact_error(text) == f"login failed {name}=*** for bob"


@pytest.mark.parametrize("name", NAMES)
def test_the_value_of_each_secret_name_is_masked_in_key_colon_value_form(name):
    assert redact_error(f"{name}: hunter2\nretrying") == f"{name}: ***\nretrying"


@pytest.mark.parametrize("name", NAMES)
def test_the_value_of_each_secret_name_is_masked_in_json_form(name):
    text = f'request body {{"user": "bob", "{name}": "hunter2", "n": 1}} rejected'

    assert redact_error(text) == f'request body {{"user": "bob", "{name}": "***", "n": 1}} rejected'


@pytest.mark.parametrize("text,expected", [
    ("PASSWORD=hunter2", "PASSWORD=***"),
    ("Password: hunter2", "Password: ***"),
    ("API_KEY=k-123", "API_KEY=***"),
    ("Api_Key: k-123", "Api_Key: ***"),
    ('{"TOKEN": "abc"}', '{"TOKEN": "***"}'),
    ("SECRET=x", "SECRET=***"),
    ("AUTHORIZATION: Basic dXNlcjpwYXNz", "AUTHORIZATION: ***"),
    ("bearer abc.DEF-123", "Bearer ***"),
    ("POSTGRES://USER:PASS@HOST/DB", "POSTGRES://***@HOST/DB"),
])
def test_names_and_schemes_are_recognised_in_any_case(text, expected):
    assert redact_error(text) == expected


@pytest.mark.parametrize("text,expected", [
    ("db_password=hunter2", "db_password=***"),
    ("PGPASSWORD=hunter2", "PGPASSWORD=***"),
    ("client_secret=abc&grant_type=client_credentials",
     "client_secret=***&grant_type=client_credentials"),
    ("access_token=abc; Path=/", "access_token=***; Path=/"),
    ('{"refresh_token":"abc","expires_in":3600}', '{"refresh_token":"***","expires_in":3600}'),
    ("X-Auth-Token: abc123", "X-Auth-Token: ***"),
])
def test_names_ending_in_a_secret_name_count_as_that_name(text, expected):
    assert redact_error(text) == expected


@pytest.mark.parametrize("text,expected", [
    ("password = hunter2", "password = ***"),
    ("token:abc", "token:***"),
    ('"password" : "hunter2"', '"password" : "***"'),
    ('{"password":"hun\\"ter2","user":"bob"}', '{"password":"***","user":"bob"}'),
    ("pwd=hunter2,user=bob", "pwd=***,user=bob"),
    ("secret=abc;next", "secret=***;next"),
])
def test_spacing_and_delimiters_around_a_value_do_not_let_it_through(text, expected):
    assert redact_error(text) == expected


@pytest.mark.parametrize("text,expected", [
    ('password="correct horse battery staple"', "password=***"),
    ("password='hunter2'", "password=***"),
    ("psycopg.connect(host='db', password='hunter2', dbname='jobs')",
     "psycopg.connect(host='db', password=***, dbname='jobs')"),
    ('token: "abc def"', "token: ***"),
    ("{'password': 'hunter2', 'user': 'bob'}", "{'password': '***', 'user': 'bob'}"),
    ("{'api_key': \"it's-secret\"}", "{'api_key': \"***\"}"),
], ids=["double-quoted with spaces", "single-quoted", "python call", "quoted after colon",
        "python dict", "python dict, double-quoted value"])
def test_a_quoted_value_is_masked_whole(text, expected):
    assert redact_error(text) == expected


# -- Bearer tokens -----------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("Authorization: Bearer xyz", "Authorization: ***"),
    ('{"Authorization": "Bearer eyJhbGciOi.J9.abc"}', '{"Authorization": "***"}'),
    ("upstream said 401 to Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig_-+/= at 12:00",
     "upstream said 401 to Bearer *** at 12:00"),
    ("headers: {'Authorization': 'Bearer abc'}", "headers: {'Authorization': '***'}"),
])
def test_bearer_tokens_are_masked_wherever_they_appear(text, expected):
    assert redact_error(text) == expected


def test_every_secret_in_one_text_is_masked_and_the_text_around_them_is_kept():
    text = ("job 17 failed: postgres://user:pass@host/db refused; retried with password=hunter2; "
            'response {"token": "abc"}; sent Authorization: Bearer xyz and api_key: k')

    assert redact_error(text) == (
        "job 17 failed: postgres://***@host/db refused; retried with password=***; "
        'response {"token": "***"}; sent Authorization: *** and api_key: ***')


# -- what is not a secret ----------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "the password was rejected",
    "passwords do not match",
    "token expired",
    "tokens: 5",
    "tokenizer failed on line 3",
    "invalid secret",
    "authorization failed for user bob",
    "KeyError: 'token'",
    "'password' is a required property",
    'File "/srv/app/worker.py", line 12, in run',
    "connection refused at 10.0.0.1:5432",
    "see https://example.com/docs/errors#timeout",
    "see https://example.com/a@b",
    "mail to bob@example.com bounced",
    "ratio=0.5; count: 3; user=bob",
    "",
    "ValueError: invalid literal for int() with base 10: 'abc'",
])
def test_ordinary_text_is_left_exactly_as_it_was(text):
    assert redact_error(text) == text


def test_redacting_twice_changes_nothing_more():
    text = 'postgres://u:p@h/d password=x "token": "y" Bearer z {\'secret\': \'w\'}'

    once = redact_error(text)

    assert redact_error(once) == once


# -- the 2,000-character cut -------------------------------------------------------------------

@pytest.mark.parametrize("length,kept", [(0, 0), (1999, 1999), (2000, 2000), (2001, 2000),
                                         (100_000, 2000)])
def test_the_stored_error_is_cut_to_2000_characters(length, kept):
    text = ("Traceback line\n" * (length // 15 + 1))[:length]

    assert redact_error(text) == text[:kept]


def test_the_cut_counts_characters_not_bytes():
    text = "\u00e9\u20ac\U0001f600" * 1000

    assert redact_error(text) == text[:2000]


def test_a_json_secret_straddling_the_cut_is_masked_before_the_text_is_cut():
    # Cut first, the value would have lost its closing quote and no longer look like JSON.
    secret = "Zq7" * 40
    text = "x" * 1985 + '"password": "' + secret + '" and more'

    stored = redact_error(text)

    assert len(stored) == 2000
    assert stored.startswith("x" * 1985 + '"password": "*')
    assert "Zq7" not in stored


def test_url_credentials_straddling_the_cut_are_masked_before_the_text_is_cut():
    # Cut first, the '@' that marks the credentials would be gone.
    text = "x" * 1980 + " postgres://admin:" + "Zq7" * 40 + "@db/prod"

    stored = redact_error(text)

    assert stored == ("x" * 1980 + " postgres://***@db/prod")[:2000]
    assert "admin" not in stored
    assert "Zq7" not in stored


def test_a_long_secret_that_would_be_cut_is_replaced_whole_so_the_rest_fits():
    text = "x" * 1900 + " token=" + "Zq7" * 500 + " then the real cause"

    assert redact_error(text) == "x" * 1900 + " token=*** then the real cause"


LONGEST_ERROR = 100_000  # the fail route's limit on `error`


def _repeat(filler: str) -> str:
    return (filler * (LONGEST_ERROR // len(filler) + 1))[:LONGEST_ERROR]


# Adversarial repetition must not make any pattern backtrack through the whole text from
# every position (an earlier version took minutes on 100,000 characters of "a-a-a-…").
@pytest.mark.parametrize("filler", ["a-", "ab", "a://", "a:b@", "-"],
                         ids=["hyphenated words", "one long word", "scheme separators",
                              "at signs", "dashes"])
def test_the_longest_harmless_error_the_api_accepts_is_only_cut(filler):
    text = _repeat(filler)

    assert redact_error(text) == text[:2000]


@pytest.mark.parametrize("filler,stored", [
    ("password=", "password=***"),
    ("token: ", ("token: *** " * 200)[:2000]),
    ("Bearer ", ("Bearer *** " * 200)[:2000]),
    ("\"token\": '", ("\"token\": '***'" * 200)[:2000]),
], ids=["one endless value", "key after key", "bearer after bearer", "half-open json"])
def test_the_longest_error_full_of_secret_names_is_masked_and_cut(filler, stored):
    assert redact_error(_repeat(filler)) == stored


# -- passwords holding "@", and values that are not plain strings ------------------------------

@pytest.mark.parametrize("text,expected", [
    ("postgres://user:p@ss@host/db", "postgres://***@host/db"),
    ("redis://:p@ss@w0rd@cache:6379/0 then mail bob@example.com",
     "redis://***@cache:6379/0 then mail bob@example.com"),
    ("amqp://guest:a@b@rabbit", "amqp://***@rabbit"),
    ("https://u:pw@host?next=a@b", "https://***@host?next=a@b"),
], ids=["one @", "several @, text after kept", "no path", "@ in the query kept"])
def test_a_url_password_holding_at_signs_is_hidden_up_to_the_last_at_before_the_host(
        text, expected):
    assert redact_error(text) == expected


@pytest.mark.parametrize("text,expected", [
    ('{"password": 12345, "user": "bob"}', '{"password": ***, "user": "bob"}'),
    ('{"pin_token": -1.5e3}', '{"pin_token": ***}'),
    ('{"secret": true}', '{"secret": ***}'),
    ('{"secret": false}', '{"secret": ***}'),
    ('{"api_key": null}', '{"api_key": ***}'),
    ("{'password': None, 'user': 'bob'}", "{'password': ***, 'user': 'bob'}"),
    ("{'password': 4242}", "{'password': ***}"),
    ("password=12345", "password=***"),
    ("token: 0.5", "token: ***"),
], ids=["json int", "json float", "true", "false", "null", "python None", "python int",
        "k=number", "k: number"])
def test_a_secret_whose_value_is_a_number_or_another_json_scalar_is_hidden(text, expected):
    assert redact_error(text) == expected


@pytest.mark.parametrize("text,expected", [
    ("{'password': b'hunter2', 'user': 'bob'}", "{'password': b'***', 'user': 'bob'}"),
    ('{"token": b"abc"}', '{"token": b"***"}'),
    ("connect(password=b'hunter 2', host='db')", "connect(password=***, host='db')"),
    ('secret: b"x y" then', "secret: *** then"),
], ids=["python dict", "double-quoted", "keyword argument, with a space", "k: bytes"])
def test_a_secret_whose_value_is_a_bytes_literal_is_hidden_whole(text, expected):
    assert redact_error(text) == expected


@pytest.mark.parametrize("text", [
    '{"tokens": 5, "count": 3}',
    "{'max_tokens': 200}",
    "see https://example.com/a@b?c=d@e",
    "b'password'",
])
def test_numbers_and_bytes_under_other_names_are_left_as_they_were(text):
    assert redact_error(text) == text


@pytest.mark.parametrize("url,shown", [
    ("https://bob:pw@hooks.example.com/services/T0A1/B2C3?sig=abc&code=9",
     "https://hooks.example.com/services/***/***?sig=***&code=***"),
    ("http://127.0.0.1:8080/hook", "http://127.0.0.1:8080/hook"),
    ("https://x.blob.core.windows.net/c/f.json?sv=2020&X-Amz-Signature=ab",
     "https://x.blob.core.windows.net/c/f.json?sv=***&X-Amz-Signature=***"),
    ("https://svc.internal/v2/", "https://svc.internal/v2/"),
    ("https://svc.internal/api/eyJhbGciOi.J9", "https://svc.internal/api/***"),
    ("https://svc.internal/x?s3cr3t&=v", "https://svc.internal/x?***&***"),
    ("https://svc.internal/%74oken", "https://svc.internal/***"),
    ("HTTPS://Svc.Internal:443/a", "https://svc.internal:443/a"),
    ("not a url", "***"),
])
def test_display_url_shows_scheme_host_and_path_shape_never_a_secret(url, shown):
    assert display_url(url) == shown


def test_scrub_url_puts_every_quoted_form_of_the_url_in_its_display_form():
    url = "https://bob:pw@h.io/tok3n/x?sig=abc"
    text = f"POST {url}; POST https://h.io/tok3n/x?sig=abc; target /tok3n/x?sig=abc"
    assert scrub_url(text, url) == ("POST https://h.io/***/x?sig=***; POST "
                                    "https://h.io/***/x?sig=***; target /***/x?sig=***")


# The closing bracket or quote after a redacted value is the text's, not the secret's.
@pytest.mark.parametrize("text,expected", [
    ("connect failed (password=hunter2)", "connect failed (password=***)"),
    ("[token=abc]", "[token=***]"),
    ("{secret=abc}", "{secret=***}"),
    ("<pwd=abc>", "<pwd=***>"),
    ("f(password=hunter2), g(x)", "f(password=***), g(x)"),
    ("((token=abc))", "((token=***))"),
    ("\"password=hunter2\"", "\"password=***\""),
    ("'token=abc'", "'token=***'"),
    ("dsn='host=db password=hunter2')", "dsn='host=db password=***')"),
    ("(Authorization: Bearer abc.def)", "(Authorization: ***)"),
])
def test_a_closing_bracket_or_quote_after_a_redacted_value_is_kept(text, expected):
    assert redact_error(text) == expected


@pytest.mark.parametrize("text,expected", [
    ("password=hun)ter2", "password=***"),
    ("token=a]b}c>d)", "token=***)"),
])
def test_a_bracket_inside_a_value_does_not_let_the_rest_of_it_through(text, expected):
    assert redact_error(text) == expected
