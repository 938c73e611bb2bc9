"""Fair share and ordered keys (contract §16) under real concurrency: gunicorn with 4 workers
over SQLite, and two gunicorn instances over one PostgreSQL database, with 16 claiming clients
spread over them. What ran, and when, is read back from each job's attempts (the stamps the
servers wrote) and sampled straight from the database while the clients work; the clients
also record when they held each job.

One set of servers per setup serves the whole module, which keeps its runtime modest: each
test has job types of its own and claims only those, so no test sees another's jobs.
"""

from __future__ import annotations

import os
import random
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import POSTGRES_URL_VARIABLE
from tests.e2e.client import QueueClient, server_errors
from tests.e2e.test_flow_control import CLIENTS, HOLD_SECONDS, Cluster, Sampler
from tests.servers import LiveServer, create_api_key

pytestmark = pytest.mark.slow

RUN_TIMEOUT_SECONDS = 120
# A claimer's pause after finding nothing: short, so a key's next job meets a crowd of claims,
# and not so short that the idle claims starve the servers of CPU on a small machine.
IDLE_SECONDS = 0.02
JOB_TYPES = ("ordered", "blocking", "fair", "capped", "paused", "spare")
# The most running jobs of one key of an ordered type, now.
PER_KEY_RUNNING = (
    "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM jobs "
    "WHERE type IN ('ordered', 'blocking', 'capped', 'spare') AND status = 'running' "
    "AND concurrency_key IS NOT NULL GROUP BY type, concurrency_key) AS per_key")

SETUPS = [
    pytest.param(("sqlite", 1), id="sqlite"),
    pytest.param(("postgresql", 2), id="two-instances-one-postgresql",
                 marks=pytest.mark.skipif(not os.environ.get(POSTGRES_URL_VARIABLE),
                                          reason="needs PostgreSQL")),
]


@dataclass
class Servers:
    """The module's servers of one setup, over one database, and keys to call them with."""

    database_url: str
    servers: list[LiveServer]
    worker_token: str
    producer_token: str
    admin_token: str


@pytest.fixture(scope="module", params=SETUPS)
def live(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
         sqlite_template: str) -> Iterator[Servers]:
    engine, instances = request.param
    directory: Path = tmp_path_factory.mktemp(f"keys-live-{engine}")
    if engine == "sqlite":
        shutil.copyfile(sqlite_template, directory / "live.sqlite3")
        url = f"sqlite:///{directory / 'live.sqlite3'}"
    else:
        url = request.getfixturevalue("postgres_server").create_database()
    tokens = [create_api_key(url, name, role) for name, role in
              (("worker-1", "worker"), ("producer-1", "producer"), ("admin-1", "admin"))]
    servers = [LiveServer(url, log_path=directory / f"gunicorn-{n}.log", workers=4, threads=4,
                          settings={"JOB_TYPES": ",".join(JOB_TYPES)})
               for n in range(instances)]
    try:
        with ThreadPoolExecutor(max_workers=instances) as starting:
            list(starting.map(LiveServer.start, servers))
        yield Servers(url, servers, *tokens)
    finally:
        with ThreadPoolExecutor(max_workers=instances) as stopping:
            list(stopping.map(LiveServer.stop, servers))


@pytest.fixture
def cluster(live: Servers) -> Iterator[Cluster]:
    """The module's servers, with clients of this test's own (for its "no 5xx" check)."""
    cluster = Cluster(live.database_url, live.servers, live.worker_token, live.producer_token,
                      live.admin_token)
    yield cluster
    for client in cluster.clients:
        client.close()


# -- the claimers ------------------------------------------------------------------------------

