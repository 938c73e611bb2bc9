"""Peers: 10,000 jobs enqueued, then dequeued and acknowledged, in one process, one job per
operation, through queuelog's repository and through three SQLite-backed Python queues —
huey (SqliteStorage), persist-queue (SQLiteAckQueue) and litequeue (LiteQueue) — in the same
run, each made as durable as it allows (synchronous=FULL, a commit per operation).

    PYTHONPATH=. python bench/peers.py [--smoke] [--repeats N]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/peers.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.data import migrated_database, scratch_directory
from bench.report import Report, Table, Target, run_script
from bench.stats import Spread
from bench.storage import RawWay, RepositoryWay, Statements

FULL_JOBS, SMOKE_JOBS = 10_000, 200
# The queues take turns every TURN jobs (in rotating order), so that the shared machine's
# changing load falls on all of them alike.
TURN = 100
PHASES = ("enqueue", "dequeue + ack")


def message(n: int) -> dict[str, Any]:
    return {"to": f"user-{n}@example.com", "template": "welcome-v2", "locale": "en-GB"}


def synchronous_of(conn: Any) -> str:
    value = conn.execute("PRAGMA synchronous").fetchone()[0]
    return {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(value, str(value))


def journal_of(conn: Any) -> str:
    return str(conn.execute("PRAGMA journal_mode").fetchone()[0]).upper()


class _QueuelogWayPeer:
    """A peer running queuelog's enqueue, claim and complete through one of bench/storage.py's
    ways (`self.way`)."""

    ack = "claim, then complete: two commits; an unacknowledged job returns when its lease ends"
    way: Any

    def enqueue(self, n: int) -> None:
        self.way.enqueue(n)

    def dequeue_ack(self, n: int) -> None:
        self.way.claim(n)
        self.way.complete(n)

    def close(self) -> None:
        self.way.close()


class QueuelogPeer(_QueuelogWayPeer):
    name = "queuelog (repository)"

    def __init__(self, directory: str) -> None:
        self.way = RepositoryWay(migrated_database(directory, "queuelog.sqlite3"), "FULL")

    def durability(self) -> str:
        with self.way.db.engine.connect() as conn:
            raw = conn.connection.dbapi_connection
            return f"{journal_of(raw)}, synchronous={synchronous_of(raw)}"


class QueuelogRawPeer(_QueuelogWayPeer):
    """The floor under queuelog's own code: the statements its repository sends (caught once
    per run) on a bare sqlite3 connection with the engine's pragmas, over the same schema."""

    name = "queuelog's statements on bare sqlite3 (no queuelog code: the schema's floor)"
    statements: Statements | None = None  # set by measure(), once per run

    def __init__(self, directory: str) -> None:
        assert self.statements is not None
        migrated_database(directory, "raw.sqlite3")
        self.way = RawWay(f"{directory}/raw.sqlite3", "FULL", self.statements)

    def durability(self) -> str:
        return f"{journal_of(self.way.conn)}, synchronous={synchronous_of(self.way.conn)}"


class HueyPeer:
    name = "huey SqliteStorage"
    ack = ("none: dequeue deletes the task in one commit; a consumer that dies after it loses "
           "the task")

    def __init__(self, directory: str) -> None:
        from huey.storage import SqliteStorage

        # fsync=True is huey's own switch for synchronous=FULL; WAL is its default.
        self.storage = SqliteStorage(name="bench", filename=f"{directory}/huey.db", fsync=True)

    def durability(self) -> str:
        return f"{journal_of(self.storage.conn)}, synchronous={synchronous_of(self.storage.conn)}"

    def enqueue(self, n: int) -> None:
        # huey stores what it is given as a blob (a pickled task, normally).
        self.storage.enqueue(json.dumps(message(n)).encode())

    def dequeue_ack(self, n: int) -> None:
        if self.storage.dequeue() is None:
            raise RuntimeError("huey: the queue ran dry")

    def close(self) -> None:
        self.storage.close()


