"""The rules of durable steps and waits (queuelog_client/steps.py, docs/CLIENT.md "Durable
steps and waits"), with no server: a fake queue of one job stands in for it, keeping the
job's checkpoint and "resumed" as the server does, and the Worker's own reporting code runs
each handler against it.

What is checked: a step runs once across runs and its result is durable before the handler
goes on; a wait suspends the run with the memo in the suspend's checkpoint and, after the
resume, answers from it; the same "resumed" taken twice (a crash's next claim) changes
nothing; a timeout raises WaitTimedOut at the wait; the handler's own checkpoint is kept
apart from the memo."""

from __future__ import annotations

import contextlib
import copy
import logging
import math
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from queuelog_client import ClaimedJob, ValidationFailed, WaitTimedOut, Worker
from queuelog_client.steps import MEMO_KEY, SuspendJob, suspend_body
from queuelog_client.worker import _HeldJob

Handler = Callable[[ClaimedJob], Any]
URL = "http://queue.example:8000/queue"


class FakeQueue:
    """One job, as the server keeps it: its status, its checkpoint (a heartbeat's or a
    suspend's replaces it, a fail's none leaves it), and the "resumed" every claim carries
    from a resume until the next suspend. It records what the client sent."""

    url = URL

    def __init__(self, payload: dict[str, Any] | None = None) -> None:
        self.payload = payload or {"order": "1001"}
        self.status = "pending"
        self.checkpoint: dict[str, Any] | None = None
        self.resumed: dict[str, Any] | None = None
        self.saved: list[dict[str, Any]] = []  # every checkpoint a heartbeat carried
        self.suspends: list[dict[str, Any]] = []  # every suspend's body
        self.errors: list[str] = []
        self.result: dict[str, Any] | None = None
        self.refuse_suspend = False

    def claim_fields(self) -> dict[str, Any]:
        assert self.status == "pending", f"the job is {self.status}, not claimable"
        self.status = "running"
        fields = {"id": 7, "type": "order", "payload": self.payload, "lease_token": "lease",
                  "checkpoint": copy.deepcopy(self.checkpoint)}
        if self.resumed is not None:
            fields["resumed"] = copy.deepcopy(self.resumed)
        return fields

    def resume(self, by: str, data: dict[str, Any] | None = None) -> None:
        assert self.status == "suspended"
        self.status = "pending"
        self.resumed = {"by": by, "data": data, "at": "2026-12-06T07:47:06Z"}

    # -- the client methods the runner and ClaimedJob call ------------------------------

    def heartbeat(self, job_id: int, lease_token: str | None = None, *,
                  checkpoint: dict[str, Any] | None = None, **_: Any) -> dict[str, Any]:
        assert self.status == "running"
        if checkpoint is not None:
            self.checkpoint = copy.deepcopy(checkpoint)
            self.saved.append(copy.deepcopy(checkpoint))
        return {"id": job_id, "status": "running", "cancel_requested": False}

    def suspend(self, job_id: int, lease_token: str | None = None,
                **wait: Any) -> dict[str, Any]:
        body = suspend_body(**wait)  # what Client.suspend would send
        if self.refuse_suspend:
            raise ValidationFailed(422, "Unprocessable Entity", "invalid body",
                                   {"seconds": ["Must be at least 1."]})
        self.suspends.append(body)
        self.checkpoint = copy.deepcopy(body.get("checkpoint"))
        self.resumed = None
        self.status = "suspended"
        answer: dict[str, Any] = {"id": job_id, "status": "suspended"}
        if "token" in body.get("wait_for", {}):
            answer["waitpoint"] = {"token": "tok-1", "url": "/waitpoints/tok-1"}
        return answer

    def complete(self, job_id: int, lease_token: str | None = None, *,
                 result: dict[str, Any] | None = None, **_: Any) -> dict[str, Any]:
        self.status, self.result = "completed", result
        return {"id": job_id, "status": "completed"}

    def fail(self, job_id: int, lease_token: str | None = None, *, error: str,
             **_: Any) -> dict[str, Any]:
        self.status = "pending"
        self.errors.append(error)
        return {"id": job_id, "status": "pending"}


