"""GET /types shows a push type's adaptive concurrency (docs/PUSH.md, "Adaptive concurrency")
from the push_origins row the dispatcher writes for its url's origin (both engines)."""

from __future__ import annotations

from typing import Any

from app.core.clock import to_rfc3339
from app.types.origin_repository import ORIGIN_CHARS, OriginFigure, OriginRepository
from tests.types.test_push_settings import patch

ORIGIN = "https://hooks.example.com:443"


def write(app: Any, *figures: OriginFigure) -> None:
    services = app.extensions["queuelog"]
    with services.types.db.write() as conn:
        OriginRepository(conn).save(figures, services.clock.now_us())


def shown(client: Any, admin: Any, job_type: str = "email") -> Any:
    return client.get(f"/types/{job_type}", headers=admin.headers).json["push"]["concurrency"]


def test_a_push_types_origin_figure_is_shown_once_written_and_replaced_by_the_next(
        app, client, admin):
    patch(client, admin, "email", push={"url": "https://u:pw@Hooks.example.com/a?sig=1"})
    patch(client, admin, "pdf", push={"url": "http://10.0.0.9:8080/pdf"})
    assert shown(client, admin) is None

    held = app.extensions["queuelog"].clock.now_us() + 5_000_000
    write(app, OriginFigure(ORIGIN, 2, 8, held), OriginFigure("http://10.0.0.1:80", 1, 4))
    expected = {"origin": ORIGIN, "current": 2, "cap": 8, "held_until": to_rfc3339(held)}
    assert shown(client, admin) == expected
    listed = client.get("/types", headers=admin.headers).json["types"]
    by_type = {t["type"]: t["push"] for t in listed}
    assert by_type["email"]["concurrency"] == expected
    assert by_type["pdf"]["concurrency"] is None  # its origin has no row
    assert by_type["sync"] is None  # a pulled type

    write(app, OriginFigure(ORIGIN, 3, 8, None))
    assert shown(client, admin) == {"origin": ORIGIN, "current": 3, "cap": 8,
                                    "held_until": None}


def test_an_origin_longer_than_its_column_is_not_stored(app):
    write(app, OriginFigure("http://" + "h" * ORIGIN_CHARS + ":80", 1, 1))
    services = app.extensions["queuelog"]
    with services.types.db.read() as conn:
        assert OriginRepository(conn).figures_of(["http://" + "h" * ORIGIN_CHARS + ":80"]) == {}
        assert OriginRepository(conn).figures_of([]) == {}
