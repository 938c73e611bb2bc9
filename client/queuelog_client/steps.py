"""Durable steps and waits for handlers the Worker runs (docs/CLIENT.md, "Durable steps and
waits"), and the body of a suspend.

A handler that waits (a sleep, an event, a token) holds neither its worker nor a lease
meanwhile: the wait suspends the job (POST /jobs/{id}/suspend) and ends this run of the
handler. Once the job resumes it is claimed again and the handler runs again from the top.
So that what it did before the wait is not done twice, its side effects go in steps: a
step's result is saved in the job's checkpoint before the handler goes on, and a later run
gets the saved result back instead of running the step again. A wait reached again returns
what resumed it (the event's or the token's data), or raises WaitTimedOut.

The memo lives in the job's checkpoint under one reserved key, MEMO_KEY, beside whatever the
handler saves there itself (the handler never sees the key in `job["checkpoint"]`):

    {"steps": {name: result},
     "waits": {"0": {"by": "event", "data": {...}, "what": "event 'order.paid' key '1001'"}},
     "waiting": 1, "what": "sleep"}

Waits are numbered in the order a run reaches them. A suspend's checkpoint records the
number of the wait it suspends at ("waiting") and what that wait is. A claim that carries
"resumed" (every claim after a resume carries it, until the job suspends again, a crash's
next claim too) stores it as that wait's outcome: set, not appended, so taking the same
"resumed" twice changes nothing. A wait whose recorded "what" differs from the one the
handler reaches now (the handler changed while the job slept) is refused rather than handed
another wait's data.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from queuelog_client.errors import QueuelogError

__all__ = ["MEMO_KEY", "DurableSteps", "StepMemo", "SuspendJob", "WaitTimedOut", "suspend_body"]

# The checkpoint's key the memo is kept under; a handler's own checkpoint may not use it.
MEMO_KEY = "_queuelog"

T = TypeVar("T")
OnToken = Callable[[str, str], object]


class WaitTimedOut(QueuelogError):
    """Raised by job.wait_for_event() or job.wait_for_token() when the wait ended by its
    timeout rather than by the event or the token. Caught, the handler goes on (the wait
    stays timed out on every later run); uncaught, it fails the attempt like any exception,
    and a retry meets it again at the same wait."""

    def __init__(self, what: str, number: int) -> None:
        super().__init__(f"wait {number} ({what}) timed out")
        self.what = what
        self.number = number


@dataclass(frozen=True)
class Wait:
    """One wait a handler reached: how the suspend asks for it (Client.suspend's keyword
    arguments), what it is (compared on replay), and for a token who receives it."""

    what: str
    suspend: dict[str, Any]
    on_token: OnToken | None = None


class SuspendJob(BaseException):
    """Internal: a wait that must suspend the job ends the handler's run with this. The
    runner catches it and reports `client.suspend(job_id, lease_token, **wait.suspend,
    checkpoint=checkpoint)`, then calls `wait.on_token` with the answer's waitpoint.

    A BaseException, so that a handler's `except Exception` around a wait does not swallow
    it. A ClaimedJob used without the runner raises it to its caller, who reports it so."""

    def __init__(self, wait: Wait, checkpoint: dict[str, Any]) -> None:
        super().__init__(f"suspending at {wait.what}")
        self.wait = wait
        self.checkpoint = checkpoint


class StepMemo:
    """One run's view of the memo: the steps and waits earlier runs recorded, the handler's
    own checkpoint beside them, and the names and waits this run has reached."""

    def __init__(self, checkpoint: object, resumed: object = None) -> None:
        self.own_checkpoint, memo = split_checkpoint(checkpoint)
        steps, waits = memo.get("steps"), memo.get("waits")
        self._steps: dict[str, Any] = dict(steps) if isinstance(steps, Mapping) else {}
        self._waits: dict[str, Any] = (
            {str(n): dict(o) for n, o in waits.items() if isinstance(o, Mapping)}
            if isinstance(waits, Mapping) else {})
        waiting = memo.get("waiting")
        self._waiting = waiting if isinstance(waiting, int) else None
        what = memo.get("what")
        self._waiting_what = what if isinstance(what, str) else None
        if self._waiting is not None and isinstance(resumed, Mapping):
            self._waits[str(self._waiting)] = {"by": resumed.get("by"),
                                               "data": resumed.get("data"),
                                               "what": self._waiting_what}
        self._ran: set[str] = set()  # this run's step names
        self._reached = 0  # this run's waits so far
        self._in_step = False

    @property
    def used(self) -> bool:
        """Whether there is a memo to keep (a step or a wait, of this run or an earlier)."""
        return bool(self._steps or self._waits or self._waiting is not None)

    def memo(self) -> dict[str, Any]:
        return {"steps": self._steps, "waits": self._waits, "waiting": self._waiting,
                "what": self._waiting_what}

    def body(self) -> dict[str, Any]:
        """The checkpoint to save now: the handler's own state with the memo beside it."""
        return {**(self.own_checkpoint or {}), MEMO_KEY: copy.deepcopy(self.memo())}

    def with_state(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """The handler saves `state` as its own checkpoint: what to send (the memo kept
        beside it once there is one, so that neither erases the other)."""
        if MEMO_KEY in state:
            raise ValueError(f"the checkpoint key {MEMO_KEY!r} is reserved for durable steps")
        self.own_checkpoint = dict(state)
        return self.body() if self.used else dict(state)

    def step(self, name: str, fn: Callable[[], T], save: Callable[[], None]) -> T:
        """fn()'s result, from the memo when an earlier run saved it; else fn() is called
        and its result saved (save()) before it is returned."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a step's name must be a non-empty string, not {name!r}")
        if name in self._ran:
            raise ValueError(f"step {name!r} ran already in this run: a step's name must "
                             "be unique within the handler")
        self._ran.add(name)
        if name in self._steps:
            remembered: T = copy.deepcopy(self._steps[name])
            return remembered
        self._in_step = True
        try:
            result = fn()
        finally:
            self._in_step = False
        self._steps[name] = json_copy(result, f"step {name!r}'s result")
        try:
            save()
        except BaseException:
            del self._steps[name]  # not durable: a later save must not claim it is
            raise
        saved: T = copy.deepcopy(self._steps[name])
        return saved

    def wait(self, wait: Wait) -> Any:
        """The data that resumed this wait on an earlier run; SuspendJob when it has not
        been waited yet, WaitTimedOut when it timed out."""
        if self._in_step:
            raise RuntimeError(f"{wait.what}: a wait cannot run inside a step")
        number = self._reached
        self._reached += 1
        outcome = self._waits.get(str(number))
        if outcome is None:
            memo = copy.deepcopy(self.memo()) | {"waiting": number, "what": wait.what}
            raise SuspendJob(wait, {**(self.own_checkpoint or {}), MEMO_KEY: memo})
        recorded = outcome.get("what")
        if recorded is not None and recorded != wait.what:
            raise RuntimeError(f"wait {number} is {wait.what} now, but the job waited for "
                               f"{recorded}: the handler must reach its waits in the same "
                               "order on every run")
        if outcome.get("by") == "timeout":
            raise WaitTimedOut(wait.what, number)
        return copy.deepcopy(outcome.get("data"))


class DurableSteps:
    """The steps and waits of a job a handler receives (ClaimedJob's): see docs/CLIENT.md,
    "Durable steps and waits". Call them from the handler's own thread."""

    _memo: StepMemo

    def _save_memo(self) -> None:
        """Save the memo in the job's checkpoint, durably once this returns."""
        raise NotImplementedError

    def step(self, name: str, fn: Callable[[], T]) -> T:
        """Run fn() once across the job's runs and return its result. The first run calls
        it and saves the result in the job's checkpoint (a checkpoint saved now, so this
        may wait a second or two, as job.checkpoint() does) before returning it; every
        later run (after a wait's resume, after a failure) returns the saved result without
        calling fn. Only a crash between fn's return and the save runs it again.

        The result must be JSON (TypeError otherwise) and is returned as JSON gives it back
        (a tuple as a list), on the first run as on later ones. `name` must be unique
        within the handler (ValueError on a repeat in one run)."""
        return self._memo.step(name, fn, self._save_memo)

    def sleep(self, seconds: int) -> None:
        """Suspend the job for `seconds` (1 to a year): this run ends here, holding no
        worker, and once the time has come the handler runs again, and this returns."""
        self._memo.wait(Wait("sleep", {"seconds": seconds}))

    def wait_for_event(self, name: str, key: str = "", *,
                       timeout_seconds: int) -> dict[str, Any] | None:
        """Suspend the job until its producer posts event `name` with `key`
        (Client.post_event), or one posted earlier and kept matches; the event's data
        (None: none) once the handler runs again. WaitTimedOut when `timeout_seconds`
        (1 to a year) passed first."""
        data: dict[str, Any] | None = self._memo.wait(Wait(
            f"event {name!r} key {key!r}",
            {"event": name, "key": key, "timeout_seconds": timeout_seconds}))
        return data

    def wait_for_token(self, *, on_token: OnToken,
                       timeout_seconds: int) -> dict[str, Any] | None:
        """Suspend the job until someone completes its waitpoint (Client.complete_waitpoint,
        or POST to its url, with no key: the token is the authority); the data they sent
        (None: none) once the handler runs again. WaitTimedOut when `timeout_seconds` (1 to
        a year) passed first.

        The token exists only once the suspend is stored, after this run has ended: the
        runner then calls `on_token(token, url)` (url: the waitpoint's full URL on this
        server) from the job's thread, to hand it on (email a link, say). It is called
        once, after the suspend is durable; if it raises, the error is logged and the job
        stays suspended until the wait times out. So does a job whose suspend's answer was
        lost: the repeat is answered without the token (the server shows it once)."""
        data: dict[str, Any] | None = self._memo.wait(Wait(
            "token", {"token": True, "timeout_seconds": timeout_seconds}, on_token))
        return data


def split_checkpoint(checkpoint: object) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """A claim's checkpoint as (the handler's own part, the memo). The handler's part is
    the checkpoint as saved when it holds no memo, else the rest of it (None when nothing
    but the memo was saved)."""
    if not isinstance(checkpoint, Mapping):
        return None, {}
    if MEMO_KEY not in checkpoint:
        return dict(checkpoint), {}
    own = {name: value for name, value in checkpoint.items() if name != MEMO_KEY}
    memo = checkpoint[MEMO_KEY]
    return own or None, dict(memo) if isinstance(memo, Mapping) else {}


def json_copy(value: T, what: str) -> T:
    """`value` as JSON gives it back; TypeError, naming `what`, when it is not JSON."""
    try:
        copied: T = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be JSON: {exc}") from None
    return copied


def waitpoint_of(answer: Mapping[str, Any], base_url: str) -> tuple[str, str]:
    """The token of a suspend's answer and its waitpoint's full URL (the server's relative
    url under `base_url`, the client's); LookupError when the answer carries none."""
    waitpoint = answer.get("waitpoint")
    if not isinstance(waitpoint, Mapping) or not isinstance(waitpoint.get("token"), str):
        raise LookupError(f"the suspend's answer carries no waitpoint (status "
                          f"{answer.get('status')!r})")
    url = waitpoint.get("url")
    url = url if isinstance(url, str) else ""
    return waitpoint["token"], (base_url.rstrip("/") + url if url.startswith("/") else url)


def suspend_body(*, seconds: int | None = None, until: datetime | str | None = None,
                 event: str | None = None, key: str = "", token: bool = False,
                 timeout_seconds: int | None = None,
                 checkpoint: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A suspend's body beside its lease token: exactly one kind of wait (ValueError for
    none or several, and for a key or a timeout given to a wait that has none)."""
    kinds = [kind for kind, given in (("seconds", seconds is not None),
                                      ("until", until is not None),
                                      ("event", event is not None), ("token", token is True))
             if given]
    if len(kinds) != 1:
        raise ValueError("suspend waits for exactly one of seconds, until, event and token, "
                         f"not {' and '.join(kinds) or 'none'}")
    if key and event is None:
        raise ValueError("key is an event's: give event= with it")
    if timeout_seconds is not None and event is None and token is not True:
        raise ValueError("timeout_seconds bounds a wait for an event or a token; a sleep "
                         "ends at its time")
    body: dict[str, Any] = {}
    if seconds is not None:
        body["seconds"] = seconds
    elif until is not None:
        body["until"] = _rfc3339(until) if isinstance(until, datetime) else until
    else:
        wait_for: dict[str, Any] = ({"event": event, "key": key} if event is not None
                                    else {"token": True})
        if timeout_seconds is not None:
            wait_for["timeout_seconds"] = timeout_seconds
        body["wait_for"] = wait_for
    if checkpoint is not None:
        body["checkpoint"] = dict(checkpoint)
    return body


def _rfc3339(moment: datetime) -> str:
    # client.py's own, which this module cannot import (client.py imports it).
    if moment.tzinfo is None:
        raise ValueError("until must be timezone-aware (a naive datetime is ambiguous)")
    return moment.isoformat()
