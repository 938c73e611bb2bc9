"""What the job routes' requests may hold: one marshmallow schema per body and query.

The same schemas validate requests and describe them in /openapi.json. Rules that need the
configuration or the clock (allowed types, payload size, run_at's range) live in the use
cases. How a job is shown in an answer is answers.py's.
"""

from __future__ import annotations

import enum
import re
from typing import Any, ClassVar, TypeVar

from marshmallow import Schema, ValidationError, fields, validate, validates_schema

from app.core.fingerprint import FINGERPRINT_PATTERN
from app.core.limits import (
    BATCH_JOBS,
    BULK_JOBS,
    CLAIM_JOBS,
    CLAIM_TYPES,
    CLAIM_WAIT_SECONDS,
    COMPLETE_ITEMS,
    CONFIRM_WITHIN_SECONDS,
    DELAY_SECONDS,
    DEPENDENCIES,
    ERROR_CHARS,
    EXPIRES_IN_SECONDS,
    INSTANCE_CHARS,
    JOB_ID,
    KEY_CHARS,
    LEASE_SECONDS,
    LEASE_TOKEN_CHARS,
    NAME_CHARS,
    PROGRESS_COUNT,
    PROGRESS_MESSAGE_CHARS,
    PUSH_URL_CHARS,
    REF_CHARS,
    RESULT_WAIT_SECONDS,
    RETRIES,
    RETRY_IN_SECONDS,
    TAG_CHARS,
    TAGS,
    TIMEOUT_SECONDS,
    TYPE_CHARS,
    UNIQUE_PERIOD_SECONDS,
)
from app.core.origins import HTTP_URL_PATTERN
from app.core.priorities import PRIORITY_LABELS
from app.core.statuses import JobStatus
from app.jobs.domain.uniqueness import DEFAULT_WHILE, WHILE_STATUSES, OnConflict, while_set_problem
from app.web.fields import (
    NO_NUL,
    PRINTABLE_ASCII_TEXT,
    PRINTABLE_LABEL,
    PageQuerySchema,
    PriorityLabel,
    StrictInteger,
    StrictNumber,
    StrictSchema,
    Timestamp,
    idempotency_key_field,
    length_within,
    non_empty_text,
    within,
)

T = TypeVar("T")

class ResultWaitSeconds(fields.Float):
    """GET /jobs/{id}'s wait_seconds: 0 to 60 seconds, in ASCII digits with an optional
    fraction. /openapi.json says it as a string of that form (a query string holds no
    numbers), the range spelled into its pattern."""

    _FORM = re.compile(r"[0-9]{1,9}(\.[0-9]{1,6})?")
    # RESULT_WAIT_SECONDS.max (60) spelled as a pattern: tests/test_limits.py checks the two
    # agree (it sends the maximum and one more).
    PATTERN = r"^([0-9]|[1-5][0-9])(\.[0-9]{1,6})?$|^60(\.0{1,6})?$"

    def __init__(self, **kwargs: Any) -> None:
        metadata = {"type": "string", "pattern": self.PATTERN, "default": "0",
                    **kwargs.pop("metadata", {})}
        super().__init__(load_default=RESULT_WAIT_SECONDS.default, metadata=metadata,
                         **kwargs)

    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> float:
        if not isinstance(value, str) or not self._FORM.fullmatch(value):
            raise ValidationError("Must be a number of seconds in ASCII digits, like 5 or 2.5.")
        seconds = float(value)
        if not RESULT_WAIT_SECONDS.min <= seconds <= RESULT_WAIT_SECONDS.max:
            raise ValidationError(
                f"Must be from {RESULT_WAIT_SECONDS.min} to {RESULT_WAIT_SECONDS.max}.")
        return seconds


_STATUS_NAMES = list(WHILE_STATUSES)


