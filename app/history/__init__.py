"""A job's history as it is read: its attempts, its timeline of events and the explanation of
why it waits (docs/JOBS.md, Why isn't my job running?).

The job service writes attempts and events in the transactions of the changes they record
(app/jobs/timeline/); this package only reads and shows them.
"""
