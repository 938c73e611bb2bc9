"""Issue 30's first promise, under real gunicorn (4 workers): no job ever waits forever, and
none runs early.

Producers enqueue a few hundred workflows of mixed shapes (pairs, diamonds, fans, chains 20
deep) and a fan-in over 2,000 leaves while 16 worker threads claim and complete. Many
dependents are enqueued (POST /jobs with depends_on) while the workers are completing the
jobs they name: the fan-in's joiners over leaves being completed, a follower of each
workflow, chains built link by link. Each such completion races the enqueue of its dependent.

After the run every job has ended as its graph says, nothing is waiting (GET /types,
GET /jobs?status=waiting), and no job was claimed before each of its dependencies had
finished: by the server's timestamps (its first attempt's claimed_at against the
dependency's terminal event) and by what the clients saw (a claim answered before the
dependency's report was even sent).

Three runs on each engine: every job completes; some jobs fail for good and their dependents
are cancelled (on_dependency_failure cancel, transitively) or run anyway (run); and the
server killed with SIGKILL (its whole process group) mid-run and started again on the same
database, after which the expired leases of the jobs the dead server held bring them back.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests

from tests.e2e.client import QueueClient, server_errors
from tests.e2e.conftest import StartServer
from tests.servers import LiveServer, create_api_key
from tests.told_history import told_histories

pytestmark = pytest.mark.slow

TYPES = ("email", "pdf", "sync")  # the types LiveServer configures
POLICIES = (None, "cancel", "run")  # on_dependency_failure as sent; None: not sent (cancel)
PRODUCERS = 4
WORKERS = 16  # half claim one job at a time, half claim-many
CLAIM_MANY = 5
WAIT_SECONDS = 1  # claims long-poll, so that idle workers do not spin on a small machine
PACING_POLL_SECONDS = 0.002
# A joiner is enqueued once this many of its leaves have been reported on (in turn), or after
# JOINER_PACING_SECONDS; a chain's next link once its last one was, or after LINK_PACING_SECONDS.
JOINER_RACES_AT = (90, 98, 100, 100)
JOINER_PACING_SECONDS = 10.0
LINK_PACING_SECONDS = 0.5
IDLE_PAUSE_SECONDS = 0.05  # after an empty answer (past the server's budget of waiting claims)
RUN_SECONDS = 240  # every loop of a run gives up by then
RETRY_PAUSE_SECONDS = 0.2  # before a request the kill cut off is sent again
DRAIN_POLL_SECONDS = 0.5
# The drain fails when the unfinished jobs have not been one fewer for this long: with 16
# workers claiming, what is left then is stuck (the kill run's leases last 2 s).
STALL_SECONDS = 30
# Counted afresh for each GET /types: the drain and the final check read the counts of now.
# Long-polling claims take at most 2 of a process's 4 threads (the setting's advice): with
# every thread waiting, a worker's complete queued behind them for longer than a 2 s lease.
SERVER_SETTINGS = {"TYPE_COUNTS_MAX_AGE_SECONDS": "0", "MAX_WAITING_CLAIMS": "2"}
DEPTH = 20
FAN_IN_WIDTH = 100  # depends_on's cap: the fan-in over thousands is a tree of joiners
WORKFLOW_CAP = 1000  # jobs in one POST /workflows
CROSS_LINK_SHARE = 0.3  # workflows whose first job also depends on an earlier job
FINISHED_EVENTS = ("completed", "failed", "cancelled")
UNFINISHED = ("waiting", "pending", "running")
API_SAMPLE = 40
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Workload:
    workflows: int  # small workflows of mixed shapes, spread over the producers
    chains: int  # chains DEPTH deep: every other one sent link by link with POST /jobs
    leaves: int  # the fan-in's leaves: a joiner per FAN_IN_WIDTH of them, one final job
    fail_rate: float = 0.0  # jobs that fail for good (max_retries 0)
    leaf_fail_rate: float = 0.0
    # No lease runs out in a run without a kill, so each job is claimed once; with a kill,
    # the jobs the dead server held come back soon, and may be claimed many times.
    lease_seconds: int = 600
    max_retries: int = 3
    kill: bool = False


EVERY_JOB_COMPLETES = Workload(workflows=240, chains=4, leaves=2000)
SOME_FAIL_FOR_GOOD = Workload(workflows=200, chains=2, leaves=300, fail_rate=0.15,
                              leaf_fail_rate=0.005)
KILLED_MID_RUN = Workload(workflows=200, chains=4, leaves=2000, lease_seconds=2,
                          max_retries=10, kill=True)


@dataclass(eq=False)
class Node:
    """A job of the plan: what the test sends, and from which it knows how the job must end."""

    key: str  # unique in the run; the job's ref in its workflow
    type: str
    deps: list[Node] = field(default_factory=list)
    policy: str | None = None
    fails: bool = False
    id: int = 0  # once enqueued

    def body(self, max_retries: int, refs: Iterable[Node] = ()) -> dict[str, Any]:
        """The POST /jobs body; dependencies among `refs` are named by ref, others by id."""
        in_request = set(refs)
        body: dict[str, Any] = {"type": self.type,
                                "payload": {"key": self.key, "fail": self.fails},
                                "max_retries": 0 if self.fails else max_retries}
        if self.deps:
            body["depends_on"] = [dep.key if dep in in_request else dep.id
                                  for dep in self.deps]
        if self.policy is not None:
            body["on_dependency_failure"] = self.policy
        return body


@dataclass
class Claim:
    job_id: int
    worker: str
    claimed_at_us: int  # the claim answer's claimed_at
    answered: float  # time.monotonic() when the answer arrived


@dataclass
class Run:
    """What every thread of one run shares: the plan as enqueued and what the clients saw."""

    workload: Workload
    deadline: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    nodes: dict[int, Node] = field(default_factory=dict)  # by job id
    workflows: dict[int, list[Node]] = field(default_factory=dict)
    claims: list[Claim] = field(default_factory=list)
    reports_sent: dict[int, float] = field(default_factory=dict)  # job id -> the first one
    joiners_waiting_on: list[int] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    workflows_enqueued: int = 0
    half_enqueued: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)

    def enqueued(self, nodes: list[Node], workflow_id: int | None = None) -> None:
        with self.lock:
            for node in nodes:
                self.nodes[node.id] = node
            if workflow_id is not None:
                self.workflows[workflow_id] = nodes
                self.workflows_enqueued += 1
                if self.workflows_enqueued * 2 >= self.workload.workflows:
                    self.half_enqueued.set()

    def recent(self, rng: random.Random) -> Node | None:
        """A job enqueued a moment ago, by any producer: unfinished, or finishing, or done."""
        with self.lock:
            ids = list(self.nodes)[-200:]
            return self.nodes[rng.choice(ids)] if ids else None

    def claimed(self, worker: str, jobs: list[dict[str, Any]], answered: float) -> None:
        with self.lock:
            self.claims.extend(Claim(job["id"], worker, micros(job["claimed_at"]), answered)
                               for job in jobs)

    def reporting(self, job_id: int) -> None:
        """Noted before the report is sent: no dependent may be claimed before this."""
        with self.lock:
            self.reports_sent.setdefault(job_id, time.monotonic())

    def await_reports(self, nodes: list[Node], at_least: int, cap_seconds: float) -> None:
        """Until a report on `at_least` of `nodes` has been sent (it is landing, or has), or
        `cap_seconds` have passed: a producer paced so that its dependent's enqueue meets the
        completion of the last dependencies."""
        until = min(self.deadline, time.monotonic() + cap_seconds)
        while time.monotonic() < until:
            with self.lock:
                if sum(node.id in self.reports_sent for node in nodes) >= at_least:
                    return
            time.sleep(PACING_POLL_SECONDS)

    def note(self, what: str) -> None:
        with self.lock:
            self.unexpected.append(what)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()


def micros(stamp: str) -> int:
    """An API timestamp (RFC 3339, Z) as microseconds since the epoch, as the database stores it."""
    moment = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return (moment - EPOCH) // timedelta(microseconds=1)


# -- the plan --------------------------------------------------------------------------------

class Planner:
    """Makes a producer's jobs: random types, planned failures and failure policies."""

    def __init__(self, rng: random.Random, prefix: str, fail_rate: float) -> None:
        self.rng, self.prefix, self.fail_rate = rng, prefix, fail_rate

    def job(self, name: str, *deps: Node) -> Node:
        node = Node(f"{self.prefix}{name}", self.rng.choice(TYPES),
                    fails=self.rng.random() < self.fail_rate)
        for dep in deps:
            self.link(node, dep)
        return node

    def link(self, node: Node, dep: Node) -> None:
        if dep in node.deps:
            return
        if not node.deps:
            node.policy = self.rng.choice(POLICIES)
        node.deps.append(dep)