@dataclass
class Run:
    """What the claiming clients did. A job whose payload says {"fail": "once"} is failed by
    the first client that holds it (a retry when it has retries left, for good otherwise) and
    completed by the next."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    claims: list[tuple[datetime, int, str | None]] = field(default_factory=list)
    held: list[tuple[float, float, str | None]] = field(default_factory=list)
    completed: set[int] = field(default_factory=set)
    failed_once: set[int] = field(default_factory=set)
    failed_for_good: set[int] = field(default_factory=set)
    unexpected: list[str] = field(default_factory=list)

    def note(self, problem: str) -> None:
        with self.lock:
            self.unexpected.append(problem)

    def most_held_at_once(self, key: str | None) -> int:
        """The most intervals of `key` some client held at one instant: intervals inside the
        jobs' true running intervals, so overlaps can only be undercounted."""
        events = sorted((t, delta) for start, end, k in self.held if k == key
                        for t, delta in ((start, 1), (end, -1)))
        most = now = 0
        for _t, delta in events:
            now += delta
            most = max(most, now)
        return most


def claim_until(clients: list[QueueClient], run: Run, job_types: list[str],
                done: Callable[[Run], bool]) -> None:
    """Every client claims (only `job_types`), holds the job a moment and completes or fails
    it, until `done(run)` holds or something unexpected happens."""
    deadline = time.monotonic() + RUN_TIMEOUT_SECONDS

    def finished() -> bool:
        with run.lock:
            return bool(run.unexpected) or done(run)

    def claimer(client: QueueClient) -> None:
        rng = random.Random()
        while not finished():
            if time.monotonic() > deadline:
                run.note("the run timed out")
                return
            response = client.claim(types=job_types, lease_seconds=600)
            if response.status_code == 204:
                time.sleep(IDLE_SECONDS)
                continue
            if response.status_code != 200:
                run.note(f"claim {response.status_code} {response.text[:200]}")
                return
            job = response.json()
            started = time.monotonic()
            with run.lock:
                run.claims.append((stamp(job["claimed_at"]), job["id"], job["concurrency_key"]))
                fail = job["payload"].get("fail") == "once" and job["id"] not in run.failed_once
                if fail:
                    run.failed_once.add(job["id"])
            time.sleep(rng.uniform(*HOLD_SECONDS))
            ended = time.monotonic()
            if fail:
                report = client.request("POST", f"/jobs/{job['id']}/fail", json={
                    "error": "failed on purpose", "lease_token": job["lease_token"],
                    "retry_in_seconds": job["payload"].get("retry_in", 0)})
            else:
                report = client.complete(job["id"], lease_token=job["lease_token"])
            with run.lock:
                run.held.append((started, ended, job["concurrency_key"]))
                if report.status_code != 200:
                    run.unexpected.append(f"report {report.status_code} {report.text[:200]}")
                elif report.json()["status"] == "completed":
                    run.completed.add(job["id"])
                elif report.json()["status"] == "failed":
                    run.failed_for_good.add(job["id"])

    with ThreadPoolExecutor(max_workers=len(clients)) as pool:
        list(pool.map(claimer, clients))


def stamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def assert_each_key_ran_one_at_a_time_in_order(admin: QueueClient,
                                               ids_by_key: dict[str, list[int]],
                                               twice: set[int]) -> None:
    """From the attempts the servers recorded: a key's attempts, in the order they began, run
    its jobs in enqueue order, a job's retry before the key's next job, each attempt ended
    before the next. `twice`: the jobs that failed once, then completed; every other job
    completed at its first attempt.

    That no two ran at once is the Sampler's to see, in the database: each stamp is the
    clock its process read before its statement ran, so a claim that read the clock a
    moment before the end it follows committed (on another process) may be stamped a moment
    before that end."""
    for key, ids in ids_by_key.items():
        attempts = []
        for job_id in ids:
            response = admin.request("GET", f"/jobs/{job_id}/attempts")
            assert response.status_code == 200, response.text
            attempts += [(stamp(a["claimed_at"]), a["ended_at"] and stamp(a["ended_at"]),
                          job_id, a["outcome"]) for a in response.json()["attempts"]]
        attempts.sort(key=lambda attempt: attempt[0])
        assert [(job_id, outcome) for _at, _end, job_id, outcome in attempts] == [
            (job_id, outcome) for job_id in ids
            for outcome in (["failed", "completed"] if job_id in twice else ["completed"])], key
        for before, after in pairwise(attempts):
            assert before[1] is not None, (key, before, after)


