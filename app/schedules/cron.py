"""Cron expressions and time zones: parsing with messages that name the wrong part, and the
slots an expression gives, as microseconds since the epoch. Pure: no database, no clock.

The expressions are cronsim's (the schedule's `cron`; docs/SCHEDULES.md says why cronsim): five
fields, a macro (@hourly …), or, where the operator allows it, six fields with seconds first.
Slots are computed in the schedule's IANA zone (zoneinfo) with cronsim's daylight-saving
rules, which are Debian cron's: a job at a fixed local time (neither its minute nor its hour
field starts with `*`) fires at the first instant after a local time that does not exist,
and once, at the first occurrence, for a local time that occurs twice; a job that runs every
minute or hour follows real time through the change.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from app.core.clock import EPOCH, MICROS

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_FIVE = ("minute", "hour", "day-of-month", "month", "day-of-week")
_SIX = ("second", *_FIVE)
_RANGES = {"second": (0, 59), "minute": (0, 59), "hour": (0, 23), "day-of-month": (1, 31),
           "month": (1, 12), "day-of-week": (0, 7)}
_NAMES = {"month": ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT",
                    "NOV", "DEC"),
          "day-of-week": ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")}
# cronsim names the field it refused as "Bad <field>".
_BAD_FIELD = re.compile(r"Bad ([a-z-]+)")
# A slot search gives up after this many candidates (never reached by a valid expression: it
# only guards the loops against a library surprise).
_MAX_STEPS = 10_000


class CronError(ValueError):
    """A cron expression or time zone that cannot be used; the message names the wrong part."""


def parse_zone(name: str) -> ZoneInfo:
    """The IANA zone `name` (tzdata supplies the database where the OS has none)."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise CronError(f"unknown time zone {name!r}; use an IANA name such as "
                        "'Europe/Berlin' or 'UTC'") from None


def normalise_expression(expression: str, *, seconds: bool = False) -> str:
    """`expression` with single spaces and macros expanded; CronError naming the wrong field.

    Six fields (seconds first) only when `seconds` is allowed (QUEUELOG_SCHEDULE_SECONDS)."""
    text = " ".join(expression.split())
    if text.startswith("@"):
        if text.lower() not in MACROS:
            raise CronError(f"unknown macro {text!r}; use one of {', '.join(MACROS)}")
        return MACROS[text.lower()]
    parts = text.split(" ")
    allowed = (5, 6) if seconds else (5,)
    if len(parts) not in allowed:
        wanted = "5 fields (minute hour day-of-month month day-of-week)"
        if seconds:
            wanted += ", or 6 with seconds first"
        raise CronError(f"expected {wanted}, got {len(parts)}")
    try:
        CronSim(text, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        raise CronError(_explain(parts, str(exc))) from None
    return text


def _explain(parts: list[str], message: str) -> str:
    """What is wrong with the field cronsim refused, as precisely as its text allows."""
    match = _BAD_FIELD.search(message)
    names = _SIX if len(parts) == 6 else _FIVE
    if match is None or match.group(1) not in names:
        return message
    field = match.group(1)
    text = parts[names.index(field)]
    for term in text.split(","):
        problem = _term_problem(field, term)
        if problem is not None:
            return f"{field} field: {problem}"
    low, high = _RANGES[field]
    return f"{field} field: {text!r} never matches a date (values {low}-{high})"


def _term_problem(field: str, term: str) -> str | None:
    """What is wrong with one comma-separated term of a field, or None when nothing shows."""
    low, high = _RANGES[field]
    base, slash, step = term.partition("/")
    if slash and not (step.isdigit() and int(step) >= 1):
        return f"step {step!r} must be a whole number of at least 1"
    if base == "":
        return f"{term!r} has an empty part"
    if base == "*" or base.upper() in ("L", "LW") or "#" in base or base.upper().endswith("L"):
        return None
    values = base.split("-", 1)
    for value in values:
        if value.upper() in _NAMES.get(field, ()):
            continue
        if not value.isdigit():
            return f"{value!r} is not a number in {low}-{high}"
        if not low <= int(value) <= high:
            return f"{int(value)} is out of range {low}-{high}"
    if len(values) == 2 and all(v.isdigit() for v in values) and int(values[0]) > int(values[1]):
        return f"the range {base} runs backwards"
    return None


def _local(micros: int, zone: ZoneInfo) -> datetime:
    return (EPOCH + timedelta(microseconds=micros)).astimezone(zone)


def _micros(moment: datetime) -> int:
    return (moment - EPOCH) // timedelta(microseconds=1)


@dataclass(frozen=True)
class Cron:
    """A normalised expression in a zone: the slots it gives."""

    expression: str
    zone: ZoneInfo

    def next_after(self, after_us: int) -> int:
        """The first slot strictly after `after_us`."""
        return _next_after(self.expression, self.zone, after_us)

    def slots_between(self, since_us: int, until_us: int, limit: int) -> list[int]:
        """The newest `limit` slots in [since_us, until_us], oldest first. `since_us` is
        itself a slot (a schedule's next_run_at)."""
        if since_us > until_us:
            return []
        found: list[int] = []
        start = _local(until_us + MICROS, self.zone)
        for candidate in CronSim(self.expression, start, reverse=True):
            slot = _micros(candidate)
            if slot < since_us or len(found) >= limit:
                break
            if slot <= until_us and (not found or slot < found[-1]):
                found.append(slot)
            if len(found) > _MAX_STEPS:
                break
        if since_us not in found and len(found) < limit:
            found.append(since_us)
        return sorted(found)


# At a minute's boundary thousands of schedules share an expression, a zone and the slot just
# due: their next slot is walked once, not once each (the walk is pure).
@functools.lru_cache(maxsize=8192)
def _next_after(expression: str, zone: ZoneInfo, after_us: int) -> int:
    candidates = CronSim(expression, _local(after_us, zone))
    for steps, candidate in enumerate(candidates):
        slot = _micros(candidate)
        # A time that occurs twice is given at its first occurrence: searching from inside
        # the repeated hour may hand back an instant already past, never fired again.
        if slot > after_us:
            return slot
        if steps >= _MAX_STEPS:
            break
    raise CronError("the expression gives no slot after now")
