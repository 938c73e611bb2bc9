"""Workflows (docs/WORKFLOWS.md): how soon a dependency's complete wakes its dependent, a 1,000-job
workflow beside the same jobs through /jobs/batch, and what a fan-in's last complete costs
beside its first.

1. Wake latency under load: N chains (a dependency and its dependent, one POST /workflows).
   For each, a worker claims the dependency, another worker's POST /jobs/claim waits
   (wait_seconds) for the dependents' type, and the first completes the dependency: the
   figure is the time from the complete's answer to the waiting claim's answer with the
   dependent; p50 and p99 over the N chains, while other clients enqueue, claim and complete
   jobs of another type as fast as they can.
2. Enqueue: one POST /workflows of 1,000 jobs (10 roots, each with 99 dependents) against one
   POST /jobs/batch of the same 1,000 job bodies without the graph, taking turns: jobs/s of
   each and their ratio.
3. Fan-in: 2,000 children under 20 joiners (each waits on 100 children; one POST /workflows
   each) and a final job waiting on the 20 joiners. One worker claims and completes every
   job over HTTP, one at a time; the figure is each complete's duration on the server (its
   request log line), the first child's of each joiner against its last child's (the one
   that makes the joiner pending), and the same over the whole tree.

    PYTHONPATH=. python bench/workflows.py [--smoke] [--repeats N]

With QUEUELOG_BENCH_POSTGRES_URL set to a PostgreSQL server URL, every row is measured on
PostgreSQL as well, in databases of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as `python bench/workflows.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.background import LOAD_TYPE, BackgroundLoad
from bench.data import (
    JOB_TYPES,
    POSTGRES_VARIABLE,
    RESULT,
    create_keys,
    job_body,
    migrated_database,
    postgres_database,
    scratch_directory,
)
from bench.load import Client, HttpError, settle
from bench.report import Report, Table, Target, run_script
from bench.servers import queuelog_server
from bench.stats import Spread, ms, percentile
from tests.servers import GunicornServer

# Each row's jobs are of types nothing else there claims, so that no claim takes another's job:
# the background load's jobs and the fan-in's children; a chain's dependency and the fan-in's
# final job; a chain's dependent and the fan-in's joiners.
FIRST_TYPE, SECOND_TYPE = "charge", "report"
SERVER_TYPES = f"{JOB_TYPES},{FIRST_TYPE}"
KEYS = {"producer": "producer", "worker-0": "worker", "worker-1": "worker",
        "load-producer": "producer", "load-worker": "worker"}
# Sent as X-Request-ID: the request log names each complete by it.
REQUEST_ID_HEADER = "X-Request-ID"
FAN_IN_REQUEST = "fan-in-"


@dataclass(frozen=True)
class Sizes:
    chains: int  # row 1: samples per repeat
    load_clients: int  # row 1: background clients
    roots: int  # row 2: the workflow's roots ...
    fan_out: int  # ... and the dependents of each
    rounds: int  # row 2: requests of each kind per repeat
    joiners: int  # row 3: joiners ...
    children: int  # ... and the children of each (depends_on takes at most 100)


FULL = Sizes(chains=100, load_clients=4, roots=10, fan_out=99, rounds=5, joiners=20,
             children=100)
SMOKE = Sizes(chains=3, load_clients=2, roots=2, fan_out=4, rounds=1, joiners=2, children=3)
WAIT_SECONDS = 5
# Long enough for the waiting claim to have found nothing and be waiting.
SETTLE_SECONDS = 0.2
WAKE_GOAL_MS = 100
ENQUEUE_GOAL = 0.5
FAN_IN_TOLERANCE = 0.2


@contextlib.contextmanager
def fresh_database(engine: str, directory: str, name: str) -> Iterator[str]:
    """A fresh migrated database of `engine`; a PostgreSQL one is dropped after."""
    if engine == "PostgreSQL":
        with postgres_database(os.environ[POSTGRES_VARIABLE]) as url:
            yield url
    else:
        yield migrated_database(directory, f"{name}.sqlite3")


def logging_server(directory: str, url: str) -> GunicornServer:
    """queuelog as bench/servers.py starts it, keeping its stdout: the request log, one JSON
    line per request with its request_id and duration_ms."""
    return queuelog_server(directory, url, keep_stdout=True,
                           QUEUELOG_JOB_TYPES=SERVER_TYPES)


def complete(client: Client, job: dict[str, Any], request_id: str | None = None) -> float:
    """Complete a claimed job; returns the ms until its answer was read."""
    if request_id is not None:
        client.headers[REQUEST_ID_HEADER] = request_id
    try:
        began = time.perf_counter()
        client.call("POST", f"/jobs/{job['id']}/complete",
                    {"lease_token": job["lease_token"], "result": RESULT}, expect=(200,))
        return ms(time.perf_counter() - began)
    finally:
        client.headers.pop(REQUEST_ID_HEADER, None)


def claim(client: Client, job_type: str, wait_seconds: float = 0) -> dict[str, Any] | None:
    body: dict[str, Any] = {"types": [job_type]}
    if wait_seconds:
        body["wait_seconds"] = wait_seconds
    status, job = client.call("POST", "/jobs/claim", body, expect=(200, 204))
    return job if status == 200 else None


# -- 1. wake latency under load ------------------------------------------------------------------

def chain_jobs(chains: int) -> list[dict[str, Any]]:
    jobs: list[dict[str, Any]] = []
    for i in range(chains):
        jobs.append({"ref": f"dependency-{i}", "type": FIRST_TYPE, "payload": {"chain": i}})
        jobs.append({"ref": f"dependent-{i}", "type": SECOND_TYPE, "payload": {"chain": i},
                     "depends_on": [f"dependency-{i}"]})
    return jobs


def wait_for_dependent(waiter: Client, answered: dict[str, Any]) -> None:
    """A worker's long-polling claim for a dependent; its answer and when it was read."""
    job = claim(waiter, SECOND_TYPE, WAIT_SECONDS)
    answered["at"], answered["job"] = time.perf_counter(), job