def pair(plan: Planner) -> list[Node]:
    first = plan.job("a")
    return [first, plan.job("b", first)]


def diamond(plan: Planner) -> list[Node]:
    top = plan.job("a")
    left, right = plan.job("b", top), plan.job("c", top)
    return [top, left, right, plan.job("d", left, right)]


def fan(plan: Planner) -> list[Node]:
    top = plan.job("a")
    middle = [plan.job(f"x{n}", top) for n in range(6)]
    return [top, *middle, plan.job("z", *middle)]


def chain(plan: Planner) -> list[Node]:
    links = [plan.job("n0")]
    for n in range(1, DEPTH):
        links.append(plan.job(f"n{n}", links[-1]))
    return links


SHAPES: tuple[Callable[[Planner], list[Node]], ...] = (pair, diamond, fan)


def expected_statuses(nodes: Iterable[Node]) -> dict[int, str]:
    """How each job must end, `nodes` in the order they were enqueued (each after its
    dependencies): a job whose dependency did not complete is cancelled when its policy is
    cancel; otherwise it runs, and fails if planned to."""
    ends: dict[int, str] = {}
    for node in nodes:
        broken = any(ends[dep.id] != "completed" for dep in node.deps)
        if broken and node.policy != "run":
            ends[node.id] = "cancelled"
        else:
            ends[node.id] = "failed" if node.fails else "completed"
    return ends


