"""The package list, which setup.cfg cannot spell: the server's distribution ships the client
(client/queuelog_client) beside app/ and queuelog_gunicorn/, so that `pip install .` needs no
distribution from an index and `queuelog worker` runs after it. client/ stays a distribution
of its own for workers, which need neither Flask nor SQLAlchemy. (setup.cfg's `find:` takes
one `where` folder only.) Everything else is in setup.cfg."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["app", "app.*", "queuelog_gunicorn"]), "queuelog_client"],
    package_dir={"queuelog_client": "client/queuelog_client"},
)
