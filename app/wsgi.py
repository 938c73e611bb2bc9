"""The WSGI application gunicorn serves (`queuelog serve` names `app.wsgi:app`): one per
gunicorn worker, with its configuration warnings logged, and its schedule ticker, stats
flusher and maintenance loop started."""

from app import (
    create_app,
    start_maintenance,
    start_scheduler,
    start_stats_flusher,
    warn_about_configuration,
)

app = create_app()
warn_about_configuration(app)
start_scheduler(app)
start_stats_flusher(app)
start_maintenance(app)
