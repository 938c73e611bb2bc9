"""The limits of the queue: how large, how long and how many, each stated once.

One record per limit, shaped like app/config.py's settings: its name, its bounds (and its
default where a request may leave it out), its unit and what it bounds. The schemas build
their validators from these records, so /openapi.json publishes the same numbers; the fast
load path, the CLI's click ranges, the dashboard's min/max attributes and the settings that
are limits read them too. tests/test_limits.py walks LIMITS and checks each is enforced where
it is published.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

N = TypeVar("N", int, float)

_DAY_SECONDS = 86_400
_YEAR_SECONDS = 365 * _DAY_SECONDS


@dataclass(frozen=True)
class Limit(Generic[N]):
    name: str
    min: N
    max: N
    unit: str
    help: str
    # What a request that leaves the value out gets; None: no default (required, or absent).
    default: N | None = None


# Ids are 64-bit on both engines (SQLite's rowid, PostgreSQL's bigint); past this no job is
# stored, and PostgreSQL could not even bind the number.
JOB_ID = Limit[int]("JOB_ID", 1, 2**63 - 1, "id", "a job's id")

# -- text --------------------------------------------------------------------------------------
TYPE_CHARS = Limit[int]("TYPE_CHARS", 1, 100, "characters",
                        "a job type, and so a type's settings (the jobs.type column)")
NAME_CHARS = Limit[int]("NAME_CHARS", 1, 100, "characters",
                        "a worker's name, a key's name (a job's producer) and a schedule's name")
KEY_CHARS = Limit[int]("KEY_CHARS", 1, 255, "characters",
                       "a key given by a producer: idempotency, unique or concurrency")
LEASE_TOKEN_CHARS = Limit[int]("LEASE_TOKEN_CHARS", 1, 64, "characters",
                               "a claim's lease_token as a worker sends it back")
CURSOR_CHARS = Limit[int]("CURSOR_CHARS", 1, 200, "characters", "a listing's cursor")
TOKEN_CHARS = Limit[int]("TOKEN_CHARS", 1, 200, "characters",
                         "an API key's token, as a bearer token or the dashboard's sign-in")
ERROR_CHARS = Limit[int]("ERROR_CHARS", 1, 100_000, "characters",
                         "the error a worker reports when a job fails")
# Not a refusal: a longer error is stored and shown cut to this (after its secrets are masked).
STORED_ERROR_CHARS = Limit[int]("STORED_ERROR_CHARS", 0, 2000, "characters",
                                "a job's error as stored and shown")
CRON_CHARS = Limit[int]("CRON_CHARS", 1, 200, "characters", "a schedule's cron expression")
TIMEZONE_CHARS = Limit[int]("TIMEZONE_CHARS", 1, 64, "characters",
                            "a schedule's IANA time zone name")
PUSH_URL_CHARS = Limit[int]("PUSH_URL_CHARS", 0, 2000, "characters", "a push type's endpoint")
REF_CHARS = Limit[int]("REF_CHARS", 1, 100, "characters",
                       "a job's ref within a workflow or a batch ([A-Za-z0-9._-])")
WORKFLOW_NAME_CHARS = Limit[int]("WORKFLOW_NAME_CHARS", 1, 100, "characters",
                                 "a workflow's name (printable ASCII)")
PROGRESS_MESSAGE_CHARS = Limit[int]("PROGRESS_MESSAGE_CHARS", 0, 200, "characters",
                                    "a heartbeat's progress message")
TAG_CHARS = Limit[int]("TAG_CHARS", 1, 64, "characters",
                       "a job's tag (printable ASCII; the job_tags.tag column)")
EVENT_NAME_CHARS = Limit[int]("EVENT_NAME_CHARS", 1, 200, "characters",
                              "an event's name, posted or waited for (printable ASCII)")
EVENT_KEY_CHARS = Limit[int]("EVENT_KEY_CHARS", 0, 255, "characters",
                             "an event's key, posted or waited for (default: empty)")
INSTANCE_CHARS = Limit[int]("INSTANCE_CHARS", 1, 200, "characters",
                            "a worker's instance label, sent with its claims and heartbeats "
                            "(printable ASCII, no space at either end)")

# -- how many ----------------------------------------------------------------------------------
RETRIES = Limit[int]("RETRIES", 0, 25, "retries", "a job's max_retries", default=3)
BATCH_JOBS = Limit[int]("BATCH_JOBS", 1, 1000, "jobs", "the jobs of one POST /jobs/batch")
WORKFLOW_JOBS = Limit[int]("WORKFLOW_JOBS", 1, 1000, "jobs", "the jobs of one POST /workflows")
DEPENDENCIES = Limit[int]("DEPENDENCIES", 0, 100, "jobs",
                          "the dependencies one job names (depends_on)")
TAGS = Limit[int]("TAGS", 0, 10, "tags", "the tags of one job")
CLAIM_JOBS = Limit[int]("CLAIM_JOBS", 1, 100, "jobs", "the jobs one claim-many takes",
                        default=10)
CLAIM_TYPES = Limit[int]("CLAIM_TYPES", 0, 100, "types", "the types one claim names")
COMPLETE_ITEMS = Limit[int]("COMPLETE_ITEMS", 1, 100, "items",
                            "the items of one POST /jobs/complete-many")
BULK_JOBS = Limit[int]("BULK_JOBS", 1, 10_000, "jobs",
                       "the jobs one bulk retry or cancel takes (its limit, or its ids)",
                       default=1000)
PAGE_ITEMS = Limit[int]("PAGE_ITEMS", 1, 500, "items", "a listing page's limit", default=50)
# A page of a listing stops short of `limit` items rather than pass this many bytes of JSON.
PAGE_BYTES = Limit[int]("PAGE_BYTES", 0, 4 * 1024 * 1024, "bytes",
                        "the JSON of one listing page")
CATCH_UP = Limit[int]("CATCH_UP", 0, 100, "jobs",
                      "the jobs one firing of a schedule enqueues (catch_up all): the newest "
                      "slots")
# JSON numbers beyond 2**53 - 1 lose their exactness in most clients' parsers.
PROGRESS_COUNT = Limit[int]("PROGRESS_COUNT", 0, 2**53 - 1, "units",
                            "a heartbeat's progress done and total (done <= total)")
# Rows of the operator's bulk commands, taken in one transaction each.
BATCH_ROWS = Limit[int]("BATCH_ROWS", 1, 100_000, "rows",
                        "`queuelog purge --batch-size` and `queuelog copy --batch-size` (the "
                        "default: copy's)", default=1000)
TYPE_LIMIT = Limit[int]("TYPE_LIMIT", 1, 100_000, "jobs",
                        "a type's max_running, max_running_per_key and burst")
RATE = Limit[float]("RATE", 0.001, 100_000.0, "claims per second",
                    "a type's rate_per_second (token bucket)")

# -- how long ----------------------------------------------------------------------------------
LEASE_SECONDS = Limit[int]("LEASE_SECONDS", 1, 3600, "seconds",
                           "a claim's or a heartbeat's lease (the default: "
                           "QUEUELOG_LEASE_SECONDS)", default=300)
DELAY_SECONDS = Limit[int]("DELAY_SECONDS", 0, _YEAR_SECONDS, "seconds",
                           "how far ahead a job may be scheduled (delay_seconds, run_at), and "
                           "so a retry's backoff")
UNIQUE_PERIOD_SECONDS = Limit[int]("UNIQUE_PERIOD_SECONDS", 1, _YEAR_SECONDS, "seconds",
                                   "the period of an enqueue's unique rule")
RETRY_IN_SECONDS = Limit[int]("RETRY_IN_SECONDS", 0, _DAY_SECONDS, "seconds",
                              "the retry_in_seconds of a failure report, and so the base of "
                              "the retry backoff")
CLAIM_WAIT_SECONDS = Limit[float]("CLAIM_WAIT_SECONDS", 0, 20, "seconds",
                                  "how long a claim long-polls for a job", default=0)
RESULT_WAIT_SECONDS = Limit[float]("RESULT_WAIT_SECONDS", 0, 60, "seconds",
                                   "how long GET /jobs/{id}?wait_seconds waits for the job to "
                                   "finish", default=0.0)
PUSH_TIMEOUT_SECONDS = Limit[int]("PUSH_TIMEOUT_SECONDS", 1, 900, "seconds",
                                  "a push delivery's time limit", default=30)
CONFIRM_WITHIN_SECONDS = Limit[int]("CONFIRM_WITHIN_SECONDS", 1, _DAY_SECONDS, "seconds",
                                    "a reserve's confirm_within_seconds: how long its "
                                    "producer has to confirm or release it")
TIMEOUT_SECONDS = Limit[int]("TIMEOUT_SECONDS", 1, 7 * _DAY_SECONDS, "seconds",
                             "a job's timeout_seconds: how long one attempt may run")
EXPIRES_IN_SECONDS = Limit[int]("EXPIRES_IN_SECONDS", 1, _YEAR_SECONDS, "seconds",
                                "a job's expires_in_seconds (and how far ahead its expires_at "
                                "may be)")
RETENTION_SECONDS = Limit[int]("RETENTION_SECONDS", 60, 315_360_000, "seconds",
                               "how long a type's finished jobs are kept (null: for ever)")
FAILURE_SAMPLE_CHARS = Limit[int]("FAILURE_SAMPLE_CHARS", 0, 1000, "characters",
                                  "a failure group's sample error, as stored")
STATS_BUCKETS = Limit[int]("STATS_BUCKETS", 1, 1500, "buckets",
                           "buckets of GET /stats in one answer (from, to and step)")
WAIT_SECONDS = Limit[int]("WAIT_SECONDS", 1, _YEAR_SECONDS, "seconds",
                          "a suspend's sleep (seconds, and how far ahead its until may be) and "
                          "a wait's timeout_seconds")

# -- a type that protects itself (docs/FLOW-CONTROL.md) -----------------------------------------
CIRCUIT_FAILURE_RATIO = Limit[float]("CIRCUIT_FAILURE_RATIO", 0.05, 1.0, "share",
                                     "a circuit's failure_ratio: the failed share of the "
                                     "window's finished attempts that opens it")
CIRCUIT_MIN_ATTEMPTS = Limit[int]("CIRCUIT_MIN_ATTEMPTS", 1, 10_000, "attempts",
                                  "a circuit's min_attempts: finished attempts in the window "
                                  "before its ratio counts")
CIRCUIT_WINDOW_SECONDS = Limit[int]("CIRCUIT_WINDOW_SECONDS", 10, 3600, "seconds",
                                    "a circuit's window_seconds")
CIRCUIT_COOLDOWN_SECONDS = Limit[int]("CIRCUIT_COOLDOWN_SECONDS", 1, 3600, "seconds",
                                      "a circuit's cooldown_seconds: from its opening to its "
                                      "probe, and between its waves")
RETRY_BUDGET_RATIO = Limit[float]("RETRY_BUDGET_RATIO", 0.0, 10.0, "retries per first attempt",
                                  "a retry budget's ratio")
RETRY_BUDGET_WINDOW_SECONDS = Limit[int]("RETRY_BUDGET_WINDOW_SECONDS", 10, 3600, "seconds",
                                         "a retry budget's window_seconds")
RETRY_BUDGET_MINIMUM = Limit[int]("RETRY_BUDGET_MINIMUM", 0, 10_000, "retries",
                                  "a retry budget's minimum: retries per window whatever the "
                                  "first attempts")
AGING_SECONDS = Limit[int]("AGING_SECONDS", 60, 86_400, "seconds",
                           "a type's aging_seconds: how long a pending job waits before it is "
                           "claimed as if its priority rose one level")

LIMITS: tuple[Limit[int] | Limit[float], ...] = (
    JOB_ID, TYPE_CHARS, NAME_CHARS, KEY_CHARS, LEASE_TOKEN_CHARS, CURSOR_CHARS, TOKEN_CHARS,
    ERROR_CHARS, STORED_ERROR_CHARS, CRON_CHARS, TIMEZONE_CHARS, PUSH_URL_CHARS, REF_CHARS,
    WORKFLOW_NAME_CHARS, PROGRESS_MESSAGE_CHARS, TAG_CHARS, RETRIES, BATCH_JOBS, WORKFLOW_JOBS,
    DEPENDENCIES, TAGS, CLAIM_JOBS, CLAIM_TYPES, COMPLETE_ITEMS, BULK_JOBS, PAGE_ITEMS,
    PAGE_BYTES, PROGRESS_COUNT, CATCH_UP, BATCH_ROWS, TYPE_LIMIT, RATE,
    LEASE_SECONDS, DELAY_SECONDS, UNIQUE_PERIOD_SECONDS, RETRY_IN_SECONDS, CLAIM_WAIT_SECONDS,
    RESULT_WAIT_SECONDS, PUSH_TIMEOUT_SECONDS, TIMEOUT_SECONDS, EXPIRES_IN_SECONDS,
    CONFIRM_WITHIN_SECONDS, RETENTION_SECONDS, FAILURE_SAMPLE_CHARS, STATS_BUCKETS,
    EVENT_NAME_CHARS, EVENT_KEY_CHARS, WAIT_SECONDS, CIRCUIT_FAILURE_RATIO, CIRCUIT_MIN_ATTEMPTS,
    CIRCUIT_WINDOW_SECONDS, CIRCUIT_COOLDOWN_SECONDS, RETRY_BUDGET_RATIO,
    RETRY_BUDGET_WINDOW_SECONDS, RETRY_BUDGET_MINIMUM, AGING_SECONDS, INSTANCE_CHARS,
)