def wake_latencies(port: int, tokens: dict[str, str], chains: int, name: str) -> list[float]:
    """ms from each dependency's complete (its answer read) to the waiting claim's answer with
    the dependent. Negative when the claim answered first: it saw the commit before the
    completing worker had read its answer."""
    producer, driver = Client(port, tokens["producer"]), Client(port, tokens["worker-0"])
    waiter = Client(port, tokens["worker-1"])
    latencies = []
    try:
        _, workflow = producer.call("POST", "/workflows",
                                    {"name": name, "jobs": chain_jobs(chains)}, expect=(201,))
        ids = workflow["jobs"]
        dependent_of = {ids[f"dependency-{i}"]: ids[f"dependent-{i}"] for i in range(chains)}
        for _ in range(chains):
            dependency = claim(driver, FIRST_TYPE)
            if dependency is None:
                raise HttpError("no dependency of the chains was claimable")
            answered: dict[str, Any] = {}
            waiting = threading.Thread(target=wait_for_dependent, args=(waiter, answered),
                                       daemon=True)
            waiting.start()
            settle(SETTLE_SECONDS)
            complete(driver, dependency)
            completed = time.perf_counter()
            waiting.join(WAIT_SECONDS + 10)
            job = answered.get("job")
            if job is None or job["id"] != dependent_of[dependency["id"]]:
                raise HttpError(f"the waiting claim answered {job!r}, not the dependent of "
                                f"job {dependency['id']}")
            latencies.append(ms(answered["at"] - completed))
            complete(waiter, job)  # not timed: no lease left to expire and requeue it
    finally:
        for client in (producer, driver, waiter):
            client.close()
    return latencies


@dataclass
class Wake:
    p50: Spread = field(default_factory=Spread)
    p99: Spread = field(default_factory=Spread)
    worst: Spread = field(default_factory=Spread)
    load: Spread = field(default_factory=Spread)


def measure_wake(engine: str, directory: str, sizes: Sizes, repeats: int) -> Wake:
    wake = Wake()
    with fresh_database(engine, directory, "wake") as url:
        tokens = create_keys(url, KEYS)
        with queuelog_server(directory, url, QUEUELOG_JOB_TYPES=SERVER_TYPES) as server:
            for repeat in range(repeats):
                with BackgroundLoad(server.port, tokens["load-producer"], tokens["load-worker"],
                                    sizes.load_clients) as load:
                    samples = wake_latencies(server.port, tokens, sizes.chains,
                                             f"chains-{repeat}")
                    load.check()
                    wake.load.add(load.jobs_per_second())
                wake.p50.add(percentile(samples, 50))
                wake.p99.add(percentile(samples, 99))
                wake.worst.add(max(samples))
                print(f"{engine} repeat {repeat + 1}: wake p50 {percentile(samples, 50):.1f} "
                      f"ms, p99 {percentile(samples, 99):.1f} ms, background "
                      f"{wake.load.values[-1]:,.0f} jobs/s", file=sys.stderr, flush=True)
    return wake


