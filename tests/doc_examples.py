"""The examples of README.md and docs/*.md, as the markdown marks them, and the comparison of
an example's output with the answer the document shows.

The convention (docs/TESTING.md describes it for writers): an HTML comment on the line
before a code block says what the tests do with it.

    <!-- run -->                            run it: ```sh in bash, ```python with python
    <!-- run: worker.py, worker, in the background -->
    <!-- not run: needs a receiver on the internet -->

After `run:`, comma-separated: a file name (`shop.py`: the block is saved under that name, in
the directory every block of the document runs in, and run from it), a role (`producer`,
`worker`, `admin`: the token the block finds in QUEUELOG_TOKEN), `in the background` (left
running while the rest of the document runs, stopped with SIGTERM at its end, when it must
exit 0), `file only` (saved, not run: later blocks import or serve it) and, for a ```sh
block, `serves` (the document's server command: the tests (re)start a real gunicorn on the
document's database with the QUEUELOG_ settings the block sets, instead of installing).

A code block that directly follows a run block (no prose between) is its expected answer:
```json, a `curl -si` answer (`HTTP/1.1 …`, headers, a blank line, the body) or ```text.
Ids, keys' names and everything else are compared as shown; times, tokens and trace ids are
masked. In a ```text answer, `…` stands for any text.

Every ```sh and ```python block, and every block that holds a `curl`, carries one of the two
comments; tests/test_docs.py checks it.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]

_MARK = re.compile(r"^<!--\s*(run|not run)\s*(?::\s*(.*?))?\s*-->\s*$", re.DOTALL)
ROLES = ("producer", "worker", "admin")


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


class MarkError(ValueError):
    """A comment of the convention that says something the tests cannot do."""


@dataclass
class Example:
    path: Path
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    run: bool
    reason: str = ""  # why not, for a block not run
    file: str | None = None
    role: str | None = None
    background: bool = False
    file_only: bool = False
    serves: bool = False
    answer: Answer | None = None

    @property
    def where(self) -> str:
        return f"{_shown(self.path)}:{self.line}"


@dataclass
class Answer:
    line: int
    info: str
    text: str


@dataclass
class Unmarked:
    path: Path
    line: int
    info: str

    @property
    def where(self) -> str:
        return f"{_shown(self.path)}:{self.line}"


@dataclass
class Document:
    path: Path
    examples: list[Example] = field(default_factory=list)
    unmarked: list[Unmarked] = field(default_factory=list)

    @property
    def run(self) -> list[Example]:
        return [example for example in self.examples if example.run]


def _options(example: Example, text: str) -> None:
    for part in filter(None, (part.strip() for part in text.split(","))):
        if part.endswith(".py"):
            example.file = part
        elif part in ROLES:
            example.role = part
        elif part == "in the background":
            example.background = True
        elif part == "file only":
            example.file_only = True
        elif part == "serves" and example.language == "sh":
            example.serves = True
        else:
            raise MarkError(f"{example.where}: `run:` does not know {part!r}")


def _needs_mark(info: str, content: str) -> bool:
    return info in ("sh", "python") or "curl " in content


def read(path: Path) -> Document:
    """The document's examples in order, each with its answer, and its unmarked blocks."""
    tokens = MarkdownIt("commonmark").parse(path.read_text(encoding="utf-8"))
    document = Document(path)
    previous_run: Example | None = None
    for index, token in enumerate(tokens):
        if token.type != "fence" or token.map is None:
            if token.type != "html_block":
                previous_run = None
            continue
        info = token.info.strip()
        line = token.map[0] + 1
        before = tokens[index - 1] if index else None
        mark = _MARK.match(before.content.strip()) if before is not None and \
            before.type == "html_block" else None
        if mark is None and previous_run is not None and tokens[index - 1] is not None \
                and tokens[index - 1].type == "fence":
            previous_run.answer = Answer(line, info, token.content)
            previous_run = None
            continue
        previous_run = None
        if mark is None:
            if _needs_mark(info, token.content):
                document.unmarked.append(Unmarked(path, line, info))
            continue
        example = Example(path, line, info, token.content, run=mark[1] == "run")
        if example.run:
            if info not in ("sh", "python"):
                raise MarkError(f"{example.where}: only ```sh and ```python blocks run")
            _options(example, mark[2] or "")
            previous_run = example
        else:
            example.reason = (mark[2] or "").strip()
            if not example.reason:
                raise MarkError(f"{example.where}: `not run` without a reason")
        document.examples.append(example)
    return document


def named(path: Path, name: str) -> str:
    """The code of the block the document saves as `name` (e.g. "worker.py")."""
    found = [example.code for example in read(path).examples if example.file == name]
    if len(found) != 1:
        raise LookupError(f"{path.name}: {len(found)} blocks saved as {name}")
    return found[0]


# -- comparing an output with the answer shown -----------------------------------------------