class UniqueSchema(StrictSchema):
    """`unique` on an enqueue: which jobs count as the same work (docs/JOBS.md, Unique jobs)."""

    key = fields.String(validate=[length_within(KEY_CHARS), PRINTABLE_ASCII_TEXT],
                        metadata={"description": "Default: a digest of type and payload."})
    period_seconds = StrictInteger(
        validate=within(UNIQUE_PERIOD_SECONDS),
        metadata={"description": "Twins collide only when their run_at falls in the same "
                                 "period, aligned to the Unix epoch."})
    while_ = fields.List(
        fields.String(validate=validate.OneOf(_STATUS_NAMES)), data_key="while",
        attribute="while", validate=validate.Length(min=1, max=len(_STATUS_NAMES)),
        metadata={"description": "The statuses in which a job holds its key. Must include "
                                 "pending; with completed or failed, also running.",
                  "example": list(DEFAULT_WHILE)})
    on_conflict = fields.String(validate=validate.OneOf([c.value for c in OnConflict]),
                                metadata={"description": "Default: return."})

    openapi_extra: ClassVar[dict[str, Any]] = {
        "example": {"key": "reindex-customer-42", "period_seconds": 60,
                    "while": list(DEFAULT_WHILE), "on_conflict": "replace"}}

    @validates_schema
    def _enforceable_while(self, data: dict[str, Any], **_: Any) -> None:
        problem = while_set_problem(data.get("while") or DEFAULT_WHILE)
        if problem is not None:
            raise ValidationError(problem, "while")


class ReserveSchema(StrictSchema):
    """`reserve` on POST /jobs (docs/JOBS.md): the job is stored reserved, never claimed,
    until its producer confirms or releases it."""

    confirm_within_seconds = StrictInteger(
        required=True, validate=within(CONFIRM_WITHIN_SECONDS),
        metadata={"description": "The deadline: unanswered by then, the job is released, or "
                                 "its check url is asked."})
    check_url = fields.String(validate=[
        validate.Length(max=PUSH_URL_CHARS.max),
        validate.Regexp(HTTP_URL_PATTERN, error="An http or https URL: a host name or IPv4 "
                        "address, an optional port 1-65535, then printable ASCII and no "
                        "fragment (percent-encode the rest).")],
        metadata={"description": "Asked (GET, signed) after the deadline whether the "
                                 "producer committed; must start with one of the operator's "
                                 "QUEUELOG_CHECK_URL_ORIGINS. Default: the producer key's. "
                                 "Never shown."})


class OnDependencyFailure(enum.StrEnum):
    CANCEL = "cancel"
    RUN = "run"


REF_PATTERN = r"^[A-Za-z0-9._-]+$"
_REF = validate.Regexp(REF_PATTERN, error="Must be 1..100 of A-Z a-z 0-9 . _ -")


class DependencyRef(fields.Raw):
    """An entry of depends_on in a batch or a workflow: an existing job's id (an integer) or
    the ref of another item of the same request (a string)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(metadata={"oneOf": [
            {"type": "integer", "minimum": JOB_ID.min, "maximum": JOB_ID.max},
            {"type": "string", "minLength": REF_CHARS.min, "maxLength": REF_CHARS.max,
             "pattern": REF_PATTERN}]}, **kwargs)

    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> int | str:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValidationError("Must be a job's id (an integer) or an item's ref (a string).")
        if isinstance(value, int):
            if not JOB_ID.min <= value <= JOB_ID.max:
                raise ValidationError(f"An id is from {JOB_ID.min} to {JOB_ID.max}.")
            return value
        length_within(REF_CHARS)(value)
        _REF(value)
        return value

def ref_field(**options: Any) -> fields.String:
    """A job's ref in a batch or a workflow."""
    return fields.String(validate=[length_within(REF_CHARS), _REF], **options)


def tag_field(**options: Any) -> fields.String:
    """A job's tag: TAG_CHARS of printable ASCII (so no NUL)."""
    return fields.String(validate=[length_within(TAG_CHARS), PRINTABLE_ASCII_TEXT], **options)


