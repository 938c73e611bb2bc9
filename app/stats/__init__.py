"""The queue over time (docs/OPERATIONS.md): per type and minute, what the job transactions counted
and the pending depth the ticker saw, read back as buckets by GET /stats and the dashboard."""