def statuses(admin: QueueClient, job_type: str) -> dict[int, str]:
    return {job["id"]: job["status"] for job in admin.list_all(type=job_type)}


def explain(admin: QueueClient, job_id: int) -> list[dict[str, Any]]:
    response = admin.request("GET", f"/jobs/{job_id}/explain")
    assert response.status_code == 200, response.text
    return list(response.json()["reasons"])


# -- ordered keys ------------------------------------------------------------------------------

def test_an_ordered_key_runs_one_job_at_a_time_in_enqueue_order_through_retries_and_delays(
        cluster: Cluster) -> None:
    cluster.set_type("ordered", ordering="key")
    keys = [f"acct-{n}" for n in range(8)]
    rng = random.Random(31)
    plan: list[list[dict[str, Any]]] = [
        [{"type": "ordered", "concurrency_key": key, "payload": {"n": n}, "max_retries": 1}
         for key in keys] for n in range(25)]
    for body in (body for rounds in plan for body in rounds):
        chance = rng.random()
        if chance < 0.1:
            body["delay_seconds"] = 1
        elif chance < 0.22:
            body["payload"] |= {"fail": "once", "retry_in": rng.choice([0, 0, 1])}
    total = sum(len(rounds) for rounds in plan)
    ids_by_key: dict[str, list[int]] = {key: [] for key in keys}
    run = Run()
    producer = cluster.client(cluster.producer_token, 1)

    def produce() -> None:
        # While the claimers run, so a key's new job meets its turn passing on; one round of
        # the keys as a batch, the next as single enqueues, one producer, so each key's
        # enqueue order is the order the ids come back in.
        for n, bodies in enumerate(plan):
            if n % 2 == 0:
                response = producer.request("POST", "/jobs/batch", json={"jobs": bodies})
                jobs = response.json()["jobs"] if response.status_code == 201 else []
            else:
                answers = [producer.enqueue(body) for body in bodies]
                response = next((a for a in answers if a.status_code != 201), answers[0])
                jobs = [answer.json() for answer in answers]
            if response.status_code != 201:
                run.note(f"enqueue {response.status_code} {response.text[:200]}")
                return
            for job in jobs:
                ids_by_key[job["concurrency_key"]].append(job["id"])
            time.sleep(rng.uniform(0, 0.02))

    with (Sampler(cluster.database_url, PER_KEY_RUNNING) as sampler,
          ThreadPoolExecutor(max_workers=1) as producing):
        produced = producing.submit(produce)
        claim_until(cluster.workers(), run, ["ordered"],
                    lambda run: len(run.completed) == total)
        produced.result()

    assert run.unexpected == []
    assert sampler.largest == 1 and sampler.samples > 50, (sampler.largest, sampler.samples)
    assert max(run.most_held_at_once(key) for key in keys) == 1
    admin = cluster.admin()
    assert set(statuses(admin, "ordered").values()) == {"completed"}
    retried = set(run.failed_once)
    assert retried and not run.failed_for_good
    assert_each_key_ran_one_at_a_time_in_order(admin, ids_by_key, twice=retried)
    print(f"\nordered: {total} jobs of {len(keys)} keys, {len(retried)} retried; "
          f"{sampler.samples} samples, most of one key running at once {sampler.largest}")
    assert server_errors(cluster.clients) == {}