# -- producers -------------------------------------------------------------------------------

def post(run: Run, client: QueueClient, path: str, body: dict[str, Any], key: str
         ) -> dict[str, Any]:
    """POST until the server answers: a request the kill cut off, or answered 503 (the
    database out of connections for a moment: the suite's other servers share it), is sent
    again with the same Idempotency-Key, which makes nothing twice, as the shipped client
    does."""
    while run.remaining() > 0:
        try:
            response = client.request("POST", path, json=body,
                                      headers={"Idempotency-Key": key})
        except requests.RequestException:
            time.sleep(RETRY_PAUSE_SECONDS)
            continue
        if response.status_code == 503:
            time.sleep(float(response.headers.get("Retry-After", 1)))
            continue
        if response.status_code in (200, 201):
            answer: dict[str, Any] = response.json()
            return answer
        run.note(f"POST {path} ({key}): {response.status_code} {response.text[:500]}")
        raise AssertionError(run.unexpected[-1])
    raise AssertionError(f"POST {path} ({key}) unanswered when the run's time ran out")


def enqueue_workflow(run: Run, client: QueueClient, name: str, nodes: list[Node]) -> None:
    body = {"name": name,
            "jobs": [{"ref": node.key, **node.body(run.workload.max_retries, nodes)}
                     for node in nodes]}
    answer = post(run, client, "/workflows", body, f"workflow-{name}")
    for node in nodes:
        node.id = answer["jobs"][node.key]
    run.enqueued(nodes, workflow_id=answer["id"])


def enqueue_job(run: Run, client: QueueClient, node: Node) -> dict[str, Any]:
    answer = post(run, client, "/jobs", node.body(run.workload.max_retries),
                  f"job-{node.key}")
    node.id = answer["id"]
    run.enqueued([node])
    return answer


