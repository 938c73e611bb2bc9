"""The WSGI application gunicorn serves (`queuelog serve` names `app.wsgi:app`): one per
gunicorn worker, with its configuration warnings logged, its schedule ticker, stats flusher,
listening to the database (PostgreSQL) and maintenance loop started and its copy of the job
types' settings kept fresh."""

from app import (
    create_app,
    start_maintenance,
    start_scheduler,
    start_stats_flusher,
    start_type_settings_refresh,
    warn_about_configuration,
)
from app.database_wakes import start_database_wakes

app = create_app()
warn_about_configuration(app)
start_scheduler(app)
start_stats_flusher(app)
start_database_wakes(app)
start_maintenance(app)
start_type_settings_refresh(app)