def test_a_failure_blocks_its_key_and_only_its_key_until_an_admin_retries_it(
        cluster: Cluster) -> None:
    cluster.set_type("blocking", ordering="key", on_failure="block")
    keys = [f"k{n}" for n in range(6)]
    bodies: list[dict[str, Any]] = [
        {"type": "blocking", "concurrency_key": key, "payload": {"n": n}}
        for n in range(12) for key in keys]
    bodies[4 * len(keys)] |= {"max_retries": 0, "payload": {"n": 4, "fail": "once"}}  # k0's 5th
    bodies[2 * len(keys) + 3] |= {"max_retries": 1,  # k3's third: a retry, which blocks nothing
                                  "payload": {"n": 2, "fail": "once"}}
    ids = cluster.enqueue(bodies)
    ids_by_key = {key: ids[k::len(keys)] for k, key in enumerate(keys)}
    blocker, behind = ids_by_key["k0"][4], ids_by_key["k0"][5:]
    run = Run()

    with Sampler(cluster.database_url, PER_KEY_RUNNING) as sampler:
        claim_until(cluster.workers(), run, ["blocking"],
                    lambda run: len(run.completed) == len(ids) - 8
                    and blocker in run.failed_for_good)
    assert run.unexpected == []

    admin = cluster.admin()
    # Every other key drained behind the blocked one; the blocked key ran nothing more.
    status = statuses(admin, "blocking")
    assert {status[i] for key in keys[1:] for i in ids_by_key[key]} == {"completed"}
    assert [status[i] for i in ids_by_key["k0"]] == ["completed"] * 4 + ["failed"] + [
        "waiting"] * 7
    assert all(cluster.client(cluster.worker_token, n).claim(types=["blocking"]).status_code
               == 204 for n in range(len(cluster.servers) * 2))
    reason = explain(admin, behind[0])[0]
    assert (reason["code"], reason["job_id"], reason["concurrency_key"]) == (
        "key_blocked", blocker, "k0")
    assert "key_blocked" in [r["code"] for r in explain(admin, blocker)]
    shown = admin.request("GET", "/types/blocking").json()
    assert (shown["ordering"], shown["on_failure"], shown["blocked_keys"]) == ("key", "block", 1)

    retried = admin.request("POST", f"/jobs/{blocker}/retry")
    assert retried.status_code == 200, retried.text
    with Sampler(cluster.database_url, PER_KEY_RUNNING) as drained_sampler:
        claim_until(cluster.workers(), run, ["blocking"],
                    lambda run: len(run.completed) == len(ids))
    assert run.unexpected == []
    assert set(statuses(admin, "blocking").values()) == {"completed"}
    assert admin.request("GET", "/types/blocking").json()["blocked_keys"] == 0
    assert max(sampler.largest, drained_sampler.largest) == 1
    assert_each_key_ran_one_at_a_time_in_order(admin, ids_by_key, twice=run.failed_once)
    assert server_errors(cluster.clients) == {}


# -- fair share --------------------------------------------------------------------------------

def test_with_fair_share_ten_small_keys_are_served_alongside_one_huge_backlog(
        cluster: Cluster) -> None:
    cluster.set_type("fair", fairness="key")
    small = [chr(c) for c in range(ord("B"), ord("K") + 1)]
    cluster.enqueue([{"type": "fair", "concurrency_key": "A"}] * 2000)
    # Each small key's ten together: claim order alone would serve them after A's 2,000.
    small_ids = set(cluster.enqueue([{"type": "fair", "concurrency_key": key}
                                     for key in small for _ in range(10)]))
    run = Run()

    claim_until(cluster.workers(), run, ["fair"], lambda run: small_ids <= run.completed)

    assert run.unexpected == []
    order = [key for _at, _id, key in sorted(run.claims)]
    # Concurrent claims may land out of their claim order by at most the number of claimers.
    # Keys one producer adds together behind its own backlog start one round apart, then take
    # one job each per round (docs/FLOW-CONTROL.md): K's first job is claim 56, the small
    # keys' last claim 119, by when A had 19 turns, one per round.
    last_small = max(n for n, key in enumerate(order) if key != "A")
    assert last_small < 120 + CLIENTS, (last_small, order)
    assert set(order[:66 + CLIENTS]) == {"A", *small}, order[:66 + CLIENTS]  # all served early
    assert order[:120 + CLIENTS].count("A") <= 20 + CLIENTS, order  # A took its turns only
    print(f"\nfair: the last of the small keys' 100 jobs was claim {last_small + 1} "
          f"of {len(order)}; A had {order[:last_small + 1].count('A')} claims by then")
    assert server_errors(cluster.clients) == {}


