"""The limits of the queue: how large, how long and how many, each stated once."""

from __future__ import annotations

# Ids are 64-bit on both engines (SQLite's rowid, PostgreSQL's bigint); past this no job is
# stored, and PostgreSQL could not even bind the number.
MAX_JOB_ID = 2**63 - 1

# Names: a job type (and so a type's settings) is at most this long.
MAX_TYPE_CHARS = 100
# Keys given by producers (idempotency, unique, concurrency) are at most this long.
MAX_KEY_CHARS = 255
# A page of a listing stops short of `limit` items rather than pass this many bytes of JSON.
MAX_PAGE_BYTES = 4 * 1024 * 1024