_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")
_TIME_IN_TEXT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?")
# Values that differ on every run: tokens, trace ids the server made up, secrets, and
# durations and ages (shown when not null), and a type's count of the pending jobs whose run_at
# is still ahead (which depends on how fast the examples before ran), whether the gunicorn
# worker that answered /readyz leads maintenance (one of them does), and a worker instance's
# claims of the last minute (written once a minute, whose turn the examples may cross).
MASKED_KEYS = frozenset({"lease_token", "token", "traceparent", "secret", "check_secret",
                         "span_id", "trace_id", "duration_ms", "oldest_claimable_age_seconds",
                         "scheduled", "leader", "claimed_per_minute"})
# Headers whose values differ on every run.
MASKED_HEADERS = frozenset({"date", "server", "content-length", "retry-after", "traceparent",
                            "set-cookie", "x-request-id"})
MASK = "<masked>"
# A waitpoint's url holds its token (docs/WAITS.md).
_WAITPOINT_URL = re.compile(r"^/waitpoints/[A-Za-z0-9_-]+$")


def mask(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: MASK if key in MASKED_KEYS and value[key] is not None else mask(member)
                for key, member in value.items()}
    if isinstance(value, list):
        return [mask(item) for item in value]
    if isinstance(value, str) and (_TIME.match(value) or _WAITPOINT_URL.match(value)):
        return MASK
    return value


def json_values(text: str) -> list[Any]:
    """Every JSON value of `text`, one after another (several commands, several answers)."""
    decoder = json.JSONDecoder()
    values, position = [], 0
    text = text.strip()
    while position < len(text):
        value, position = decoder.raw_decode(text, position)
        values.append(value)
        while position < len(text) and text[position].isspace():
            position += 1
    return values


@dataclass
class HttpAnswer:
    status_line: str
    headers: list[tuple[str, str]]
    body: str


def http_answers(text: str) -> list[HttpAnswer]:
    """`curl -si`'s answers (several when the block sends several requests)."""
    text = text.replace("\r\n", "\n")
    starts = [match.start() for match in re.finditer(r"^HTTP/\d(?:\.\d)? \d{3}", text, re.M)]
    answers = []
    for start, end in zip(starts, [*starts[1:], len(text)], strict=True):
        head, _, body = text[start:end].partition("\n\n")
        status_line, *lines = head.split("\n")
        headers = [(name.strip(), value.strip()) for name, _, value in
                   (line.partition(":") for line in lines if line.strip())]
        answers.append(HttpAnswer(status_line.strip(), headers, body.strip()))
    return answers


def _pretty(value: Any) -> list[str]:
    return json.dumps(value, indent=1, sort_keys=True, ensure_ascii=False).splitlines()


def _json_difference(shown: list[Any], got: list[Any]) -> str | None:
    shown, got = mask(shown), mask(got)
    if shown == got:
        return None
    return "\n".join(difflib.unified_diff(_pretty(shown), _pretty(got), "shown", "got",
                                          lineterm=""))


def _http_difference(shown_text: str, got_text: str) -> str | None:
    shown, got = http_answers(shown_text), http_answers(got_text)
    if len(shown) != len(got):
        return f"shown {len(shown)} answers, got {len(got)}:\n{got_text}"
    problems = []
    for number, (expected, actual) in enumerate(zip(shown, got, strict=True), 1):
        if expected.status_line.split()[1:] != actual.status_line.split()[1:]:
            problems.append(f"answer {number}: shown {expected.status_line!r}, "
                            f"got {actual.status_line!r}")
        received = {name.lower(): value for name, value in actual.headers}
        for name, value in expected.headers:
            if name.lower() not in received:
                problems.append(f"answer {number}: no {name} header; got {actual.headers}")
            elif name.lower() not in MASKED_HEADERS and received[name.lower()] != value:
                problems.append(f"answer {number}: {name}: shown {value!r}, "
                                f"got {received[name.lower()]!r}")
        if expected.body or actual.body:
            difference = _body_difference(expected.body, actual.body)
            if difference:
                problems.append(f"answer {number}'s body:\n{difference}")
    return "\n".join(problems) or None


def _body_difference(shown: str, got: str) -> str | None:
    try:
        expected = json_values(shown)
    except json.JSONDecodeError:
        return _text_difference(shown, got)
    try:
        actual = json_values(got)
    except json.JSONDecodeError:
        return f"shown JSON, got:\n{got}"
    return _json_difference(expected, actual)


def _text_difference(shown: str, got: str) -> str | None:
    """Text compared with its runs of white space as one space, times masked, `…` in the
    shown text matching anything."""
    shown_masked = " ".join(_TIME_IN_TEXT.sub(MASK, shown).split())
    got_masked = " ".join(_TIME_IN_TEXT.sub(MASK, got).split())
    pattern = ".*?".join(re.escape(part) for part in shown_masked.split("…"))
    if re.fullmatch(pattern, got_masked, re.DOTALL):
        return None
    return "\n".join(difflib.unified_diff(shown.strip().splitlines(), got.strip().splitlines(),
                                          "shown", "got", lineterm=""))


