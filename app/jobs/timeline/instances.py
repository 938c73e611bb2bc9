"""Each worker key's instances as this process notes them: the labels its workers send with
their claims and heartbeats (host and pid, or one their operator sets; docs/API.md, GET
/workers), counted in memory and written beside a request at most once a minute per key,
label and process, never once per request.

A label is shown as reported and trusted for nothing: which worker holds a job is its key's
name (worker_id) and the lease token, whatever label came with the claim or the heartbeat.

What a note writes (InstanceNote), with the rest of the request's work: the instance seen
now, its last claim, and the jobs this process counted it claiming in a whole minute that
has ended (`minute`), each minute's count written by the process's first note of the
instance in a later minute. The first note of an instance in this process writes when it
was seen alone, so that a new instance shows at once. The table sums what every process
counted of one minute and keeps the latest minute's count
(app/jobs/timeline/instance_repository.py).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from app.jobs.timeline.stats_repository import MINUTE_US, minute_of

# At most this many labels of one key are counted in a process at once: a key whose workers
# send a new label with every request writes once per new label up to this many, and then
# notes only the labels it knows, until some of those have been idle IDLE_MINUTES (their
# counts, long past, are forgotten with them).
MAX_INSTANCES_PER_KEY = 100
IDLE_MINUTES = 10


@dataclass(frozen=True, slots=True)
class InstanceNote:
    """One write of worker_instances: key `name`'s instance `instance` seen at `seen_at`, its
    last claim (None: none noted since the last write), and `claimed`, the jobs this process
    counted it claiming in `minute` (a minute's first microsecond; None: no whole minute
    counted yet)."""

    name: str
    instance: str
    seen_at: int
    last_claim_at: int | None
    minute: int | None
    claimed: int


@dataclass(slots=True)
class _Tally:
    minute: int  # the minute counted, its first microsecond
    claimed: int  # the jobs claimed in it
    last_claim_at: int | None  # the last claim noted since the last write


class InstanceTallies:
    """The instances this process has noted, by key and label (thread-safe)."""

    def __init__(self) -> None:
        self._tallies: dict[str, dict[str, _Tally]] = {}
        self._lock = threading.Lock()

    def note(self, name: str, instance: str, now_us: int, *,
             claimed: int | None) -> InstanceNote | None:
        """Note that key `name`'s instance `instance` claimed (`claimed`: the jobs its claim
        took, 0 included) or heartbeat (None) at `now_us`; what to write now, if anything:
        at its first note in this process, and at its first in each later minute."""
        minute = minute_of(now_us)
        claim_at = None if claimed is None else now_us
        with self._lock:
            of_key = self._tallies.setdefault(name, {})
            tally = of_key.get(instance)
            if tally is None:
                if len(of_key) >= MAX_INSTANCES_PER_KEY:
                    self._forget_idle(of_key, minute)
                    if len(of_key) >= MAX_INSTANCES_PER_KEY:
                        return None
                of_key[instance] = _Tally(minute, claimed or 0, None)
                return InstanceNote(name, instance, now_us, claim_at, None, 0)
            if tally.minute == minute:
                tally.claimed += claimed or 0
                if claim_at is not None:
                    tally.last_claim_at = claim_at
                return None
            of_key[instance] = _Tally(minute, claimed or 0, None)
        return InstanceNote(name, instance, now_us,
                            claim_at if claim_at is not None else tally.last_claim_at,
                            tally.minute, tally.claimed)

    @staticmethod
    def _forget_idle(of_key: dict[str, _Tally], minute: int) -> None:
        idle_before = minute - IDLE_MINUTES * MINUTE_US
        for instance in [label for label, tally in of_key.items()
                         if tally.minute <= idle_before]:
            del of_key[instance]


def claimed_last_minute(minute: int | None, claimed: int, now_us: int) -> int:
    """The jobs an instance claimed in the latest whole minute counted, as its row says
    (`minute`, `claimed`): when that minute is one of the two before now's (the processes
    write a minute's counts in the next one); 0 otherwise."""
    if minute is None:
        return 0
    before = minute_of(now_us) - minute
    return claimed if MINUTE_US <= before <= 2 * MINUTE_US else 0
