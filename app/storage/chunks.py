"""Lists of ids bound into one statement, in chunks of a bounded size.

A statement that binds a list (an IN of ids, a multi-row VALUES) sends one parameter per
element: past the driver's limit (PostgreSQL's 65,535 bind parameters, SQLite's
SQLITE_MAX_VARIABLE_NUMBER) it fails whatever the data, and before that its plan and its
locks grow with the list. Where a producer decides how long a list is (the dependencies a
batch names, the dependents a job's end settles, the jobs a workflow cancel ends), the
repositories send it in chunks of ID_CHUNK, in the list's order, so that no statement's size
grows with what a producer stored.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

# Ids per statement: far below either engine's limit even when a statement binds its list
# twice, and few enough that one statement's locks and plan stay small.
ID_CHUNK = 1000


def chunked(items: Iterable[T], size: int = ID_CHUNK) -> Iterator[list[T]]:
    """`items` in consecutive lists of at most `size`, in their order."""
    chunk: list[T] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
