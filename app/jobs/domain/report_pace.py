"""How often a worker's heartbeats and checkpoints are taken: the one home of that rule
(docs/JOBS.md, "Heartbeat pace").

A heartbeat writes its job's row (and a checkpoint its job_checkpoints row); a worker that
beats in a tight loop, or from many threads at once, would fill the database's write path for
everyone else. So:
- a job's heartbeat is taken once a second at most: one sent sooner after the previous
  heartbeat of its attempt is refused (429, Retry-After) and writes nothing. A lease shorter
  than two seconds is kept alive all the same: a heartbeat is taken once half the lease the
  previous one granted has passed, if that comes sooner. The first heartbeat after a claim is
  always taken.
- a checkpoint is saved once a second at most per job: a heartbeat carrying one sent sooner
  after the last checkpoint saved is refused whole in the same way (its lease is not
  extended either), so a checkpoint the server acknowledged is always stored, and one it
  refused is the worker's to send again. A fail's checkpoint is always saved: it ends the
  attempt.

Both are decided inside the statement the heartbeat runs anyway (the UPDATE of the job's row,
the checkpoint's upsert), from the times those rows hold: every gunicorn process and every
host on one database applies the same rule, and a heartbeat taken costs no statement more.
"""

from __future__ import annotations

import math

from app.core.clock import MICROS
from app.core.errors import TooManyRequests

HEARTBEAT_SPACING_SECONDS = 1
CHECKPOINT_SPACING_SECONDS = 1
HEARTBEAT_SPACING_US = HEARTBEAT_SPACING_SECONDS * MICROS
CHECKPOINT_SPACING_US = CHECKPOINT_SPACING_SECONDS * MICROS


def next_heartbeat_at(last_beat_us: int, lease_expires_at_us: int) -> int:
    """When a job's next heartbeat is taken: a second after the previous one, or once half
    the lease that one granted has passed, whichever comes first."""
    return last_beat_us + min(HEARTBEAT_SPACING_US,
                              max(0, lease_expires_at_us - last_beat_us) // 2)


def _whole_seconds(wait_us: int) -> int:
    # Retry-After takes whole seconds; rounded up, and never 0 (that would say "at once").
    return max(1, math.ceil(wait_us / MICROS))


class HeartbeatTooSoon(TooManyRequests):
    """A heartbeat sent before its job takes the next one: nothing was written."""

    def __init__(self, wait_us: int) -> None:
        super().__init__(
            f"This job takes one heartbeat a second at most (or one per half lease, for a "
            f"lease under {2 * HEARTBEAT_SPACING_SECONDS} seconds); nothing was written. "
            f"Send it again after Retry-After.", retry_after_seconds=_whole_seconds(wait_us))


class CheckpointTooSoon(TooManyRequests):
    """A heartbeat carrying a checkpoint sent within a second of the job's last checkpoint:
    refused whole, nothing was written."""

    def __init__(self) -> None:
        super().__init__(
            f"This job saves one checkpoint every {CHECKPOINT_SPACING_SECONDS} second(s) at "
            f"most; nothing was written (neither the checkpoint nor the lease). Send it "
            f"again after Retry-After.", retry_after_seconds=CHECKPOINT_SPACING_SECONDS)
