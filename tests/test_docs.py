"""README.md and docs/*.md render as they are written and show what the API answers.

Read with a CommonMark parser (markdown-it-py), as GitHub and every other renderer read them:
a code fence left open swallows the prose after it and turns the next block into text, which
no reader of the raw file notices. Every ```json example must parse; and every job or job
type an example shows must have exactly the fields the API's own schemas give one, so that a
field added to the API cannot go missing from the examples (it did: schedule, scheduled_for).
Examples that are deliberately partial (ellipses, `{…}`) are labelled ```text, not json.
"""

from __future__ import annotations

import configparser
import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token
from marshmallow import Schema

from app.config import SETTINGS
from app.history.explain import ReasonCode
from app.jobs.web.answers import BatchJobSchema, JobSchema
from app.types.schemas import TypeSchema
from tests import doc_examples

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]

# A line that opens a fence with an info string (```sh, ```json): inside another fence it
# means that fence was never closed, since a closing fence carries no info string.
_FENCE_OPENER = re.compile(r"^ {0,3}(`{3,}|~{3,})[^`\s]")


@dataclass(frozen=True)
class Fence:
    path: Path
    line: int  # 1-based line of the opening fence
    info: str
    content: str
    closed: bool

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _tokens(path: Path) -> list[Token]:
    return MarkdownIt("commonmark").parse(path.read_text(encoding="utf-8"))


def fences(path: Path) -> list[Fence]:
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    for token in _tokens(path):
        if token.type != "fence" or token.map is None:
            continue
        start, end = token.map
        last = lines[end - 1].strip() if end - start >= 2 else ""
        marker = token.markup[0]
        closed = (len(last) >= len(token.markup) and set(last) == {marker})
        found.append(Fence(path, start + 1, token.info.strip(), token.content, closed))
    return found


def json_bodies(fence: Fence) -> Iterator[Any]:
    """The JSON a fence shows: a ```json block whole, or an HTTP response's body. Raises
    JSONDecodeError for one that does not parse."""
    if fence.info == "json":
        yield json.loads(fence.content)
    elif fence.info == "" and fence.content.startswith("HTTP/"):
        _head, _, body = fence.content.partition("\n\n")
        if body.strip():
            yield json.loads(body)


def _objects(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, dict):
        yield value
        for member in value.values():
            yield from _objects(member)
    elif isinstance(value, list):
        for item in value:
            yield from _objects(item)


def _schema_of(shown: dict[str, Any]) -> Schema | None:
    """The schema an object of an example claims to be an instance of, if any."""
    if {"id", "type", "status", "retry_count"} <= shown.keys():
        return BatchJobSchema() if "replayed" in shown else JobSchema()
    if {"type", "paused", "counts"} <= shown.keys():
        return TypeSchema()
    return None