# -- 2. a 1,000-job workflow against /jobs/batch -------------------------------------------------

def workflow_graph(roots: int, fan_out: int) -> list[dict[str, Any]]:
    """`roots` roots, each followed by its `fan_out` dependents: the job bodies /jobs/batch
    gets, with a ref each and the dependents' depends_on."""
    jobs: list[dict[str, Any]] = []
    for root in range(roots):
        jobs.append({**job_body(len(jobs)), "ref": f"root-{root}"})
        jobs += [{**job_body(len(jobs) + d), "ref": f"root-{root}.{d}",
                  "depends_on": [f"root-{root}"]} for d in range(fan_out)]
    return jobs


@dataclass
class Enqueue:
    workflow: Spread = field(default_factory=Spread)
    batch: Spread = field(default_factory=Spread)
    workflow_ms: Spread = field(default_factory=Spread)
    batch_ms: Spread = field(default_factory=Spread)
    ratio: Spread = field(default_factory=Spread)


def measure_enqueue(engine: str, directory: str, sizes: Sizes, repeats: int) -> Enqueue:
    graph = workflow_graph(sizes.roots, sizes.fan_out)
    plain = [{k: v for k, v in job.items() if k not in ("ref", "depends_on")} for job in graph]
    figures = Enqueue()
    with fresh_database(engine, directory, "enqueue") as url:
        tokens = create_keys(url, KEYS)
        with queuelog_server(directory, url, QUEUELOG_JOB_TYPES=SERVER_TYPES) as server:
            client = Client(server.port, tokens["producer"])
            try:
                for repeat in range(repeats):
                    seconds: dict[str, list[float]] = {"workflow": [], "batch": []}
                    for turn in range(sizes.rounds):
                        kinds = ["workflow", "batch"]
                        if (repeat + turn) % 2:
                            kinds.reverse()
                        for kind in kinds:
                            began = time.perf_counter()
                            if kind == "workflow":
                                client.call("POST", "/workflows", {
                                    "name": f"fan-out-{repeat}-{turn}", "jobs": graph},
                                    expect=(201,))
                            else:
                                client.call("POST", "/jobs/batch", {"jobs": plain},
                                            expect=(201,))
                            seconds[kind].append(time.perf_counter() - began)
                    rates = {kind: len(graph) * len(values) / sum(values)
                             for kind, values in seconds.items()}
                    figures.workflow.add(rates["workflow"])
                    figures.batch.add(rates["batch"])
                    figures.workflow_ms.add(ms(statistics.median(seconds["workflow"])))
                    figures.batch_ms.add(ms(statistics.median(seconds["batch"])))
                    figures.ratio.add(rates["workflow"] / rates["batch"])
                    print(f"{engine} repeat {repeat + 1}: workflow {rates['workflow']:,.0f} "
                          f"jobs/s, batch {rates['batch']:,.0f} jobs/s",
                          file=sys.stderr, flush=True)
            finally:
                client.close()
    return figures


# -- 3. fan-in: the first and the last complete --------------------------------------------------

def build_fan_in(client: Client, joiners: int, children: int,
                 name: str) -> tuple[dict[int, int], list[int]]:
    """The tree: returns ({child id: its joiner's index}, the joiners' ids)."""
    joiner_of: dict[int, int] = {}
    joiner_ids = []
    for j in range(joiners):
        refs = [f"child-{k}" for k in range(children)]
        jobs = [{"ref": ref, "type": LOAD_TYPE, "payload": {"joiner": j, "child": k}}
                for k, ref in enumerate(refs)]
        jobs.append({"ref": "joiner", "type": SECOND_TYPE, "payload": {"joiner": j},
                     "depends_on": refs})
        _, workflow = client.call("POST", "/workflows", {"name": f"{name}-{j}", "jobs": jobs},
                                  expect=(201,))
        joiner_of.update({workflow["jobs"][ref]: j for ref in refs})
        joiner_ids.append(workflow["jobs"]["joiner"])
    client.call("POST", "/jobs", {"type": FIRST_TYPE, "payload": {"final": True},
                                  "depends_on": joiner_ids}, expect=(201,))
    return joiner_of, joiner_ids