def produce_workflows(run: Run, client: QueueClient, producer: int, count: int) -> None:
    """Small workflows, each followed by a job depending on some of its jobs (and maybe on
    another producer's), enqueued while the workers complete them."""
    rng = random.Random(f"workflows-{producer}")
    for n in range(count):
        plan = Planner(rng, f"p{producer}.w{n}.", run.workload.fail_rate)
        nodes = rng.choice(SHAPES)(plan)
        earlier = run.recent(rng)
        if earlier is not None and rng.random() < CROSS_LINK_SHARE:
            plan.link(nodes[0], earlier)
        enqueue_workflow(run, client, f"p{producer}-w{n}", nodes)

        follower = plan.job("f", *rng.sample(nodes, k=min(len(nodes), rng.randint(1, 3))))
        earlier = run.recent(rng)
        if earlier is not None and rng.random() < CROSS_LINK_SHARE:
            plan.link(follower, earlier)
        enqueue_job(run, client, follower)


def produce_chains(run: Run, client: QueueClient, count: int) -> None:
    """Chains DEPTH deep: in one workflow, or link by link, each link enqueued while the
    workers may be completing the one before."""
    rng = random.Random("chains")
    for n in range(count):
        plan = Planner(rng, f"chain{n}.", run.workload.fail_rate)
        links = chain(plan)
        if n % 2 == 0:
            enqueue_workflow(run, client, f"chain-{n}", links)
        else:
            for link in links:
                run.await_reports(link.deps, len(link.deps), LINK_PACING_SECONDS)
                enqueue_job(run, client, link)


def produce_fan_in(run: Run, client: QueueClient, leaves: int) -> None:
    """Leaves in workflows of WORKFLOW_CAP, then their joiners (FAN_IN_WIDTH leaves each),
    each enqueued as the workers complete the last of its leaves; last, one job depending on
    every joiner."""
    rng = random.Random("fan-in")
    plan = Planner(rng, "fan.", run.workload.leaf_fail_rate)
    joiners: list[Node] = []
    for start in range(0, leaves, WORKFLOW_CAP):
        batch = [plan.job(f"l{n}") for n in range(start, min(leaves, start + WORKFLOW_CAP))]
        enqueue_workflow(run, client, f"fan-leaves-{start}", batch)
        for offset in range(0, len(batch), FAN_IN_WIDTH):
            leaves_of = batch[offset:offset + FAN_IN_WIDTH]
            races_at = JOINER_RACES_AT[len(joiners) % len(JOINER_RACES_AT)]
            run.await_reports(leaves_of, races_at * len(leaves_of) // FAN_IN_WIDTH,
                              JOINER_PACING_SECONDS)
            joiner = plan.job(f"j{start + offset}", *leaves_of)
            joiner.fails = False  # the tree's failures are its leaves'
            answer = enqueue_job(run, client, joiner)
            joiners.append(joiner)
            with run.lock:
                run.joiners_waiting_on.append(answer["waiting_on"])
    final = plan.job("final", *joiners)
    final.fails = False
    enqueue_job(run, client, final)


# -- workers ---------------------------------------------------------------------------------

def claim(run: Run, client: QueueClient, many: bool) -> list[dict[str, Any]] | None:
    """Jobs claimed under the run's lease ([] when none came); None after a wrong answer."""
    lease = run.workload.lease_seconds
    if many:
        response = client.claim_many(max_jobs=CLAIM_MANY, lease_seconds=lease,
                                     wait_seconds=WAIT_SECONDS)
        if response.status_code == 200:
            jobs: list[dict[str, Any]] = response.json()["jobs"]
            return jobs
    else:
        response = client.claim(lease_seconds=lease, wait_seconds=WAIT_SECONDS)
        if response.status_code == 204:
            return []
        if response.status_code == 200:
            return [response.json()]
    if response.status_code == 503:  # nothing claimed: a worker waits and claims again
        time.sleep(float(response.headers.get("Retry-After", 1)))
        return []
    run.note(f"claim: {response.status_code} {response.text[:500]}")
    return None


def report_refused(run: Run, what: str, status: int, text: str) -> None:
    """A 409 is a lease the kill (or its outage) let run out: the job comes back to another
    claim. Without a kill no lease runs out, and every report lands."""
    if status == 409 and run.workload.kill:
        return
    run.note(f"{what}: {status} {text[:500]}")