class TagSet(fields.List[Any]):
    """A job's tags: a list on the wire, a set inside (docs/API.md, Tags): loaded sorted, each
    once. At most TAGS.max entries as sent, duplicates included, as /openapi.json says."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(tag_field(), validate=length_within(TAGS), **kwargs)

    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> list[Any]:
        if isinstance(value, list) and len(value) > TAGS.max:
            raise ValidationError(f"At most {TAGS.max} tags.")
        tags: list[Any] = super()._deserialize(value, attr, data, **kwargs)
        return sorted(set(tags))


def _depends_on(entry: fields.Field[Any], description: str) -> fields.List[Any]:
    return fields.List(entry, validate=length_within(DEPENDENCIES),
                       metadata={"description": description})


class EnqueueSchema(StrictSchema):
    type = fields.String(required=True, validate=length_within(TYPE_CHARS))
    payload = fields.Dict(load_default=dict)
    priority = PriorityLabel(load_default=None, metadata={
        "enum": [*PRIORITY_LABELS, None],
        "description": "Case-insensitive. Default: medium, or the key's ceiling if lower."})
    max_retries = StrictInteger(load_default=RETRIES.default, validate=within(RETRIES))
    run_at = Timestamp(load_default=None, metadata={
        "format": "date-time",
        "description": "RFC 3339 with an offset; from 1970-01-01 to one year from now."})
    delay_seconds = StrictInteger(load_default=None, validate=within(DELAY_SECONDS))
    idempotency_key = idempotency_key_field(load_default=None)
    concurrency_key = fields.String(
        load_default=None, validate=[length_within(KEY_CHARS), PRINTABLE_ASCII_TEXT],
        metadata={"description": "With the type's max_running_per_key set, at most that many "
                                 "jobs of one (type, concurrency_key) run at once."})
    unique = fields.Nested(UniqueSchema, load_default=None, allow_none=True, metadata={
        "description": "Keep one job for the same work: a twin is returned, rejected (409) "
                       "or replaced (debounce)."})
    depends_on = _depends_on(StrictInteger(validate=within(JOB_ID)),
                             "Ids of jobs the caller can see; the job waits until each has "
                             "finished.")
    on_dependency_failure = fields.String(
        validate=validate.OneOf([choice.value for choice in OnDependencyFailure]),
        metadata={"description": "What a dependency that ends failed or cancelled does: "
                                 "cancel this job (default), or count as finished (run)."})
    timeout_seconds = StrictInteger(
        load_default=None, allow_none=True, validate=within(TIMEOUT_SECONDS),
        metadata={"description": "How long one attempt may run, from its claim: no lease or "
                                 "heartbeat runs past it, and an attempt still running then "
                                 "fails with error \"timed out\" (retried per max_retries)."})
    expires_at = Timestamp(load_default=None, allow_none=True, metadata={
        "format": "date-time",
        "description": "Not claimed by then, the job is not run: it is cancelled (event "
                       "detail reason expired). In the future, within a year, after run_at."})
    expires_in_seconds = StrictInteger(
        load_default=None, allow_none=True, validate=within(EXPIRES_IN_SECONDS),
        metadata={"description": "expires_at as seconds from now."})
    reserve = fields.Nested(ReserveSchema, load_default=None, allow_none=True, metadata={
        "description": "Store the job reserved: it waits for POST /jobs/{id}/confirm (after "
                       "the producer's own commit) or /release. Not with unique or "
                       "depends_on."})
    tags = TagSet(load_default=None, allow_none=True, metadata={
        "description": "Labels to find the job by (GET /jobs?tag=): a set, stored and shown "
                       "sorted, each once. A unique twin met keeps its own.",
        "example": ["customer-42", "import"]})

    # For /openapi.json: the rules _one_schedule and _one_expiry enforce, said in JSON Schema,
    # and a whole example (field examples would be combined into a body that breaks them).
    openapi_extra: ClassVar[dict[str, Any]] = {
        "allOf": [
            {"not": {"required": ["run_at", "delay_seconds"],
                     "properties": {"run_at": {"type": "string"},
                                    "delay_seconds": {"type": "integer"}}}},
            {"not": {"required": ["expires_at", "expires_in_seconds"],
                     "properties": {"expires_at": {"type": "string"},
                                    "expires_in_seconds": {"type": "integer"}}}},
        ],
        "example": {"type": "email", "payload": {"to": "ada@example.com"},
                    "priority": "high", "max_retries": 5, "delay_seconds": 30},
    }

    @validates_schema
    def _one_schedule(self, data: dict[str, Any], **_: Any) -> None:
        if data.get("run_at") is not None and data.get("delay_seconds") is not None:
            raise ValidationError("Give run_at or delay_seconds, not both.", "delay_seconds")

    @validates_schema
    def _one_expiry(self, data: dict[str, Any], **_: Any) -> None:
        if data.get("expires_at") is not None and data.get("expires_in_seconds") is not None:
            raise ValidationError("Give expires_at or expires_in_seconds, not both.",
                                  "expires_in_seconds")


class ListQuerySchema(PageQuerySchema):
    status = fields.String(validate=validate.OneOf([s.value for s in JobStatus]),
                           metadata={"example": "pending"})
    type = non_empty_text(TYPE_CHARS)
    tag = tag_field(metadata={"description": "Only the jobs carrying this tag.",
                              "example": "customer-42"})


class GetJobQuerySchema(StrictSchema):
    wait_seconds = ResultWaitSeconds(
        metadata={"description": f"Seconds ({RESULT_WAIT_SECONDS.min}.."
                                 f"{RESULT_WAIT_SECONDS.max}) to wait for the job to be "
                                 "completed, failed or cancelled; then answer with the job as "
                                 "it is.",
                  "example": "0.5"})


class BulkSchema(StrictSchema):
    """Which jobs a bulk retry or cancel takes: every filter given must hold. Jobs the
    filter names that are in a status the action does not start from are skipped."""

    openapi_extra: ClassVar[dict[str, Any]] = {
        "example": {"type": "email", "status": "failed", "limit": 500}}

    type = non_empty_text(TYPE_CHARS)
    status = fields.String(validate=validate.OneOf([s.value for s in JobStatus]))
    created_before = Timestamp(metadata={"format": "date-time"})
    created_after = Timestamp(metadata={"format": "date-time"})
    ids = fields.List(StrictInteger(validate=within(JOB_ID)), validate=length_within(BULK_JOBS))
    fingerprint = fields.String(validate=validate.Regexp(
        FINGERPRINT_PATTERN, error="A failure group's fingerprint: 16 lowercase hex digits."),
        metadata={"description": "Only jobs whose last attempt failed with this fingerprint "
                                 "(GET /failures): retry a failure group after its fix."})
    tag = tag_field(metadata={"description": "Only the jobs carrying this tag."})
    limit = StrictInteger(load_default=BULK_JOBS.default, validate=within(BULK_JOBS))


class BulkResultSchema(Schema):
    count = fields.Integer(required=True)
    ids = fields.List(fields.Integer(), required=True)


class GraphItemSchema(EnqueueSchema):
    """A job of a batch or a workflow: a POST /jobs body (but reserve: a reservation is one
    job's, confirmed on its own), a ref its fellow items may name in their depends_on, and
    depends_on naming ids and refs."""

    class Meta:
        exclude = ("reserve",)

    ref = ref_field(metadata={"description": "A name for this job, unique in the request, "
                                             "that other items' depends_on may use."})
    depends_on = _depends_on(DependencyRef(),
                             "Ids of jobs the caller can see, and refs of other items of the "
                             "request (in a batch: of earlier items).")


class BatchEnqueueSchema(StrictSchema):
    """POST /jobs/batch's body. The route loads it through app/jobs/web/fastload.py, which gives
    what this schema would for plainly valid jobs: a rule changed here changes there too."""

    jobs = fields.List(fields.Nested(GraphItemSchema), required=True,
                       validate=length_within(BATCH_JOBS))


def instance_field() -> fields.String:
    """The worker's instance label, sent with its claims and heartbeats."""
    return fields.String(validate=[length_within(INSTANCE_CHARS), PRINTABLE_LABEL], metadata={
        "description": "This worker process's label, printable ASCII (the runner sends "
                       "host:pid, or the one its operator sets): GET /workers lists the key's "
                       "instances by it and a job's attempts name it. Shown as reported; who "
                       "holds a job is the key and the lease token, never this label."})


class ClaimSchema(StrictSchema):
    openapi_extra: ClassVar[dict[str, Any]] = {
        "example": {"types": ["email"], "lease_seconds": 60}}

    types = fields.List(non_empty_text(TYPE_CHARS), validate=validate.Length(max=CLAIM_TYPES.max))
    lease_seconds = StrictInteger(validate=within(LEASE_SECONDS))
    worker_id = non_empty_text(NAME_CHARS)
    instance = instance_field()
    wait_seconds = StrictNumber(
        load_default=CLAIM_WAIT_SECONDS.default, validate=within(CLAIM_WAIT_SECONDS),
        metadata={"description": "Wait up to this long for a job when none is claimable."})


class ClaimManySchema(ClaimSchema):
    max_jobs = StrictInteger(load_default=CLAIM_JOBS.default, validate=within(CLAIM_JOBS))


class LeaseFencedSchema(StrictSchema):
    lease_token = non_empty_text(LEASE_TOKEN_CHARS)


class ProgressSchema(StrictSchema):
    done = StrictInteger(required=True, validate=within(PROGRESS_COUNT))
    total = StrictInteger(required=True, validate=within(PROGRESS_COUNT))

    @validates_schema
    def _done_within_total(self, data: dict[str, Any], **_: Any) -> None:
        if data.get("done", 0) > data.get("total", 0):
            raise ValidationError("done must not be greater than total.", "done")


def checkpoint_field() -> fields.Dict:
    return fields.Dict(load_default=None, allow_none=True, metadata={
        "description": "Any JSON object within the payload limit: the next attempt's claim "
                       "carries it, so that it resumes rather than starts over."})


class HeartbeatSchema(LeaseFencedSchema):
    openapi_extra: ClassVar[dict[str, Any]] = {"example": {
        "lease_seconds": 120, "progress": {"done": 420, "total": 1000},
        "message": "importing rows", "checkpoint": {"next_row": 420}}}

    lease_seconds = StrictInteger(validate=within(LEASE_SECONDS))
    progress = fields.Nested(ProgressSchema, load_default=None, metadata={
        "description": "Shown on the job (and the dashboard's bar); not an event."})
    message = fields.String(load_default=None,
                            validate=[length_within(PROGRESS_MESSAGE_CHARS), NO_NUL],
                            metadata={"description": "Shown with the progress, its secrets "
                                                     "masked as an error's are."})
    checkpoint = checkpoint_field()
    instance = instance_field()


class CompleteSchema(LeaseFencedSchema):
    openapi_extra: ClassVar[dict[str, Any]] = {"example": {"result": {"delivered": True}}}

    result = fields.Dict(load_default=None)


class CompleteItemSchema(CompleteSchema):
    id = StrictInteger(required=True, validate=within(JOB_ID))


class CompleteManySchema(StrictSchema):
    items = fields.List(fields.Nested(CompleteItemSchema), required=True,
                        validate=length_within(COMPLETE_ITEMS))


class FailSchema(LeaseFencedSchema):
    openapi_extra: ClassVar[dict[str, Any]] = {
        "example": {"error": "SMTP server timed out", "retry_in_seconds": 30}}

    error = fields.String(required=True, validate=length_within(ERROR_CHARS))
    retry_in_seconds = StrictInteger(validate=within(RETRY_IN_SECONDS))
    checkpoint = checkpoint_field()
