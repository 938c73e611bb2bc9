# `gunicorn wsgi:app` from a checkout serves the same app as `queuelog serve` (app/wsgi.py).
from app.wsgi import app  # noqa: F401
