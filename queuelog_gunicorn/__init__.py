"""What gunicorn's master process loads besides gunicorn.conf.py: the worker class that reads
whole requests before a thread sees them, and the housekeeping of the per-process metrics
files.

Nothing here imports `app`: the master would then hold the application's modules, every
worker would inherit them, and a HUP would no longer load new code.
"""
