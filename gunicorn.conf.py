# gunicorn reads this file when started here (`gunicorn wsgi:app`): the shipped settings.
from queuelog_gunicorn.conf import *  # noqa: F403