# -- together with flow control ----------------------------------------------------------------

def test_ordered_keys_caps_a_rate_and_a_paused_type_never_hold_back_other_keys_or_types(
        cluster: Cluster) -> None:
    rate, burst = 20.0, 5
    cluster.set_type("capped", ordering="key", on_failure="block", max_running=3,
                     max_running_per_key=1)
    cluster.set_type("spare", ordering="key", fairness="key", rate_per_second=rate, burst=burst)
    cluster.set_type("paused", paused=True)
    # In claim order the paused type's jobs come first, then the capped type's, then spare's.
    paused = cluster.enqueue([{"type": "paused", "priority": "medium",
                               "concurrency_key": f"p{n % 2}"} for n in range(20)])
    capped_keys, spare_keys = [f"c{n}" for n in range(6)], [f"s{n}" for n in range(4)]
    capped = cluster.enqueue([{"type": "capped", "priority": "medium", "concurrency_key": key,
                               "max_retries": 0, "payload": {"n": n}}
                              for n in range(8) for key in capped_keys])
    spare = cluster.enqueue([{"type": "spare", "priority": "low", "concurrency_key": key}
                             for _ in range(10) for key in spare_keys])
    capped_by_key = {key: capped[k::len(capped_keys)] for k, key in enumerate(capped_keys)}
    spare_by_key = {key: spare[k::len(spare_keys)] for k, key in enumerate(spare_keys)}
    blocker = capped_by_key["c0"][0]
    worker = cluster.client(cluster.worker_token)
    first = worker.claim(types=["capped"]).json()
    assert first["id"] == blocker
    failed = worker.request("POST", f"/jobs/{blocker}/fail", json={"error": "for good"})
    assert failed.status_code == 200 and failed.json()["status"] == "failed"
    job_types = ["paused", "capped", "spare"]
    run = Run()

    with (Sampler(cluster.database_url, PER_KEY_RUNNING) as per_key,
          Sampler(cluster.database_url, "SELECT count(*) FROM jobs WHERE type = 'capped' "
                                        "AND status = 'running'") as capped_running):
        # Every claim meets the paused type and the blocked key first; they take the rest.
        claim_until(cluster.workers(), run, job_types,
                    lambda run: len(run.completed) == len(capped) - 8 + len(spare))
        assert run.unexpected == []
        assert worker.claim(types=job_types).status_code == 204
        admin = cluster.admin()
        assert set(statuses(admin, "paused").values()) == {"pending"}
        assert [job["id"] for job in admin.list_all(type="capped", status="waiting")] == (
            capped_by_key["c0"][1:])
        assert explain(admin, capped_by_key["c0"][1])[0]["code"] == "key_blocked"

        cluster.set_type("paused", paused=False)
        assert admin.request("POST", f"/jobs/{blocker}/retry").status_code == 200
        claim_until(cluster.workers(), run, job_types,
                    lambda run: len(run.completed) == len(capped) + len(spare) + len(paused))

    assert run.unexpected == []
    assert per_key.largest == 1 and capped_running.largest <= 3, (
        per_key.largest, capped_running.largest)
    for job_type in job_types:
        assert set(statuses(admin, job_type).values()) == {"completed"}, job_type
    assert_each_key_ran_one_at_a_time_in_order(admin, capped_by_key, twice={blocker})
    assert_each_key_ran_one_at_a_time_in_order(admin, spare_by_key, twice=set())
    spare_claims = sorted(at for at, _id, key in run.claims if key in spare_keys)
    for count, at in enumerate(spare_claims, start=1):
        # One claim of slack: a claim is stamped when it holds its job, a moment after the
        # rate let it through.
        elapsed = (at - spare_claims[0]).total_seconds()
        assert count <= burst + 1 + rate * elapsed, (count, elapsed)
    print(f"\ncapped at 3: most running at once {capped_running.largest}, of one key "
          f"{per_key.largest}")
    assert server_errors(cluster.clients) == {}