class PersistQueuePeer:
    name = "persist-queue SQLiteAckQueue"
    ack = "get marks the row unacked (a commit), ack marks it acked (a commit)"

    def __init__(self, directory: str) -> None:
        from persistqueue import SQLiteAckQueue

        self.queue = SQLiteAckQueue(f"{directory}/persist-queue", auto_commit=True,
                                    multithreading=False)
        # It opens WAL and leaves synchronous at SQLite's default; say FULL explicitly.
        self.queue._putter.execute("PRAGMA synchronous=FULL")

    def durability(self) -> str:
        conn = self.queue._putter
        return f"{journal_of(conn)}, synchronous={synchronous_of(conn)}"

    def enqueue(self, n: int) -> None:
        self.queue.put(message(n))

    def dequeue_ack(self, n: int) -> None:
        item = self.queue.get(block=False, raw=True)
        self.queue.ack(id=item["pqid"])

    def close(self) -> None:
        self.queue.close()


class LiteQueuePeer:
    name = "litequeue LiteQueue"
    ack = "pop locks the message (a commit), done marks it done (a commit)"

    def __init__(self, directory: str) -> None:
        from litequeue import LiteQueue

        self.queue = LiteQueue(f"{directory}/litequeue.db")
        # litequeue sets synchronous=NORMAL itself; raise it to FULL like the others.
        self.queue.conn.execute("PRAGMA synchronous=FULL")

    def durability(self) -> str:
        conn = self.queue.conn
        return f"{journal_of(conn)}, synchronous={synchronous_of(conn)}"

    def enqueue(self, n: int) -> None:
        self.queue.put(json.dumps(message(n)))

    def dequeue_ack(self, n: int) -> None:
        popped = self.queue.pop()
        if popped is None:
            raise RuntimeError("litequeue: the queue ran dry")
        self.queue.done(popped.message_id)

    def close(self) -> None:
        self.queue.conn.close()


PEERS: list[tuple[str, type]] = [("queuelog", QueuelogPeer),
                                 ("queuelog-raw", QueuelogRawPeer), ("huey", HueyPeer),
                                 ("persist-queue", PersistQueuePeer),
                                 ("litequeue", LiteQueuePeer)]


def installed(package: str) -> bool:
    import importlib

    try:
        importlib.import_module({"persist-queue": "persistqueue"}.get(package, package))
    except ImportError:
        return False
    return True


def run_pass(directory: str, repeat: int, count: int,
             available: list[tuple[str, type]]) -> tuple[dict[str, dict[str, float]],
                                                          dict[str, str]]:
    """Every queue enqueues `count` jobs, then dequeues and acknowledges them, in turns.
    Returns (seconds[queue][phase], durability[queue])."""
    peers = {}
    for key, cls in available:
        path = Path(directory) / f"{key}-{repeat}"
        path.mkdir()
        peers[key] = cls(str(path))
    seconds = {key: dict.fromkeys(PHASES, 0.0) for key in peers}
    durability = {key: peer.durability() for key, peer in peers.items()}
    keys = list(peers)
    turn = 0
    try:
        for phase in PHASES:
            for first in range(0, count, TURN):
                turn += 1
                shift = (repeat + turn) % len(keys)
                for key in keys[shift:] + keys[:shift]:
                    peer = peers[key]
                    step = peer.enqueue if phase == "enqueue" else peer.dequeue_ack
                    began = time.perf_counter()
                    for n in range(first, min(first + TURN, count)):
                        step(n)
                    seconds[key][phase] += time.perf_counter() - began
    finally:
        for peer in peers.values():
            peer.close()
    return seconds, durability


