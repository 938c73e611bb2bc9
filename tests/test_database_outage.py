"""An unreachable PostgreSQL is a 503 problem, never a 500, and the service recovers by
itself when the database is back (the dead pooled connections are replaced at checkout)."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from app import create_app
from app.core.callers import Role
from tests.conftest import JOB_TYPES, Api, Key
from tests.tcp_proxy import TcpProxy


@pytest.fixture
def proxied_app(postgres_server, clock):
    url = make_url(postgres_server.create_database())
    proxy = TcpProxy(url.port or 5432, url.host or "127.0.0.1")
    proxy.start()
    application = create_app({
        "DATABASE_URL": url.set(port=proxy.port).render_as_string(hide_password=False),
        "JOB_TYPES": JOB_TYPES, "CLOCK": clock, "TESTING": True, "DB_POOL_SIZE": 2,
        "DB_POOL_TIMEOUT_SECONDS": 2,
    })
    yield application, proxy
    proxy.stop()
    application.extensions["queuelog"].db.engine.dispose()


def test_unreachable_postgres_is_a_503_problem_and_the_service_recovers(proxied_app):
    application, proxy = proxied_app
    services = application.extensions["queuelog"]
    producer = Key("p", services.keys.create_key("p", Role.PRODUCER))
    api = Api(application.test_client())
    assert api.enqueue(producer).status_code == 201

    proxy.stop()
    for _ in range(3):
        response = api.enqueue(producer)
        assert response.status_code == 503
        assert response.content_type == "application/problem+json"
        assert response.headers["Retry-After"]
        assert "psycopg" not in response.get_data(as_text=True)

    proxy.start()
    assert api.enqueue(producer).status_code == 201
    assert len(api.list(producer).json["jobs"]) == 2


def test_a_request_that_ran_no_transaction_answers_the_same_503(proxied_app):
    # A claim for no types reads nothing; the key's liveness is then checked after the
    # request, and an unreachable database there is the same problem as anywhere else.
    application, proxy = proxied_app
    services = application.extensions["queuelog"]
    producer = Key("p", services.keys.create_key("p", Role.PRODUCER))
    worker = Key("w", services.keys.create_key("w", Role.WORKER))
    api = Api(application.test_client())
    assert api.claim(worker, types=[]).status_code == 204

    proxy.stop()
    after_request = api.claim(worker, types=[])
    in_request = api.enqueue(producer)
    assert after_request.status_code == in_request.status_code == 503
    assert after_request.json == in_request.json
    assert after_request.headers["Retry-After"] == in_request.headers["Retry-After"]
