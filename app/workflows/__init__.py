"""Workflows (docs/WORKFLOWS.md): graphs of jobs enqueued in one request, read and cancelled whole.
The dependencies themselves are the jobs' own (app/jobs/tx/dependencies.py); a workflow names
its jobs by ref."""
