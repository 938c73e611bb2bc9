"""Waking the requests that wait for a job: in this process, and across a host's processes."""