def run(queue: FakeQueue, handler: Handler) -> Worker:
    """Claim the job and run `handler` on it as the Worker's job thread does (heartbeats
    aside): it reports to `queue`. The worker, for its stats."""
    worker = Worker("http://queue.example:8000/queue", handler, token="unused",
                    heartbeat=False)
    worker.client = queue  # type: ignore[assignment]
    fields = queue.claim_fields()
    view = ClaimedJob(fields, queue, lease_seconds=60)  # type: ignore[arg-type]
    held = _HeldJob(job=fields, view=view, lease_token="lease", lease_seconds=60,
                    next_heartbeat=math.inf)
    worker._held[held.id] = held
    worker._run_job(held)
    return worker


def claimed(queue: FakeQueue) -> ClaimedJob:
    """The job as a handler receives it, claimed by hand."""
    return ClaimedJob(queue.claim_fields(), queue, lease_seconds=60)  # type: ignore[arg-type]


def order_handler(calls: list[str]) -> Handler:
    """Charge once, wait for the order's shipping, email once."""
    def handle(job: ClaimedJob) -> dict[str, Any]:
        calls.append("run")
        order = job["payload"]["order"]
        charge = job.step("charge", lambda: calls.append("charge") or {"charge_id": "ch_1"})
        shipped = job.wait_for_event("order.shipped", key=order, timeout_seconds=86_400)
        job.step("email", lambda: calls.append("email") or {"sent": True})
        return {"charge": charge, "shipped": shipped}
    return handle


def memo_of(checkpoint: dict[str, Any] | None) -> dict[str, Any]:
    assert checkpoint is not None
    memo: dict[str, Any] = checkpoint[MEMO_KEY]
    return memo


# -- steps and waits across runs ---------------------------------------------------------

def test_a_step_runs_once_across_a_suspend_and_the_events_data_reaches_the_handler():
    queue, calls = FakeQueue(), []
    handle = order_handler(calls)

    first = run(queue, handle)
    assert queue.status == "suspended" and first.stats["suspended"] == 1
    assert calls == ["run", "charge"]
    # The charge was saved before the handler went on, then carried by the suspend.
    assert memo_of(queue.saved[0])["steps"] == {"charge": {"charge_id": "ch_1"}}
    [body] = queue.suspends
    assert body["wait_for"] == {"event": "order.shipped", "key": "1001",
                                "timeout_seconds": 86_400}
    memo = memo_of(body["checkpoint"])
    assert memo["waiting"] == 0 and memo["what"] == "event 'order.shipped' key '1001'"
    assert memo["steps"] == {"charge": {"charge_id": "ch_1"}}

    queue.resume("event", {"tracking": "1Z999"})
    second = run(queue, handle)
    assert queue.status == "completed" and second.stats["completed"] == 1
    assert calls == ["run", "charge", "run", "email"]  # the charge is not run again
    assert queue.result == {"charge": {"charge_id": "ch_1"},
                            "shipped": {"tracking": "1Z999"}}


def test_the_same_resumed_taken_twice_after_a_crash_changes_nothing():
    queue, calls = FakeQueue(), []
    crash = [True]

    def handle(job: ClaimedJob) -> dict[str, Any]:
        result = order_handler(calls)(job)
        if crash[0]:
            crash[0] = False
            raise SystemExit("the worker's host went away")  # after the email was saved
        return result

    run(queue, handle)
    queue.resume("event", {"tracking": "1Z999"})
    run(queue, handle)
    assert queue.status == "pending" and len(queue.errors) == 1
    # The next claim carries the same "resumed" again: the wait's outcome is set, not added.
    assert queue.resumed is not None
    assert memo_of(queue.checkpoint)["waits"] == {
        "0": {"by": "event", "data": {"tracking": "1Z999"},
              "what": "event 'order.shipped' key '1001'"}}
    run(queue, handle)
    assert queue.status == "completed"
    assert calls.count("charge") == 1 and calls.count("email") == 1
    assert queue.result == {"charge": {"charge_id": "ch_1"},
                            "shipped": {"tracking": "1Z999"}}