@dataclass
class Completes:
    """One repeat's completes: request ids and client-side ms, in the order they were made."""

    children: list[tuple[int, str, float]] = field(default_factory=list)  # (joiner, id, ms)
    joiners: list[tuple[str, float]] = field(default_factory=list)


def complete_fan_in(client: Client, joiner_of: dict[int, int], joiners: int) -> Completes:
    """One worker claims and completes every child, then every joiner, then the final job."""
    done = Completes()
    while (job := claim(client, LOAD_TYPE)) is not None:
        request_id = f"{FAN_IN_REQUEST}{job['id']}"
        done.children.append((joiner_of[job["id"]], request_id,
                              complete(client, job, request_id)))
    if len(done.children) != len(joiner_of):
        raise HttpError(f"{len(done.children)} children claimed, not {len(joiner_of)}")
    while (job := claim(client, SECOND_TYPE)) is not None:
        request_id = f"{FAN_IN_REQUEST}{job['id']}"
        done.joiners.append((request_id, complete(client, job, request_id)))
    if len(done.joiners) != joiners:
        raise HttpError(f"{len(done.joiners)} joiners became claimable, not {joiners}")
    final = claim(client, FIRST_TYPE)
    if final is None:
        raise HttpError("the final job did not become claimable after its joiners")
    complete(client, final)
    return done


def server_durations(server: GunicornServer) -> dict[str, float]:
    """{request id: duration_ms} of the completes in the server's request log."""
    durations = {}
    for line in server.stdout().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if str(entry.get("request_id")).startswith(FAN_IN_REQUEST) \
                and entry.get("path", "").endswith("/complete"):
            durations[entry["request_id"]] = float(entry["duration_ms"])
    return durations


# The fan-in table's rows: what is compared with what.
FAN_IN_ROWS = ("each joiner", "whole tree", "final job")


@dataclass
class FirstLast:
    first: Spread = field(default_factory=Spread)
    last: Spread = field(default_factory=Spread)
    ratio: Spread = field(default_factory=Spread)
    first_client: Spread = field(default_factory=Spread)
    last_client: Spread = field(default_factory=Spread)

    def add(self, first: float, last: float, first_client: float, last_client: float) -> None:
        self.first.add(first)
        self.last.add(last)
        self.ratio.add(last / first)
        self.first_client.add(first_client)
        self.last_client.add(last_client)


@dataclass
class FanIn:
    rows: dict[str, FirstLast] = field(
        default_factory=lambda: {row: FirstLast() for row in FAN_IN_ROWS})
    any_child: Spread = field(default_factory=Spread)
    any_child_client: Spread = field(default_factory=Spread)


def summarise_fan_in(done: Completes, durations: dict[str, float], fan_in: FanIn) -> None:
    by_joiner: dict[int, list[tuple[str, float]]] = {}
    for joiner, request_id, client_ms in done.children:
        by_joiner.setdefault(joiner, []).append((request_id, client_ms))
    # Each joiner: the median over joiners of its first child's complete, and of its last's.
    firsts = [completes[0] for completes in by_joiner.values()]
    lasts = [completes[-1] for completes in by_joiner.values()]
    fan_in.rows["each joiner"].add(
        statistics.median(durations[request_id] for request_id, _ in firsts),
        statistics.median(durations[request_id] for request_id, _ in lasts),
        statistics.median(client_ms for _, client_ms in firsts),
        statistics.median(client_ms for _, client_ms in lasts))
    (_, first_id, first_ms), (_, last_id, last_ms) = done.children[0], done.children[-1]
    fan_in.rows["whole tree"].add(durations[first_id], durations[last_id], first_ms, last_ms)
    (first_id, first_ms), (last_id, last_ms) = done.joiners[0], done.joiners[-1]
    fan_in.rows["final job"].add(durations[first_id], durations[last_id], first_ms, last_ms)
    fan_in.any_child.add(statistics.median(durations[request_id]
                                           for _, request_id, _ in done.children))
    fan_in.any_child_client.add(statistics.median(client_ms for *_, client_ms in done.children))


