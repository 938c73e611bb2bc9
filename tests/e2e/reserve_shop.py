"""A producer service with its own SQLite database, for tests/e2e/test_reserve_crash.py: run as
a process, so that the test can kill it with SIGKILL where a real one would crash.

    python -m tests.e2e.reserve_shop order DB KEY commit|rollback
        reserves an email job (QUEUELOG_URL, QUEUELOG_TOKEN; its check url SHOP_CHECK_URL),
        writes order KEY in DB inside
        `with client.reserve(...)`, commits or rolls back its transaction, prints
        "<commit|rollback> <job id>" and waits inside the block, before the confirm or release
        that leaving it would send, until it is killed.
    python -m tests.e2e.reserve_shop check DB PORT
        the shop's check url on 127.0.0.1:PORT: {"commit": true} when order KEY (the check's
        idempotency key) is in DB, else {"commit": false}; 401 unless verify_check accepts the
        request under QUEUELOG_CHECK_SECRET. Prints one line per check it answered.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import sqlite3
import sys
import threading

from queuelog_client import Client, SignatureError, verify_check

CONFIRM_WITHIN_SECONDS = 2


def connect(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=30)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE IF NOT EXISTS orders (key TEXT PRIMARY KEY, email TEXT)")
    return db


def order(path: str, key: str, outcome: str) -> None:
    db = connect(path)
    queue = Client(os.environ["QUEUELOG_URL"])
    with queue.reserve("email", {"order": key}, idempotency_key=key,
                       confirm_within_seconds=CONFIRM_WITHIN_SECONDS,
                       check_url=os.environ["SHOP_CHECK_URL"]) as job:
        db.execute("INSERT INTO orders VALUES (?, ?)", (key, "ada@example.com"))
        if outcome == "commit":
            db.commit()
        else:
            db.rollback()
        print(f"{outcome} {job['id']}", flush=True)
        threading.Event().wait()  # the crash comes here: killed before the block's answer


def serve_checks(path: str, port: int) -> None:
    secret = os.environ["QUEUELOG_CHECK_SECRET"]

    class Check(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            try:
                asked = verify_check(secret, self.headers, self.path.partition("?")[2])
            except SignatureError as refused:
                print(f"refused: {refused}", flush=True)
                self.answer(401, {"error": "not signed by queuelog"})
                return
            with contextlib.closing(connect(path)) as db:
                found = db.execute("SELECT 1 FROM orders WHERE key = ?",
                                   (asked.idempotency_key,)).fetchone()
            print(f"job {asked.job_id} check {asked.attempt}: commit {found is not None}",
                  flush=True)
            self.answer(200, {"commit": found is not None})

        def answer(self, status: int, body: dict[str, object]) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *_args: object) -> None:
            pass

    connect(path).close()
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), Check) as server:
        print("listening", flush=True)
        server.serve_forever()


if __name__ == "__main__":
    command, database, *rest = sys.argv[1:]
    if command == "order":
        order(database, rest[0], rest[1])
    else:
        serve_checks(database, int(rest[0]))