def difference(answer: Answer, output: str) -> str | None:
    """None when `output` is the answer shown; else what differs."""
    if answer.text.startswith("HTTP/"):
        return _http_difference(answer.text, output)
    if answer.info == "json":
        try:
            got = json_values(output)
        except json.JSONDecodeError:
            return f"shown JSON, got:\n{output}"
        return _json_difference(json_values(answer.text), got)
    return _text_difference(answer.text, output)


def all_documents() -> Iterator[Document]:
    for path in DOCUMENTS:
        yield read(path)


# -- writing the answers a run gave back into the document (a writer's tool) ----------------
#
# QUEUELOG_DOCS_UPDATE=1 pytest tests/test_doc_examples.py writes each answer that differs
# back into its document, keeping the shown value wherever the masked comparison calls the two
# equal (a time, a token). Read the diff before committing it: it is what the service says.

WIDTH = 95


def merged(shown: Any, got: Any) -> Any:
    """`got`, with `shown`'s values where the comparison does not tell them apart."""
    if isinstance(shown, dict) and isinstance(got, dict):
        return {key: merged(shown[key], value) if key in shown else value
                for key, value in got.items()}
    if isinstance(shown, list) and isinstance(got, list) and len(shown) == len(got):
        return [merged(old, new) for old, new in zip(shown, got, strict=True)]
    return shown if mask({"v": shown}) == mask({"v": got}) else got


def wrapped(value: Any) -> str:
    """JSON as the documents show it: compact, in lines of at most WIDTH characters broken
    after a comma outside strings and continued one space in; a list of objects (a page of
    jobs) one object to a line, each continued three spaces in."""
    if isinstance(value, dict):
        for key, member in value.items():
            if isinstance(member, list) and member and all(isinstance(item, dict)
                                                          for item in member):
                keys = list(value)
                before = {name: value[name] for name in keys[:keys.index(key)]}
                after = {name: value[name] for name in keys[keys.index(key) + 1:]}
                head = json.dumps(before, ensure_ascii=False)[:-1]
                head = f"{head}, " if before else "{"
                tail = ", " + json.dumps(after, ensure_ascii=False)[1:] if after else "}"
                items = ",\n".join(
                    _wrap(json.dumps(item, ensure_ascii=False), "  ", "   ")
                    for item in member)
                return f"{_wrap(f'{head}{json.dumps(key)}: [', '', ' ')}\n{items}]{tail}"
    return _wrap(json.dumps(value, ensure_ascii=False), "", " ")


def _wrap(text: str, first: str, rest: str) -> str:
    breaks, in_string, escaped = [], False, False
    for position, character in enumerate(text):
        if escaped:
            escaped = False
        elif character == "\\":
            escaped = True
        elif character == '"':
            in_string = not in_string
        elif character == "," and not in_string:
            breaks.append(position + 1)
    lines: list[str] = []
    start = last_break = 0
    for point in [*breaks, len(text)]:
        indent = rest if lines else first
        if point - start > WIDTH - len(indent) and last_break > start:
            lines.append(text[start:last_break].strip())
            start = last_break
        last_break = point
    lines.append(text[start:].strip())
    return "\n".join((rest if number else first) + line for number, line in enumerate(lines))


def _json_text(shown: list[Any], got: list[Any]) -> str:
    if len(shown) == len(got):
        got = [merged(old, new) for old, new in zip(shown, got, strict=True)]
    return "\n".join(wrapped(value) for value in got)


def rewritten(answer: Answer, output: str) -> str | None:
    """The answer's new text for `output`, or None when it cannot be written for it."""
    if answer.text.startswith("HTTP/"):
        shown, got = http_answers(answer.text), http_answers(output)
        if len(shown) != len(got):
            return None
        parts = []
        for old, new in zip(shown, got, strict=True):
            received = {name.lower(): value for name, value in new.headers}
            status = (old.status_line if old.status_line.split()[1:] ==
                      new.status_line.split()[1:] else new.status_line)
            head = [status] + [
                f"{name}: {value}" if name.lower() in MASKED_HEADERS
                else f"{name}: {received[name.lower()]}"
                for name, value in old.headers if name.lower() in received]
            body = new.body
            with_body = "\n".join(head)
            if body:
                with contextlib.suppress(json.JSONDecodeError):  # a text body stays as it is
                    body = _json_text(json_values(old.body) if old.body else [],
                                      json_values(body))
                with_body += "\n\n" + body
            parts.append(with_body)
        return "\n\n".join(parts) + "\n"
    if answer.info == "json":
        return _json_text(json_values(answer.text), json_values(output)) + "\n"
    if "…" in answer.text:
        return None
    return output.rstrip("\n") + "\n"


def write_answers(path: Path, answers: dict[int, str]) -> None:
    """Replace the code blocks opening at the given lines (1-based) with the given texts."""
    lines = path.read_text(encoding="utf-8").split("\n")
    for line in sorted(answers, reverse=True):
        opening = line - 1
        fence = lines[opening][:3]
        closing = next(number for number in range(opening + 1, len(lines))
                       if lines[number].strip() == fence)
        lines[opening + 1:closing] = answers[line].rstrip("\n").split("\n")
    path.write_text("\n".join(lines), encoding="utf-8")