def report(run: Run, client: QueueClient, jobs: list[dict[str, Any]], many: bool) -> None:
    """Fail the jobs planned to fail, complete the others. A report the kill cut off is left:
    whether it landed or not, the job ends (its lease runs out and it is claimed again)."""
    completing = []
    for job in jobs:
        run.reporting(job["id"])
        if not job["payload"]["fail"]:
            completing.append(job)
            continue
        try:
            response = client.request("POST", f"/jobs/{job['id']}/fail", json={
                "error": "planned failure", "lease_token": job["lease_token"]})
        except requests.RequestException:
            continue
        if response.status_code != 200:
            report_refused(run, f"fail {job['id']}", response.status_code, response.text)
    if not completing:
        return
    items = [{"id": job["id"], "lease_token": job["lease_token"],
              "result": {"key": job["payload"]["key"]}} for job in completing]
    try:
        if many:
            response = client.complete_many(items)
            if response.status_code != 200:
                run.note(f"complete-many: {response.status_code} {response.text[:500]}")
                return
            for result in response.json()["results"]:
                if result["status"] != 200:
                    report_refused(run, f"complete {result['id']}", result["status"],
                                   json.dumps(result))
        else:
            for item in items:
                response = client.complete(item["id"], lease_token=item["lease_token"],
                                           result=item["result"])
                if response.status_code != 200:
                    report_refused(run, f"complete {item['id']}", response.status_code,
                                   response.text)
    except requests.RequestException:
        return


def work(run: Run, client: QueueClient, name: str, many: bool) -> None:
    """Claim and report until the run is drained (or its time is up); while the server is
    down, try again."""
    while not run.stop.is_set() and run.remaining() > 0:
        try:
            jobs = claim(run, client, many)
        except requests.RequestException:
            time.sleep(RETRY_PAUSE_SECONDS)
            continue
        if jobs is None:
            return
        if not jobs:
            time.sleep(IDLE_PAUSE_SECONDS)
            continue
        run.claimed(name, jobs, time.monotonic())
        report(run, client, jobs, many)


# -- the run ---------------------------------------------------------------------------------

def type_counts(admin: QueueClient) -> dict[str, dict[str, int]]:
    response = admin.request("GET", "/types")
    assert response.status_code == 200, response.text
    return {item["type"]: item["counts"] for item in response.json()["types"]}


def unfinished(admin: QueueClient) -> int:
    """Jobs waiting, pending or running now: the pending and running of GET /types (counted
    afresh: the servers run with TYPE_COUNTS_MAX_AGE_SECONDS 0) and the waiting listed by
    GET /jobs?status=waiting, read live, where the drain cannot take a count's word for it."""
    counts = type_counts(admin)
    return (sum(by_status.get(status, 0) for by_status in counts.values()
                for status in ("pending", "running"))
            + len(admin.list_all(status="waiting")))


def stuck_report(admin: QueueClient, run: Run) -> str:
    """What is left unfinished, and for each such job what its dependencies are."""
    everything = {job["id"]: job for job in admin.list_all()}
    lines = [f"not drained: {type_counts(admin)}"]
    left = [job for job in everything.values() if job["status"] in UNFINISHED]
    for job in left[:30]:
        node = run.nodes.get(job["id"])
        deps = [everything[dep] for dep in job["depends_on"]]
        lines.append(
            f"job {job['id']} ({node.key if node else '?'}) {job['status']}, waiting_on "
            f"{job['waiting_on']}, created {job['created_at']}, dependencies "
            f"{dict(Counter(dep['status'] for dep in deps))}, the last to finish: "
            f"{max(((dep['updated_at'], dep['id'], dep['status']) for dep in deps), default=None)}")
    return "\n".join(lines)


def wait_until_drained(run: Run, admin: QueueClient) -> None:
    """Until no job is waiting, pending or running (see `unfinished`). A count that stops
    going down for STALL_SECONDS (or the run's end) fails the run with what is left and what
    it waits on."""
    left, last_change = -1, time.monotonic()
    while run.remaining() > 0 and time.monotonic() - last_change < STALL_SECONDS:
        now_left = unfinished(admin)
        if now_left == 0:
            return
        if now_left != left:
            left, last_change = now_left, time.monotonic()
        time.sleep(DRAIN_POLL_SECONDS)
    raise AssertionError(stuck_report(admin, run))