def _named(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", DOCUMENTS, ids=_named)
def test_every_code_fence_is_closed(path: Path) -> None:
    unclosed = [fence.where for fence in fences(path) if not fence.closed]
    swallowing = [fence.where for fence in fences(path)
                  if any(_FENCE_OPENER.match(line) for line in fence.content.splitlines())]
    assert not unclosed, f"fences never closed: {unclosed}"
    assert not swallowing, f"fences running into the next (a closing ``` missing): {swallowing}"


@pytest.mark.parametrize("path", DOCUMENTS, ids=_named)
def test_every_json_example_parses(path: Path) -> None:
    broken = []
    for fence in fences(path):
        try:
            list(json_bodies(fence))
        except json.JSONDecodeError as error:
            broken.append(f"{fence.where}: {error}")
    assert not broken, "JSON examples that do not parse (label partial ones ```text):\n" + \
        "\n".join(broken)


@pytest.mark.parametrize("path", DOCUMENTS, ids=_named)
def test_every_job_and_type_shown_has_the_fields_the_api_gives(path: Path) -> None:
    wrong = []
    for fence in fences(path):
        try:
            bodies = list(json_bodies(fence))
        except json.JSONDecodeError:
            continue  # test_every_json_example_parses names it
        for body in bodies:
            for shown in _objects(body):
                schema = _schema_of(shown)
                if schema is not None and (errors := schema.validate(shown)):
                    wrong.append(f"{fence.where}: {type(schema).__name__} {errors}")
    assert not wrong, "\n".join(wrong)


def test_the_fence_checks_catch_a_fence_left_open(tmp_path: Path) -> None:
    """The PATCH /types 422 example had lost its closing fence: the next section's heading
    became part of the JSON, and the next ```sh opened inside it."""
    document = tmp_path / "doc.md"
    document.write_text('```json\n{"a": 1}\n\n### Next\n\n```sh\ncurl x\n```\n\nProse.\n')
    [fence, *_] = fences(document)
    assert fence.closed
    assert any(_FENCE_OPENER.match(line) for line in fence.content.splitlines())
    with pytest.raises(json.JSONDecodeError):
        list(json_bodies(fence))
    document.write_text("Prose.\n\n```sh\ncurl x\n")
    assert not fences(document)[0].closed
    document.write_text("```sh\ncurl x\n```\n")
    assert fences(document)[0].closed


def test_the_schema_check_catches_a_job_missing_a_field() -> None:
    job = {"id": 1, "type": "email", "payload": {}, "priority": "medium", "status": "pending",
           "retry_count": 0, "max_retries": 3, "idempotency_key": None, "concurrency_key": None,
           "run_at": "2026-11-30T06:00:00.000000Z", "claimed_at": None, "worker_id": None,
           "lease_expires_at": None, "result": None, "created_at": "2026-11-30T06:00:00.000000Z",
           "updated_at": "2026-11-30T06:00:00.000000Z", "unique_key": None, "schedule": None,
           "scheduled_for": None, "timeout_seconds": None, "expires_at": None}
    schema = _schema_of(job)
    assert schema is not None and not schema.validate(job)
    del job["scheduled_for"]
    assert "scheduled_for" in schema.validate(job)
    assert "surprise" in schema.validate({**job, "scheduled_for": None, "surprise": 1})


# Links: the README is the index of docs/, so every link in it and in docs/ must land.

def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as '-'."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    tokens = _tokens(path)
    seen: dict[str, int] = {}
    found = set()
    for opening, inline in itertools.pairwise(tokens):
        if opening.type == "heading_open":
            slug = github_slug(inline.content)
            found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return found


def local_links(path: Path) -> Iterator[str]:
    for token in _tokens(path):
        for child in token.children or []:
            target = child.attrs.get("href") or child.attrs.get("src")
            if isinstance(target, str) and not re.match(r"[a-z]+:", target):
                yield target


@pytest.mark.parametrize("path", DOCUMENTS, ids=_named)
def test_every_local_link_lands_on_a_file_and_heading(path: Path) -> None:
    broken = []
    for target in local_links(path):
        file_part, _, fragment = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        missing_heading = (fragment and linked.suffix == ".md" and linked.exists()
                           and fragment not in anchors(linked))
        if not linked.exists() or missing_heading:
            broken.append(target)
    assert not broken, f"{_named(path)}: links to nothing: {broken}"


def test_github_slugs_are_computed_as_github_does() -> None:
    assert github_slug("PATCH /types/{type}") == "patch-typestype"
    assert github_slug("1. One SQLite host") == "1-one-sqlite-host"
    assert github_slug("Why isn't my job running?") == "why-isnt-my-job-running"


# The README is a newcomer's first page: short, and the index of everything else.

# What a reader reads: the HTML comments that tell the tests which examples run
# (tests/doc_examples.py) do not count.
README_MAX_BYTES = 9 * 1024 + 512


def test_the_readme_stays_short() -> None:
    size = len(re.sub(r"<!--.*?-->\n?", "", README.read_text(encoding="utf-8"),
                      flags=re.DOTALL).encode())
    assert size <= README_MAX_BYTES, (
        f"README.md is {size} bytes: keep it to what a newcomer needs and move the rest to docs/")


def test_the_readme_links_every_document_in_docs() -> None:
    linked = {(README.parent / target.partition("#")[0]).resolve()
              for target in local_links(README)}
    assert not [_named(doc) for doc in DOCUMENTS[1:] if doc.resolve() not in linked]


def test_scaling_counts_postgresql_connections_with_the_shipped_worker_count() -> None:
    """docs/SCALING.md once counted 2 workers a host: the test machine's cores, not what
    queuelog_gunicorn/conf.py ships (one worker per core, at most 4). Its connections per host
    follow the shipped worker count and pool."""
    conf = (ROOT / "queuelog_gunicorn" / "conf.py").read_text()
    cap = re.search(r'"GUNICORN_WORKERS", min\(os\.cpu_count\(\) or 1, (\d+)\)', conf)
    assert cap is not None, "the shipped worker count is no longer min(cores, N)"
    workers = int(cap[1])
    pool = next(s.default for s in SETTINGS if s.variable == "QUEUELOG_DB_POOL_SIZE")
    scaling = (ROOT / "docs" / "SCALING.md").read_text()
    per_host = workers * pool + 1  # the pools (no overflow on PostgreSQL) and one listener
    section = re.sub(r"\s+", " ", scaling.split("#### Connections", 1)[1].split("\n#", 1)[0])
    assert f"`QUEUELOG_DB_POOL_SIZE` pooled connections ({pool};" in section
    assert f"{workers} × {pool} + 1 = {per_host}" in section  # noqa: RUF001 (SCALING.md writes the sign)
    bullet = scaling.split("- **Connections.**", 1)[1].split("\n- **", 1)[0]
    bullet = re.sub(r"\s+", " ", bullet)
    assert f"({per_host} with the shipped settings on {workers} or more cores)" in bullet


def _layers_drawn(path: Path, heading: str) -> list[str]:
    """The layers a document draws: the first column of the text fence under `heading`."""
    text = path.read_text(encoding="utf-8")
    section = text.split(f"\n{heading}\n", 1)[1]
    fence = next(f for f in fences(path) if f.info == "text" and f.content in section)
    return [re.split(r"\s{2,}", line.strip())[0] for line in fence.content.splitlines()
            if line.strip()]


@pytest.mark.parametrize(("path", "heading"), [(ROOT / "docs" / "ARCHITECTURE.md", "## Layers")],
                         ids=["ARCHITECTURE"])
def test_the_layers_drawn_are_the_layers_ci_checks(path: Path, heading: str) -> None:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    checked = [line.strip() for line in
               config["importlinter:contract:layers"]["layers"].splitlines() if line.strip()]
    assert _layers_drawn(path, heading) == checked


def test_the_explain_table_in_jobs_md_lists_every_reason_code() -> None:
    text = (ROOT / "docs" / "JOBS.md").read_text()
    table = text.split("| code | means | evidence |", 1)[1].split("\n\n", 1)[0]
    listed = re.findall(r"^\| `([a-z_]+)` \|", table, flags=re.MULTILINE)
    assert sorted(listed) == sorted(ReasonCode)


# Examples: each says whether the tests run it (tests/doc_examples.py has the convention).

@pytest.mark.parametrize("path", DOCUMENTS, ids=_named)
def test_every_example_says_whether_it_is_run(path: Path) -> None:
    unmarked = [block.where for block in doc_examples.read(path).unmarked]
    assert not unmarked, (
        "blocks without <!-- run --> or <!-- not run: why --> before them (see "
        f"tests/doc_examples.py): {unmarked}")


def test_the_client_docs_producer_and_worker_are_at_most_ten_lines() -> None:
    for name in ("producer.py", "worker.py"):
        code = doc_examples.named(ROOT / "docs" / "CLIENT.md", name)
        assert len([line for line in code.splitlines() if line.strip()]) <= 10, name


# The comparison the docs' examples are held to (tests/test_doc_examples.py runs them).

_JOB_ANSWER = ('{"id": 7, "status": "pending", "run_at": "2026-11-30T06:00:00.000000Z", '
               '"lease_token": "bb14.1", "tags": []}')


def _answer(info: str, text: str) -> doc_examples.Answer:
    return doc_examples.Answer(line=1, info=info, text=text)


def test_an_answer_compares_ids_and_fields_but_not_times_or_tokens() -> None:
    shown = _answer("json", _JOB_ANSWER)
    same_but_for_time_and_token = _JOB_ANSWER.replace("06:00:00", "07:12:13").replace(
        "bb14.1", "ffff.2")
    assert doc_examples.difference(shown, same_but_for_time_and_token) is None
    assert "id" in (doc_examples.difference(shown, _JOB_ANSWER.replace("7", "8")) or "")
    missing_a_field = _JOB_ANSWER.replace(', "tags": []', "")
    assert doc_examples.difference(shown, missing_a_field) is not None
    assert doc_examples.difference(shown, "<html>") is not None


def test_an_http_answer_compares_the_status_and_the_headers_shown() -> None:
    shown = _answer("", "HTTP/1.1 201 CREATED\nLocation: /jobs/7\n\n" + _JOB_ANSWER)
    got = ("HTTP/1.1 201 CREATED\r\nDate: Sun, 06 Dec 2026 07:00:00 GMT\r\n"
           "Location: /jobs/7\r\nContent-Type: application/json\r\n\r\n" + _JOB_ANSWER)
    assert doc_examples.difference(shown, got) is None
    assert doc_examples.difference(shown, got.replace("201 CREATED", "200 OK")) is not None
    assert doc_examples.difference(shown, got.replace("/jobs/7", "/jobs/8")) is not None


def test_an_ellipsis_in_a_text_answer_stands_for_anything() -> None:
    shown = _answer("text", "401\n…\ndone")
    assert doc_examples.difference(shown, "401\nmany lines\nof output\ndone\n") is None
    assert doc_examples.difference(shown, "403\ndone\n") is not None


def test_the_marks_say_what_runs_and_what_answers(tmp_path: Path) -> None:
    document = tmp_path / "doc.md"
    document.write_text(
        "<!-- run: worker.py, worker, in the background -->\n```python\nprint(1)\n```\n\n"
        "<!-- run -->\n```sh\ncurl -s $Q/healthz\n```\n```json\n{\"status\": \"ok\"}\n```\n\n"
        "<!-- not run: needs a browser -->\n```sh\nopen http://x\n```\n\n"
        "```sh\ncurl -s $Q/readyz\n```\n")
    read = doc_examples.read(document)
    worker, health, browser = read.examples
    assert (worker.file, worker.role, worker.background) == ("worker.py", "worker", True)
    assert health.run and health.answer is not None and '"ok"' in health.answer.text
    assert not browser.run and browser.reason == "needs a browser"
    assert [block.line for block in read.unmarked] == [19]
    document.write_text("<!-- run: quickly -->\n```sh\ntrue\n```\n")
    with pytest.raises(doc_examples.MarkError):
        doc_examples.read(document)
    document.write_text("<!-- not run -->\n```sh\ntrue\n```\n")
    with pytest.raises(doc_examples.MarkError):
        doc_examples.read(document)
