"""The serving worker's own rules, without a server (queuelog_gunicorn/worker.py): what its
threads' parser reads, and the settings it refuses to start with."""

from __future__ import annotations

import logging

import pytest
from gunicorn.config import Config
from gunicorn.errors import ConfigError
from gunicorn.http.parser import RequestParser

from queuelog_gunicorn.worker import ArrivedBytes, BufferingThreadWorker


def test_the_parser_reads_what_arrived_and_meets_the_end_of_the_stream_not_the_socket() -> None:
    arrived = ArrivedBytes()
    arrived.data += b"POST /jobs HTTP/1.1\r\nHost: q\r\nContent-Length: 2\r\n\r\n{}GET /"
    request = next(RequestParser(Config(), arrived, ("127.0.0.1", 1)))
    assert (request.method, request.path, request.body.read()) == ("POST", "/jobs", b"{}")
    assert not arrived.ran_dry

    # A parser that wants more than arrived gets the end of the stream at once, and says so.
    short = ArrivedBytes()
    short.data += b"POST /jobs HTTP/1.1\r\nContent-Length: 10\r\n\r\n{}"
    request = next(RequestParser(Config(), short, ("127.0.0.1", 1)))
    assert request.body.read() == b"{}"
    assert short.ran_dry


@pytest.mark.parametrize("setting", [("certfile", __file__), ("http2_cleartext", "upgrade"),
                                     ("protocol", "uwsgi")])
def test_the_worker_refuses_settings_whose_bytes_it_cannot_frame(
        setting: tuple[str, str]) -> None:
    cfg = Config()
    BufferingThreadWorker.check_config(cfg, logging.getLogger("test"))  # the defaults are fine
    cfg.set(*setting)
    with pytest.raises(ConfigError, match=r"plain HTTP/1\.x only"):
        BufferingThreadWorker.check_config(cfg, logging.getLogger("test"))