def kill_and_restart(run: Run, server: LiveServer) -> None:
    """kill -9 of the master and every worker, once half the workflows are enqueued (and the
    workers are busy completing), then a new server on the same database."""
    assert run.half_enqueued.wait(run.remaining()), "the producers never got half-way"
    completions_before = len(run.reports_sent)
    server.kill()
    server.start()
    print(f"\nkilled after {run.workflows_enqueued} workflows enqueued and "
          f"{completions_before} reports sent; restarted on port {server.port}")


def run_workload(server: LiveServer, url: str, workload: Workload
                 ) -> tuple[Run, list[QueueClient]]:
    producer_token = create_api_key(url, "producer-1", "producer")
    producers = [QueueClient(server, producer_token) for _ in range(PRODUCERS + 2)]
    workers = [QueueClient(server, create_api_key(url, f"worker-{n:02d}", "worker"))
               for n in range(WORKERS)]
    admin = QueueClient(server, create_api_key(url, "admin-1", "admin"))
    run = Run(workload, deadline=time.monotonic() + RUN_SECONDS)

    per_producer = workload.workflows // PRODUCERS
    with ThreadPoolExecutor(max_workers=WORKERS + len(producers)) as pool:
        working = [pool.submit(work, run, client, f"worker-{n:02d}", n % 2 == 1)
                   for n, client in enumerate(workers)]
        try:
            producing: list[Future[None]] = [
                pool.submit(produce_fan_in, run, producers[0], workload.leaves),
                pool.submit(produce_chains, run, producers[1], workload.chains),
                *[pool.submit(produce_workflows, run, producers[2 + n], n, per_producer)
                  for n in range(PRODUCERS)]]
            if workload.kill:
                kill_and_restart(run, server)
            for future in producing:
                future.result(timeout=max(1.0, run.remaining()))
            enqueued_in = RUN_SECONDS - run.remaining()
            wait_until_drained(run, admin)
            print(f"\nenqueued in {enqueued_in:.1f} s, drained at "
                  f"{RUN_SECONDS - run.remaining():.1f} s")
        finally:
            run.stop.set()
            for future in working:
                future.result(timeout=RUN_SECONDS)
    return run, [*producers, *workers, admin]


# -- what must hold after a run --------------------------------------------------------------

@dataclass
class History:
    """The server's own record of each job (read from its database after the run)."""

    first_claims: dict[int, int]  # job id -> its first attempt's claimed_at
    attempts: Counter[int]
    finished_at: dict[int, int]  # job id -> its terminal event's `at`
    cancelled_by: dict[int, dict[str, Any]]  # job id -> its cancelled event's detail
    events: dict[int, list[tuple[str, int]]]  # job id -> (event, at) in order, to explain

    @classmethod
    def read(cls, url: str) -> History:
        history = cls({}, Counter(), {}, {}, defaultdict(list))
        for job_id, (attempts, events) in told_histories(url).items():
            for attempt in attempts:
                history.attempts[job_id] += 1
                if attempt.number == 1:
                    history.first_claims[job_id] = attempt.claimed_at
            for event in events:
                history.events[job_id].append((event.event, event.at))
                if event.event not in FINISHED_EVENTS:
                    continue
                history.finished_at[job_id] = event.at
                if event.event == "cancelled":
                    history.cancelled_by[job_id] = (json.loads(event.detail) if event.detail
                                                    else {})
        return history


def assert_no_errors(run: Run, clients: list[QueueClient], server: LiveServer) -> None:
    assert run.unexpected == []
    assert server_errors(clients) == {}
    assert "Traceback" not in server.stderr()


def assert_every_job_ended_as_its_graph_says(run: Run, admin: QueueClient) -> dict[int, str]:
    shown = {job["id"]: job for job in admin.list_all()}
    assert set(shown) == set(run.nodes), "a job enqueued twice, or one missing"
    wrong_graph = [(node.key, shown[job_id]["depends_on"], [dep.id for dep in node.deps])
                   for job_id, node in run.nodes.items()
                   if shown[job_id]["depends_on"] != [dep.id for dep in node.deps]]
    assert wrong_graph == []
    expected = expected_statuses(run.nodes.values())
    wrong_end = {job_id: (run.nodes[job_id].key, shown[job_id]["status"], status)
                 for job_id, status in expected.items() if shown[job_id]["status"] != status}
    assert wrong_end == {}, "job id: (key, status, expected)"
    return expected


