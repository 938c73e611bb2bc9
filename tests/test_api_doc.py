"""docs/API.md stays complete: every route of the app has its section there, with a curl
example and the response it gives. The dashboard's HTML pages under /ui/ are deliberately left
out (app.web.openapi.api_rules): they are no JSON API route; docs/DASHBOARD.md and docs/API.md's
opening say so."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from flask import Flask

from app import create_app
from app.web.openapi import api_rules

API_DOC = Path(__file__).resolve().parent.parent / "docs" / "API.md"
_IMPLICIT_METHODS = {"HEAD", "OPTIONS"}


def _placeholders_blank(path: str) -> str:
    """`/jobs/<int:job_id>` and `/jobs/{id}` both as `/jobs/{}`."""
    return re.sub(r"<[^>]*>|\{[^}]*\}", "{}", path)


def _sections() -> dict[str, str]:
    """Each `### METHOD /path` heading of the document, and the text under it."""
    parts = re.split(r"^### ", API_DOC.read_text(encoding="utf-8"), flags=re.MULTILINE)
    sections = {}
    for part in parts[1:]:
        heading, _, body = part.partition("\n")
        method, _, path = heading.strip().partition(" ")
        sections[f"{method} {_placeholders_blank(path)}"] = body
    return sections


def _routes(app: Flask) -> set[str]:
    return {f"{method} {_placeholders_blank(rule.rule)}"
            for rule in api_rules(app)
            for method in (rule.methods or set()) - _IMPLICIT_METHODS}


@pytest.fixture
def app(tmp_path: Path) -> Flask:
    """The app's URL map is all these tests read; no database is touched."""
    return create_app({"DATABASE_URL": f"sqlite:///{tmp_path / 'q.sqlite3'}",
                       "JOB_TYPES": "email"})


def test_every_route_of_the_app_has_a_section_in_docs_api_md(app: Flask) -> None:
    missing = _routes(app) - set(_sections())
    assert not missing, f"docs/API.md has no section for {sorted(missing)}"


def test_every_section_shows_a_curl_example_and_its_response(app: Flask) -> None:
    sections = _sections()
    for route in _routes(app):
        body = sections[route]
        assert "curl " in body, f"{route}: no curl example"
        assert body.count("```") >= 4, f"{route}: no response shown after its example"


def test_the_readme_points_to_the_api_reference() -> None:
    readme = (API_DOC.parent.parent / "README.md").read_text(encoding="utf-8")
    assert "docs/API.md" in readme
    assert "/openapi.json" in readme
    assert "contract" not in readme.lower()


def test_the_readmes_walk_through_says_its_ids_assume_a_fresh_database() -> None:
    readme = (API_DOC.parent.parent / "README.md").read_text(encoding="utf-8")
    walk_through = readme.split("## A walk through with curl", 1)[1].split("\n## ", 1)[0]
    assert "fresh database" in walk_through
    assert "fresh database" in API_DOC.read_text(encoding="utf-8")
