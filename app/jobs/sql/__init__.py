"""The SQL of jobs, and only SQL: repositories on a connection they are given."""