def test_waits_are_numbered_in_the_order_reached_and_a_sleep_returns_none():
    queue, seen = FakeQueue(), []

    def handle(job: ClaimedJob) -> dict[str, Any]:
        seen.append(job.sleep(60))
        approval = job.wait_for_token(on_token=lambda token, url: None, timeout_seconds=600)
        paid = job.wait_for_event("order.paid", timeout_seconds=600)
        return {"approval": approval, "paid": paid}

    run(queue, handle)
    assert queue.suspends[-1]["seconds"] == 60
    queue.resume("time")
    run(queue, handle)
    assert queue.suspends[-1]["wait_for"] == {"token": True, "timeout_seconds": 600}
    assert memo_of(queue.checkpoint)["waiting"] == 1
    queue.resume("token", {"approved": True})
    run(queue, handle)
    assert queue.suspends[-1]["wait_for"]["key"] == ""
    assert memo_of(queue.checkpoint)["waiting"] == 2
    queue.resume("event", {"amount": 12})
    run(queue, handle)
    assert queue.result == {"approval": {"approved": True}, "paid": {"amount": 12}}
    assert seen == [None, None, None]  # the sleep returned on each run after its resume
    # Stored: the waits a later suspend saved, and the last one the claim's "resumed" gives.
    stored = memo_of(queue.checkpoint)
    assert sorted(stored["waits"]) == ["0", "1"] and stored["waiting"] == 2


def test_a_wait_ended_by_its_timeout_raises_wait_timed_out_where_the_handler_waits():
    queue, calls = FakeQueue(), []

    def handle(job: ClaimedJob) -> dict[str, Any]:
        job.step("charge", lambda: calls.append("charge"))
        try:
            job.wait_for_event("order.shipped", key="1001", timeout_seconds=1)
        except WaitTimedOut as timed_out:
            job.step("refund", lambda: calls.append("refund"))
            return {"timed_out": timed_out.what}
        return {"timed_out": None}

    run(queue, handle)
    queue.resume("timeout")
    run(queue, handle)
    assert queue.result == {"timed_out": "event 'order.shipped' key '1001'"}
    assert calls == ["charge", "refund"]


def test_an_uncaught_timeout_fails_the_attempt_naming_it():
    queue = FakeQueue()

    def handle(job: ClaimedJob) -> None:
        job.wait_for_token(on_token=lambda token, url: None, timeout_seconds=5)

    run(queue, handle)
    queue.resume("timeout")
    run(queue, handle)
    assert queue.errors == ["WaitTimedOut: wait 0 (token) timed out"]


def test_a_wait_reached_in_another_order_than_the_job_waited_is_refused():
    queue = FakeQueue()
    run(queue, lambda job: job.wait_for_event("order.paid", timeout_seconds=60))
    queue.resume("event", {"amount": 12})
    # Redeployed meanwhile: the handler now sleeps first.
    run(queue, lambda job: job.sleep(5))
    assert queue.status == "pending" and len(queue.errors) == 1
    assert queue.errors[0].startswith("RuntimeError: wait 0 is sleep now, but the job "
                                      "waited for event 'order.paid' key ''")


# -- steps ---------------------------------------------------------------------------------

def test_a_steps_result_comes_back_as_json_gives_it_on_every_run():
    queue = FakeQueue()
    job = claimed(queue)
    assert job.step("pair", lambda: (1, "a")) == [1, "a"]
    again = ClaimedJob({"id": 7, "payload": {}, "checkpoint": queue.checkpoint},
                       queue)  # type: ignore[arg-type]
    assert again.step("pair", lambda: pytest.fail("run again")) == [1, "a"]
    # A copy: changing what a step returned does not change the memo.
    again.step("list", lambda: [1]).append(2)
    assert memo_of(queue.checkpoint)["steps"]["list"] == [1]


@pytest.mark.parametrize("value", [datetime.now(UTC), {1, 2}, float("nan")],
                         ids=["datetime", "set", "nan"])
def test_a_step_whose_result_is_not_json_raises_type_error_and_saves_nothing(value):
    queue = FakeQueue()
    with pytest.raises(TypeError, match="step 'bad''s result must be JSON"):
        claimed(queue).step("bad", lambda: value)
    assert queue.saved == []


