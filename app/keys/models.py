"""API keys: who a caller is and what its role lets it do."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One row of api_keys. The token itself is never stored, only its SHA-256 digest."""

    id: int
    name: str
    role: str
    token_digest: str
    max_priority: int
    job_types: str | None
    created_at: int
    revoked_at: int | None
    check_url: str | None = None  # asked about its reservations left unanswered (docs/JOBS.md)
    check_secret: str | None = None  # signs those checks

    @property
    def allowed_types(self) -> frozenset[str] | None:
        """The job types this key is limited to, or None for every type."""
        if self.job_types is None:
            return None
        return frozenset(self.job_types.split(","))