def measure(options: Any) -> Report:
    count = SMOKE_JOBS if options.smoke else FULL_JOBS
    report = Report("Peers: queuelog's storage beside other SQLite queues",
                    "python bench/peers.py", options.smoke, options.repeats)
    available = [(key, cls) for key, cls in PEERS
                 if key.startswith("queuelog") or installed(key)]
    missing = [key for key, _ in PEERS if key not in dict(available)]
    rates = {(key, phase): Spread() for key, _ in available for phase in PHASES}
    versus = {(key, phase): Spread() for key, _ in available for phase in PHASES}
    durability: dict[str, str] = {}
    with scratch_directory("queuelog-bench-peers-") as directory:
        QueuelogRawPeer.statements = Statements(directory)
        for repeat in range(options.repeats):
            seconds, durability = run_pass(directory, repeat, count, available)
            for key, _ in available:
                for phase in PHASES:
                    rates[(key, phase)].add(count / seconds[key][phase])
                    versus[(key, phase)].add(seconds[key][phase]
                                             / seconds["queuelog"][phase])
            print(f"repeat {repeat + 1}: " + ", ".join(
                f"{key} {count / seconds[key]['enqueue']:,.0f} enq/s "
                f"{count / seconds[key]['dequeue + ack']:,.0f} deq+ack/s"
                for key, _ in available), file=sys.stderr, flush=True)

    table = Table(f"Jobs/s, {count:,} jobs, one per operation (median [min-max] over repeats)",
                  ["queue", "enqueue jobs/s", "queuelog / it", "dequeue + ack jobs/s",
                   "queuelog / it", "durability as run", "acknowledgement"])
    by_key = dict(PEERS)
    for key, _ in available:
        table.add(by_key[key].name, rates[(key, "enqueue")].show(),
                  "1" if key == "queuelog" else versus[(key, "enqueue")].show(2),
                  rates[(key, "dequeue + ack")].show(),
                  "1" if key == "queuelog" else versus[(key, "dequeue + ack")].show(2),
                  durability.get(key, "?"), by_key[key].ack)
    for key in missing:
        table.add(by_key[key].name, "not installed", "", "", "", "",
                  "pip install '.[bench]' to include it")
    report.tables.append(table)
    if "huey" in dict(available):
        # Ahead on enqueue; on dequeue, at least half of a queue that deletes in one commit
        # and has no acknowledgement (queuelog claims and completes: two commits).
        enqueue, dequeue = versus[("huey", "enqueue")], versus[("huey", "dequeue + ack")]
        report.targets += [
            Target("queuelog ahead of huey: enqueue", "queuelog / huey > 1", enqueue.show(2),
                   enqueue.median > 1),
            Target("queuelog beside huey: dequeue + ack (huey: dequeue alone, no ack)",
                   "queuelog / huey ≥ 0.5", dequeue.show(2), dequeue.median >= 0.5)]
    report.notes += [
        "One thread; every operation commits on its own (none of these queues batches "
        "commits for a single caller). 'queuelog / it' is queuelog's jobs/s over the "
        "peer's, from the same repeat.",
        "queuelog runs JobRepository.insert_job, claim_next_jobs (limit 1) and "
        "update_held_job through Database.run_write, the service's own write path, on the "
        "app's engine (WAL, synchronous=FULL); its jobs carry the columns the API stores "
        "(priorities, leases, a result on complete).",
        "Durability: every queue ran with synchronous=FULL, read back from its own "
        "connection (column 'durability as run'). huey via its fsync=True option; "
        "persist-queue and litequeue by a PRAGMA on their connection after opening "
        "(litequeue sets NORMAL itself; persist-queue leaves SQLite's default). None "
        "needed to be left below FULL.",
        "Acknowledgement differs (column 'acknowledgement'): huey has none, so its "
        "'dequeue + ack' is one delete and one commit against two commits for the others; "
        "the comparison with huey favours huey on that phase.",
    ]
    report.notes.append(
        "The bare-sqlite3 row runs the very statements queuelog's repository sends (caught "
        "from SQLAlchemy's before_cursor_execute in a probe, as bench/storage.py does) with "
        "the engine's pragmas, over the same migrated schema: what queuelog's row and indexes "
        "cost before any of queuelog's Python runs. The gap between it and huey is the "
        "schema's (a 19-column row in its table and indexes against huey's 4 columns and one "
        "index); the gap between queuelog and it is queuelog's code (run_write, the "
        "repository, SQLAlchemy's transaction).")
    if missing:
        report.notes.append(f"Not installed here, so not measured: {', '.join(missing)}.")
    return report


def main(argv: list[str] | None = None) -> None:
    run_script(measure, __doc__, argv)


if __name__ == "__main__":
    main()
