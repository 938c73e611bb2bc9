# queuelog: the job queue behind gunicorn, SQLite in a volume by default.
#
# The image installs wheels built beforehand on the host, so its build needs no package index
# (only the base image): with a Python of the image's version (3.11) on the same architecture,
#
#   pip wheel --wheel-dir wheels .
#   docker build -t queuelog .
#   docker run -d --name queuelog -p 8000:8000 -v queuelog-data:/var/lib/queuelog \
#       -e QUEUELOG_JOB_TYPES=email,pdf --stop-timeout 40 queuelog
#   docker exec queuelog queuelog keys create ops --role admin
#
# Any base with python3 and its venv module will do (a Debian made with debootstrap and
# imported, where no registry is reachable): --build-arg BASE_IMAGE=localhost/debian-python.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

# PATH is spelled out: an imported base carries no environment to extend.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/queuelog/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# A virtual environment, so that the same steps work on the python image and on a Debian
# base (whose python3 refuses installs into the system's site-packages). A plain install of
# the server from the wheels alone: the client's package, the gunicorn settings
# (queuelog_gunicorn/conf.py) and the Alembic scripts travel in the server's wheel, so
# `queuelog db upgrade` and `queuelog serve` work from any directory.
COPY wheels/ /tmp/wheels/
RUN python3 -m venv /opt/queuelog \
    && pip install --no-index --find-links /tmp/wheels queuelog \
    && rm -rf /tmp/wheels

# No root at run time. The data directory is created owned by this user, so a fresh named
# volume mounted there inherits the ownership.
RUN groupadd --system --gid 10001 queuelog \
    && useradd --system --uid 10001 --gid queuelog --home-dir /var/lib/queuelog \
       --no-create-home --shell /usr/sbin/nologin queuelog \
    && mkdir -p /var/lib/queuelog \
    && chown queuelog:queuelog /var/lib/queuelog

WORKDIR /srv/queuelog
COPY docker/entrypoint.sh docker/healthcheck.py ./

# The URL is set here, not only derived by the entry script, so that `docker exec … queuelog
# keys create` finds the same database as the server.
ENV QUEUELOG_DATA_DIR=/var/lib/queuelog \
    QUEUELOG_DATABASE_URL=sqlite:////var/lib/queuelog/queuelog.sqlite3 \
    QUEUELOG_BIND=0.0.0.0:8000
VOLUME ["/var/lib/queuelog"]
EXPOSE 8000
USER queuelog

# Liveness only (/healthz never touches the database); orchestrators that route traffic
# should probe /readyz as well.
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "/srv/queuelog/healthcheck.py"]

STOPSIGNAL SIGTERM
ENTRYPOINT ["/srv/queuelog/entrypoint.sh"]
