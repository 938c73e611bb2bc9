"""A job's history: one record per attempt and a timeline of events (contract section 13).

The job service writes both in the transactions of the changes they record; this package
owns their tables, their SQL and how they are shown.
"""