def assert_nothing_waits(admin: QueueClient) -> None:
    assert admin.list_all(status="waiting") == []
    counts = type_counts(admin)
    assert {job_type: (by_status.get("waiting"), by_status["pending"], by_status["running"])
            for job_type, by_status in counts.items()} == dict.fromkeys(TYPES, (0, 0, 0))


def assert_no_job_claimed_before_its_dependencies_finished(
        run: Run, history: History, expected: dict[int, str]) -> None:
    """By the server's clock: each job's first attempt began at or after the terminal event of
    each dependency. By the clients': no claim of a job was answered before a report on each
    of its dependencies had been sent."""
    by_server_clock: list[str] = []
    for job_id, node in run.nodes.items():
        first = history.first_claims.get(job_id)
        if first is None:
            continue
        for dep in node.deps:
            finished = history.finished_at.get(dep.id)
            if finished is None or first < finished:
                by_server_clock.append(
                    f"job {job_id} ({node.key}) first claimed at {first}, its dependency "
                    f"{dep.id} ({dep.key}) finished at {finished} "
                    f"({(finished or first) - first} us later); its events "
                    f"{history.events[job_id]}, the dependency's {history.events[dep.id]}")
    by_clients: list[str] = []
    for claim_seen in run.claims:
        node = run.nodes[claim_seen.job_id]
        for dep in node.deps:
            if expected[dep.id] == "cancelled":
                continue  # cancelled by the server: no worker reports on it
            sent = run.reports_sent.get(dep.id)
            if sent is None or claim_seen.answered <= sent:
                by_clients.append(f"job {node.id} ({node.key}): a claim by "
                                  f"{claim_seen.worker} was answered before a report on its "
                                  f"dependency {dep.id} ({dep.key}) was sent")
    assert (by_server_clock, by_clients) == ([], []), "\n".join(by_server_clock + by_clients)


def assert_ran_exactly_as_planned(run: Run, history: History, expected: dict[int, str]
                                  ) -> None:
    """The jobs that must run ran; a job cancelled by a dependency never ran, and its
    cancelled event names that dependency."""
    never_ran = [run.nodes[job_id].key for job_id, status in expected.items()
                 if status != "cancelled" and job_id not in history.first_claims]
    assert never_ran == []
    cancelled_wrongly = []
    for job_id, status in expected.items():
        if status != "cancelled":
            continue
        node, detail = run.nodes[job_id], history.cancelled_by.get(job_id, {})
        culprit = next((dep for dep in node.deps if dep.id == detail.get("dependency")), None)
        if (job_id in history.attempts or culprit is None
                or detail.get("dependency_status") != expected[culprit.id]):
            cancelled_wrongly.append((node.key, history.attempts[job_id], detail))
    assert cancelled_wrongly == []
    # The claim answers' claimed_at is what the server recorded as the attempt's.
    first_seen: dict[int, int] = {}
    for claim_seen in run.claims:
        first_seen.setdefault(claim_seen.job_id, claim_seen.claimed_at_us)
    if not run.workload.kill:
        assert first_seen == history.first_claims
        assert [job_id for job_id, n in history.attempts.items() if n > 1] == []


def assert_the_api_tells_the_same_history(run: Run, admin: QueueClient, history: History
                                          ) -> None:
    """The history the checks read from the database is the one GET /jobs/{id}/attempts and
    GET /jobs/{id}/events show (asked for a sample: every job's would cost thousands of
    requests)."""
    rng = random.Random("sample")
    sample = rng.sample(sorted(history.first_claims), k=min(API_SAMPLE, len(history.first_claims)))
    for job_id in sample:
        attempts = admin.request("GET", f"/jobs/{job_id}/attempts")
        assert attempts.status_code == 200, attempts.text
        assert micros(attempts.json()["attempts"][0]["claimed_at"]) == \
            history.first_claims[job_id]
        for dep in run.nodes[job_id].deps:
            events = admin.request("GET", f"/jobs/{dep.id}/events")
            assert events.status_code == 200, events.text
            finished = [micros(event["at"]) for event in events.json()["events"]
                        if event["event"] in FINISHED_EVENTS]
            assert finished[-1:] == [history.finished_at[dep.id]]


