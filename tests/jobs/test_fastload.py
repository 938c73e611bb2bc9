"""POST /jobs/batch's fast load (app/jobs/web/fastload.py) gives exactly what the schema gives:
the same jobs for a body that loads, the same problem for one that does not, whatever the
fields hold. Hypothesis draws jobs mixing plain values, values just past each limit, values
of the wrong JSON type, and the fields the fast path leaves to the schema."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from marshmallow import ValidationError

from app.jobs.web.fastload import load_batch
from app.jobs.web.requests import BatchEnqueueSchema

_ANY_JSON = st.one_of(st.none(), st.booleans(), st.integers(-5, 2**40), st.floats(-1, 30),
                      st.text(max_size=5), st.lists(st.integers(), max_size=2),
                      st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
_TEXT = st.one_of(st.text(min_size=0, max_size=3), st.text(min_size=99, max_size=101),
                  st.text(alphabet=st.characters(min_codepoint=0x1f, max_codepoint=0x80),
                          min_size=1, max_size=4),
                  st.just("x" * 255), st.just("x" * 256))
_FIELDS = {
    "type": st.one_of(st.just("email"), _TEXT, _ANY_JSON),
    "payload": st.one_of(st.dictionaries(st.text(max_size=3), _ANY_JSON, max_size=3),
                         _ANY_JSON),
    "priority": st.one_of(st.sampled_from(["low", "medium", "HIGH", " Medium ", "urgent", ""]),
                          _ANY_JSON),
    "max_retries": st.one_of(st.integers(-1, 26), st.just(True), _ANY_JSON),
    "delay_seconds": st.one_of(st.integers(-1, 31_536_001), st.just(31_536_001), _ANY_JSON),
    "idempotency_key": st.one_of(_TEXT, _ANY_JSON),
    "concurrency_key": st.one_of(_TEXT, _ANY_JSON),
    "run_at": st.one_of(st.none(), st.just("2026-01-01T00:00:00Z"), _ANY_JSON),
    "unique": st.one_of(st.none(), st.just({}), st.just({"key": "k"}), _ANY_JSON),
    "tags": st.one_of(st.lists(st.one_of(st.sampled_from(["a", "b", "x" * 64, "x" * 65, ""]),
                                         _TEXT, _ANY_JSON), max_size=12),
                      _ANY_JSON),
    "unknown": _ANY_JSON,
}
_OFTEN_ABSENT = {"unknown", "run_at", "unique"}


@st.composite
def _jobs(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 30)) == 0:
        return draw(_ANY_JSON)  # not even an object
    job = {}
    for name, values in _FIELDS.items():
        # type is nearly always there; the others now and then, some seldom.
        present = (draw(st.integers(0, 20)) != 0 if name == "type"
                   else draw(st.integers(0, 8 if name in _OFTEN_ABSENT else 2)) == 0)
        if present:
            job[name] = draw(values)
    return job


def _outcome(load: Any, body: dict[str, Any]) -> tuple[str, Any]:
    try:
        return "loaded", load(body)
    except ValidationError as error:
        return "refused", error.messages


@settings(max_examples=400, deadline=None)
@given(st.lists(_jobs(), min_size=0, max_size=4),
       st.sampled_from([None, "jobs", "other"]))
def test_a_body_loads_or_fails_as_through_the_schema(jobs: list[Any], shape: str | None
                                                     ) -> None:
    body: dict[str, Any] = {} if shape is None else {"jobs": jobs}
    if shape == "other":
        body["other"] = 1
    assert _outcome(load_batch, body) == _outcome(BatchEnqueueSchema().load, body)


@settings(max_examples=50, deadline=None)
@given(st.lists(_jobs(), min_size=1, max_size=2))
def test_a_batch_past_the_limit_fails_as_through_the_schema(jobs: list[Any]) -> None:
    body = {"jobs": jobs * 1001}
    assert _outcome(load_batch, body) == _outcome(BatchEnqueueSchema().load, body)


def test_plain_jobs_take_the_fast_path_and_load_as_the_schema_loads_them() -> None:
    body = {"jobs": [{"type": "email", "payload": {"to": "a"}, "priority": "High",
                      "max_retries": 5, "delay_seconds": 30, "idempotency_key": "k-1",
                      "concurrency_key": "c", "run_at": None, "unique": None},
                     {"type": "report"}]}
    loaded = load_batch(body)
    assert loaded == BatchEnqueueSchema().load(body)
    # A copy, as the schema's Dict field makes: the service may not change the request.
    assert loaded["jobs"][0]["payload"] is not body["jobs"][0]["payload"]