def test_a_step_name_repeated_in_one_run_is_refused_before_its_function_runs():
    job = claimed(FakeQueue())
    job.step("charge", lambda: 1)
    with pytest.raises(ValueError, match="step 'charge' ran already in this run"):
        job.step("charge", lambda: pytest.fail("run twice"))
    with pytest.raises(ValueError, match="non-empty string"):
        job.step("", lambda: 1)


def test_a_step_that_raises_is_not_memoized_and_runs_again_next_time():
    queue, calls = FakeQueue(), []

    def flaky() -> int:
        calls.append("try")
        if len(calls) == 1:
            raise ConnectionError("card network down")
        return 42

    run(queue, lambda job: {"n": job.step("charge", flaky)})
    assert queue.errors == ["ConnectionError: card network down"] and queue.saved == []
    run(queue, lambda job: {"n": job.step("charge", flaky)})
    assert queue.result == {"n": 42} and calls == ["try", "try"]


def test_a_step_whose_save_fails_is_not_kept_as_done():
    queue = FakeQueue()
    job = claimed(queue)

    def refuse(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise ValidationFailed(422, "Unprocessable Entity", "too large",
                               {"checkpoint": ["Too large."]})

    queue.heartbeat = refuse  # type: ignore[method-assign]
    with pytest.raises(ValidationFailed):
        job.step("big", lambda: "x")
    assert not job._memo.used


def test_a_wait_inside_a_step_is_refused():
    job = claimed(FakeQueue())
    with pytest.raises(RuntimeError, match="a wait cannot run inside a step"):
        job.step("nested", lambda: job.sleep(1))


# -- the handler's own checkpoint -------------------------------------------------------------

def test_the_handlers_own_checkpoint_is_kept_apart_from_the_memo():
    queue = FakeQueue()

    def handle(job: ClaimedJob) -> dict[str, Any]:
        start = (job["checkpoint"] or {}).get("row", 0)
        job.checkpoint({"row": start + 10})
        job.step("charge", lambda: "ch_1")
        job.sleep(1)
        return {"from": job["checkpoint"]}

    run(queue, handle)
    assert queue.checkpoint is not None
    assert {name: value for name, value in queue.checkpoint.items() if name != MEMO_KEY} == {
        "row": 10}  # the step's save kept the handler's state; so did the suspend
    queue.resume("time")
    run(queue, handle)
    assert queue.result == {"from": {"row": 10}}  # the handler never sees the memo
    assert memo_of(queue.checkpoint)["steps"] == {"charge": "ch_1"}


def test_a_handler_that_uses_no_steps_saves_its_checkpoint_as_before():
    queue = FakeQueue()
    job = claimed(queue)
    assert job["checkpoint"] is None
    job.checkpoint({"next_row": 420})
    assert queue.saved == [{"next_row": 420}]
    assert ClaimedJob({"id": 7, "checkpoint": {}}, queue)["checkpoint"] == {}  # type: ignore[arg-type]


def test_a_checkpoint_holding_only_the_memo_is_none_to_the_handler():
    queue = FakeQueue()
    claimed(queue).step("charge", lambda: 1)
    assert ClaimedJob({"id": 7, "checkpoint": queue.checkpoint},
                      queue)["checkpoint"] is None  # type: ignore[arg-type]


def test_the_memos_key_is_refused_in_the_handlers_checkpoint():
    with pytest.raises(ValueError, match=f"{MEMO_KEY!r} is reserved"):
        claimed(FakeQueue()).checkpoint({MEMO_KEY: {}})


# -- the runner's report of a suspend --------------------------------------------------------

def test_a_handler_catching_exception_around_a_wait_does_not_swallow_the_suspend():
    queue = FakeQueue()

    def handle(job: ClaimedJob) -> dict[str, Any]:
        try:
            job.sleep(5)
        except Exception:
            return {"swallowed": True}
        return {"slept": True}

    run(queue, handle)
    assert queue.status == "suspended" and queue.result is None
    assert issubclass(SuspendJob, BaseException) and not issubclass(SuspendJob, Exception)


def test_a_suspend_is_no_error_of_the_runs_span(monkeypatch):
    through: list[BaseException | None] = []

    @contextlib.contextmanager
    def recording_span(job: Any) -> Iterator[None]:
        try:
            yield
        except BaseException as exc:
            through.append(exc)
            raise
        through.append(None)

    monkeypatch.setattr("queuelog_client.worker.run_span", recording_span)
    queue = FakeQueue()
    run(queue, lambda job: job.sleep(5))
    assert queue.status == "suspended" and through == [None]


def test_on_token_gets_the_token_and_its_full_url_after_the_suspend_is_stored():
    queue, handed = FakeQueue(), []

    def handle(job: ClaimedJob) -> dict[str, Any] | None:
        return job.wait_for_token(
            on_token=lambda token, url: handed.append((token, url, queue.status)),
            timeout_seconds=3600)

    run(queue, handle)
    assert handed == [("tok-1", f"{URL}/waitpoints/tok-1", "suspended")]
    queue.resume("token", {"approved": True})
    run(queue, handle)
    assert queue.result == {"approved": True} and len(handed) == 1  # not called again


def test_on_token_raising_is_logged_and_the_job_stays_suspended(caplog):
    caplog.set_level(logging.INFO, logger="queuelog_client.worker")
    queue = FakeQueue()

    def mail_is_down(token: str, url: str) -> None:
        raise OSError("smtp refused")

    worker = run(queue, lambda job: job.wait_for_token(on_token=mail_is_down,
                                                        timeout_seconds=60))
    assert queue.status == "suspended" and worker.stats["suspended"] == 1
    assert "job 7: on_token failed; the job stays suspended until its wait times out" in (
        caplog.text)
    assert "OSError: smtp refused" in caplog.text


def test_a_suspend_the_server_refuses_fails_the_attempt_naming_the_field():
    queue = FakeQueue()
    queue.refuse_suspend = True
    worker = run(queue, lambda job: job.sleep(0))
    assert queue.status == "pending" and worker.stats["failed"] == 1
    assert queue.errors == ["suspend refused: invalid body {'seconds': ['Must be at least "
                            "1.']}"]


def test_a_job_by_hand_raises_the_suspend_to_its_caller_with_what_to_send():
    queue = FakeQueue()
    job = claimed(queue)
    job.step("charge", lambda: 1)
    with pytest.raises(SuspendJob) as pause:
        job.wait_for_event("order.paid", key="1001", timeout_seconds=60)
    assert pause.value.wait.suspend == {"event": "order.paid", "key": "1001",
                                        "timeout_seconds": 60}
    assert memo_of(pause.value.checkpoint)["waiting"] == 0


# -- the suspend's body ----------------------------------------------------------------------

def test_a_suspend_waits_for_exactly_one_thing():
    with pytest.raises(ValueError, match=r"exactly one of .* not none"):
        suspend_body()
    with pytest.raises(ValueError, match="not seconds and event"):
        suspend_body(seconds=5, event="order.paid")
    with pytest.raises(ValueError, match="key is an event's"):
        suspend_body(token=True, key="1001")
    with pytest.raises(ValueError, match="a sleep ends at its time"):
        suspend_body(seconds=5, timeout_seconds=60)


def test_a_suspends_body_is_what_the_server_takes():
    moment = datetime(2027, 1, 1, 9, 0, tzinfo=UTC)
    assert suspend_body(seconds=3600) == {"seconds": 3600}
    assert suspend_body(until=moment) == {"until": "2027-01-01T09:00:00+00:00"}
    assert suspend_body(until="2027-01-01T09:00:00Z") == {"until": "2027-01-01T09:00:00Z"}
    assert suspend_body(event="order.paid", key="1001", timeout_seconds=86_400,
                        checkpoint={"row": 1}) == {
        "wait_for": {"event": "order.paid", "key": "1001", "timeout_seconds": 86_400},
        "checkpoint": {"row": 1}}
    assert suspend_body(token=True) == {"wait_for": {"token": True}}
    with pytest.raises(ValueError, match="until must be timezone-aware"):
        suspend_body(until=datetime(2027, 1, 1, 9, 0))


def test_wait_timed_out_is_exported_and_a_queuelog_error():
    from queuelog_client import QueuelogError
    assert issubclass(WaitTimedOut, QueuelogError)