def workflow_status(statuses: list[str]) -> str:
    if all(status == "completed" for status in statuses):
        return "completed"
    return "failed" if "failed" in statuses else "cancelled"


def assert_workflows_finished(run: Run, admin: QueueClient, expected: dict[int, str]) -> None:
    shown: dict[int, str] = {}
    params: dict[str, Any] = {"limit": 100}
    while True:
        response = admin.request("GET", "/workflows", params=params)
        assert response.status_code == 200, response.text
        page = response.json()
        shown.update((workflow["id"], workflow["status"]) for workflow in page["workflows"])
        if page["next_cursor"] is None:
            break
        params["cursor"] = page["next_cursor"]
    assert shown == {workflow_id: workflow_status([expected[node.id] for node in nodes])
                     for workflow_id, nodes in run.workflows.items()}


def assert_promise_kept(server: LiveServer, url: str, run: Run,
                        clients: list[QueueClient]) -> tuple[dict[int, str], History]:
    admin = clients[-1]
    assert_no_errors(run, clients, server)
    expected = assert_every_job_ended_as_its_graph_says(run, admin)
    print(f"\n{len(run.nodes)} jobs, {len(run.workflows)} workflows, ends "
          f"{dict(Counter(expected.values()))}; the joiners' waiting_on when enqueued: "
          f"{sorted(run.joiners_waiting_on)}")
    history = History.read(url)
    assert_no_job_claimed_before_its_dependencies_finished(run, history, expected)
    assert_ran_exactly_as_planned(run, history, expected)
    assert_the_api_tells_the_same_history(run, admin, history)
    assert_workflows_finished(run, admin, expected)
    assert_nothing_waits(admin)
    return expected, history


def test_every_job_of_every_shape_completes_none_before_its_dependencies(
        start_server: StartServer, server_database_url: str) -> None:
    server = start_server(server_database_url, workers=4, threads=4,
                          settings=SERVER_SETTINGS)
    run, clients = run_workload(server, server_database_url, EVERY_JOB_COMPLETES)

    expected, _history = assert_promise_kept(server, server_database_url, run, clients)
    assert set(expected.values()) == {"completed"}
    assert len(run.nodes) > 3000


def test_jobs_failing_for_good_cancel_their_dependents_or_let_them_run(
        start_server: StartServer, server_database_url: str) -> None:
    server = start_server(server_database_url, workers=4, threads=4,
                          settings=SERVER_SETTINGS)
    run, clients = run_workload(server, server_database_url, SOME_FAIL_FOR_GOOD)

    expected, _history = assert_promise_kept(server, server_database_url, run, clients)
    # The plan made each kind of end, transitive cascades and dependents run anyway among them.
    assert set(expected.values()) == {"completed", "failed", "cancelled"}
    cascaded = [node for job_id, node in run.nodes.items()
                if expected[job_id] == "cancelled"
                and any(expected[dep.id] == "cancelled" for dep in node.deps)]
    ran_anyway = [node for job_id, node in run.nodes.items()
                  if expected[job_id] != "cancelled" and node.policy == "run"
                  and any(expected[dep.id] != "completed" for dep in node.deps)]
    assert cascaded and ran_anyway


def test_after_kill_9_mid_run_and_a_restart_no_job_is_stuck_or_early(
        start_server: StartServer, server_database_url: str) -> None:
    server = start_server(server_database_url, workers=4, threads=4,
                          settings=SERVER_SETTINGS)
    run, clients = run_workload(server, server_database_url, KILLED_MID_RUN)

    expected, history = assert_promise_kept(server, server_database_url, run, clients)
    assert set(expected.values()) == {"completed"}
    # The dead server held jobs: their leases ran out, and they were claimed again.
    assert max(history.attempts.values()) > 1
