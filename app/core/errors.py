"""The domain's errors: what went wrong, in the queue's own words. No HTTP status lives here;
app/web/problems.py maps each to the problem a client is shown."""

from __future__ import annotations