def measure_fan_in(engine: str, directory: str, sizes: Sizes, repeats: int) -> FanIn:
    fan_in = FanIn()
    with fresh_database(engine, directory, "fan-in") as url:
        tokens = create_keys(url, KEYS)
        with logging_server(directory, url) as server:
            producer, worker = Client(server.port, tokens["producer"]), Client(
                server.port, tokens["worker-0"])
            try:
                for repeat in range(repeats):
                    joiner_of, _ = build_fan_in(producer, sizes.joiners, sizes.children,
                                                f"fan-in-{repeat}")
                    done = complete_fan_in(worker, joiner_of, sizes.joiners)
                    summarise_fan_in(done, server_durations(server), fan_in)
                    row = fan_in.rows["each joiner"]
                    print(f"{engine} repeat {repeat + 1}: a joiner's first child's complete "
                          f"{row.first.values[-1]:.2f} ms, its last's {row.last.values[-1]:.2f}"
                          " ms (server)", file=sys.stderr, flush=True)
            finally:
                producer.close()
                worker.close()
    return fan_in


# -- the report ----------------------------------------------------------------------------------

def within_tolerance(ratio: Spread) -> bool:
    return abs(ratio.median - 1) <= FAN_IN_TOLERANCE


def measure(options: Any) -> Report:
    sizes = SMOKE if options.smoke else FULL
    engines = ["SQLite"] + (["PostgreSQL"] if os.environ.get(POSTGRES_VARIABLE) else [])
    report = Report("Workflows: dependency wake-up, enqueue, fan-in", "python bench/workflows.py",
                    options.smoke, options.repeats)
    wakes: dict[str, Wake] = {}
    enqueues: dict[str, Enqueue] = {}
    fan_ins: dict[str, FanIn] = {}
    with scratch_directory("queuelog-bench-workflows-") as directory:
        for engine in engines:
            wakes[engine] = measure_wake(engine, directory, sizes, options.repeats)
            enqueues[engine] = measure_enqueue(engine, directory, sizes, options.repeats)
            fan_ins[engine] = measure_fan_in(engine, directory, sizes, options.repeats)

    wake_table = Table(
        f"Dependency wake-up under load: the dependency's complete answered → the waiting "
        f"claim's answer with its dependent, ms, {sizes.chains} chains per repeat (median "
        "[min-max] over repeats of each repeat's percentiles)",
        ["database", "background load jobs/s", "p50", "p99", "max", "goal (p99)"])
    for engine, wake in wakes.items():
        wake_table.add(engine, wake.load.show(), wake.p50.show(1), wake.p99.show(1),
                       wake.worst.show(1), f"≤ {WAKE_GOAL_MS} ms")
    report.tables.append(wake_table)

    jobs = sizes.roots * (1 + sizes.fan_out)
    enqueue_table = Table(
        f"Enqueue of {jobs:,} jobs in one request: a workflow ({sizes.roots} roots x "
        f"{sizes.fan_out} dependents) vs /jobs/batch, {sizes.rounds} of each per repeat in "
        "turns (median [min-max] over repeats)",
        ["database", "workflow jobs/s", "batch jobs/s", "workflow ms", "batch ms",
         "workflow / batch", "goal"])
    for engine, figures in enqueues.items():
        enqueue_table.add(engine, figures.workflow.show(), figures.batch.show(),
                          figures.workflow_ms.show(1), figures.batch_ms.show(1),
                          figures.ratio.show(2), f"≥ {ENQUEUE_GOAL}")
    report.tables.append(enqueue_table)

    children = sizes.joiners * sizes.children
    labels = {
        "each joiner": f"a joiner's first child vs its last ({sizes.children} each; median of "
                       f"{sizes.joiners} joiners)",
        "whole tree": f"the first of all {children:,} children vs the last",
        "final job": f"the final job's first joiner vs its last ({sizes.joiners})",
    }
    fan_in_table = Table(
        f"Fan-in: one worker's complete over HTTP, server-side ms (the request log's "
        f"duration_ms), first vs last dependency to finish, {children:,} children under "
        f"{sizes.joiners} joiners (median [min-max] over repeats)",
        ["database", "completes compared", "first", "last", "last / first", "goal",
         "client first", "client last"])
    for engine, fan_in in fan_ins.items():
        for row, label in labels.items():
            first_last = fan_in.rows[row]
            fan_in_table.add(engine, label, first_last.first.show(2), first_last.last.show(2),
                             first_last.ratio.show(2), f"1 ± {FAN_IN_TOLERANCE}",
                             first_last.first_client.show(2), first_last.last_client.show(2))
        fan_in_table.add(engine, f"any child (median of {children:,})",
                         fan_in.any_child.show(2), "", "", "", fan_in.any_child_client.show(2),
                         "")
    report.tables.append(fan_in_table)

    for engine in engines:
        wake = wakes[engine]
        report.targets.append(Target(
            f"dependency wake-up under load, p99, {engine}", f"≤ {WAKE_GOAL_MS} ms",
            wake.p99.show(1, " ms"), wake.p99.median <= WAKE_GOAL_MS))
        ratio = enqueues[engine].ratio
        report.targets.append(Target(
            f"{jobs:,}-job workflow / {jobs:,} jobs through /jobs/batch, jobs/s, {engine}",
            f"≥ {ENQUEUE_GOAL}", ratio.show(2), ratio.median >= ENQUEUE_GOAL))
        ratio = fan_ins[engine].rows["each joiner"].ratio
        report.targets.append(Target(
            f"fan-in: last complete / first, {labels['each joiner']}, server-side, {engine}",
            f"1 ± {FAN_IN_TOLERANCE}", ratio.show(2), within_tolerance(ratio)))
    report.notes += [
        "One gunicorn server under the shipped gunicorn.conf.py (workers = cores, 16 threads "
        "each) per row and database, over a fresh SQLite file (synchronous=FULL) or, with "
        "QUEUELOG_BENCH_POSTGRES_URL set, a fresh PostgreSQL database on the same machine.",
        f"Wake-up: the chains are one POST /workflows per repeat. For each, worker A claims "
        f"the dependency; worker B's POST /jobs/claim (types=['{SECOND_TYPE}'], wait_seconds="
        f"{WAIT_SECONDS}) starts, {SETTLE_SECONDS * 1000:.0f} ms later (plus a random 0-50 ms, "
        "so that the 50 ms peek is not lined up with the complete and a wake that failed "
        "shows) A completes the dependency, and the figure is B's answer minus the moment A "
        "read the complete's answer (negative when B answered first). A claim waiting in the "
        "gunicorn worker that ran the complete is woken at once; in the other by the "
        "datagram that worker sends it (app/jobs/wake/host_wake.py), its next peek (every 50 ms) "
        f"the fallback. Meanwhile {sizes.load_clients} clients "
        f"in a process of their own each loop POST /jobs, a claim of '{LOAD_TYPE}' and its "
        "complete, as fast as the server answers (the load column: jobs through that cycle "
        f"per second). With {sizes.chains} samples, nearest-rank p99 is the largest or "
        "second largest.",
        f"Enqueue: the same {jobs:,} job bodies (about 130 bytes each) as one POST /workflows "
        "(each with a ref, the dependents' depends_on naming their root's ref) and as one "
        "POST /jobs/batch; each request timed from sending to its 201 read, one client. "
        "jobs/s = jobs / the repeat's summed request times; the kinds alternate which "
        "goes first.",
        f"Fan-in: each joiner and its {sizes.children} children are one POST /workflows; "
        f"the final job (POST /jobs) depends on the {sizes.joiners} joiners. One worker "
        f"claims the '{LOAD_TYPE}' children one by one in claim order and completes each, "
        f"then the '{SECOND_TYPE}' joiners, then the final job: every complete is alone on "
        "the server. 'First' is the complete that left a joiner waiting on one fewer, 'last' "
        "the one that made it pending (in the same transaction). Server-side: duration_ms "
        "of the complete's line in the request log (matched by X-Request-ID); 'client' "
        "columns: the same request timed by the worker. The target is the joiners' row "
        f"(a median over {sizes.joiners} joiners each repeat); the whole tree's and the "
        "final job's rows compare one request with one other each repeat, so their ratios "
        "swing with whatever else the machine did in those few milliseconds.",
        "The clients are threads of this process (and the background load's process), "
        "sharing the 2 cores with the server.",
    ]
    return report


def main(argv: list[str] | None = None) -> None:
    run_script(measure, __doc__, argv)


if __name__ == "__main__":
    main()
