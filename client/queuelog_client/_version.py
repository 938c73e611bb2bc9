"""The distribution's version, in one place: client/pyproject.toml reads it from here (a
literal, so the build reads it without importing the package), and the package exports it
as queuelog_client.__version__."""

__version__ = "0.1.0"
