"""Two hosts on one PostgreSQL database, each in a network namespace of its own
(tests/netns.py): `queuelog serve` with the shipped settings (one gunicorn worker each) run
inside the namespace, listening on the host's own address, reaching PostgreSQL at the root
namespace's end of its database link. The tests call each host at its address from the root
namespace, as a load balancer would.

In one run, on the same two hosts, A being the one that leads maintenance:
1. a job enqueued on A is claimed on B;
2. a long-polling claim on B for a workflow's dependent answers once A completes the job it
   depends on (B learns of it by its own peeks: the hosts share nothing but the database);
3. A cut from the database (its database link's root end set down: packets dropped, no RST)
   answers every request with a 503 problem within seconds, never hangs nor answers 500; a
   job B claims meanwhile is not also answered by A; B takes the maintenance lead once the
   server has dropped A's session (TCP keepalives set by the app: app/storage/engine.py);
   A serves again once the link is back;
4. B restarted gracefully hands the lead back to A at once; A killed -9 (its whole process
   group) while it holds leased jobs and a claim is under way: B takes the lead, rescues the
   leases and its claims get the jobs again.
Every job acknowledged is counted at the end: each completed once, none lost, none more.

Needs root, `ip netns` and a PostgreSQL that answers on the namespaces' addresses
(.ci/postgres_for_namespaces); skipped without them on a workstation, failed under CI=true.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests
from sqlalchemy.engine import make_url

from tests.conftest import PostgresServer
from tests.e2e.client import QueueClient
from tests.faults.inject import unavailable
from tests.netns import NamespaceHost, Namespaces, why_namespaces_cannot_be_made
from tests.servers import GunicornServer, create_api_key, server_environment

pytestmark = pytest.mark.slow

QUEUELOG = Path(sys.executable).with_name("queuelog")
PORT = 8000  # each namespace has ports of its own
JOB_TYPES = "email,pdf,sync"
# Short leases: the jobs a killed host held come back within seconds.
LEASE_SECONDS = 3
# What an answer may take while the database is cut: the app's limits (connect_timeout 3 s,
# tcp_user_timeout 5 s: a statement on a dead pooled connection, then one connect) with room
# for a loaded CI machine. Without them a request waits on TCP's retransmissions (minutes).
CUT_ANSWER_SECONDS = 15.0
# Generous bounds on what the service does by itself; what it took is printed.
EVENTUALLY_SECONDS = 45.0


def eventually(condition: Callable[[], Any], what: str,
               timeout: float = EVENTUALLY_SECONDS) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.1)
    return found


@dataclass
class Host:
    """One namespaced host: its namespace, its server and a client per key."""

    name: str
    net: NamespaceHost
    server: GunicornServer
    tokens: dict[str, str]
    clients: list[QueueClient] = field(default_factory=list)

    def client(self, role: str) -> QueueClient:
        """A client of this host with the key of `role` (a session of its own: one per
        thread)."""
        made = QueueClient(self.server, self.tokens[role])
        self.clients.append(made)
        return made

    def close_clients(self) -> None:
        for client in self.clients:
            client.close()
        self.clients.clear()

    def readyz(self, timeout: float = 10) -> requests.Response:
        return requests.get(f"{self.server.url}/readyz", timeout=timeout)

    def leads(self) -> bool:
        """What the host's one worker says of itself in /readyz (False when not ready)."""
        try:
            ready = self.readyz()
        except requests.RequestException:
            return False
        return ready.status_code == 200 and bool(ready.json()["maintenance"]["leader"])


def _database_url_at(url: str, address: str) -> str:
    return make_url(url).set(host=address).render_as_string(hide_password=False)


def _answers_at(url: str, address: str) -> str | None:
    """Why PostgreSQL does not answer at `address`, or None when it does."""
    parsed = make_url(url)
    try:
        with psycopg.connect(host=address, port=parsed.port or 5432, user=parsed.username,
                             password=parsed.password, dbname=parsed.database,
                             connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as error:
        return str(error).strip().splitlines()[0]
    return None


@pytest.fixture
def namespaces() -> Iterator[Namespaces]:
    reason = why_namespaces_cannot_be_made()
    if reason:
        unavailable("two hosts in network namespaces", reason)
    made = Namespaces()
    try:
        yield made
    finally:
        made.destroy()


@pytest.fixture
def servers() -> Iterator[list[GunicornServer]]:
    """The servers started: each killed, its whole process group, however the test ends
    (before the namespaces they run in are deleted)."""
    started: list[GunicornServer] = []
    yield started
    for server in started:
        print(f"--- the end of {server.stderr_path.name}:\n{server.log_tail()}")  # on failure
        server.kill()


@pytest.fixture
def two_hosts(postgres_server: PostgresServer, namespaces: Namespaces,
              servers: list[GunicornServer], tmp_path: Path) -> Iterator[list[Host]]:
    """Two hosts serving one fresh database, both answering /readyz."""
    url = postgres_server.create_database()
    nets = [namespaces.host("a"), namespaces.host("b")]
    for net in nets:
        why = _answers_at(url, net.database_address)
        if why:
            unavailable("two hosts in network namespaces",
                        f"PostgreSQL does not answer at {net.database_address} ({why}): it "
                        "must listen on every address and trust 10.213.0.0/16 "
                        "(.ci/postgres_for_namespaces does both)")
    tokens = {role: create_api_key(url, f"{role}-key", role)
              for role in ("producer", "admin")}
    hosts = []
    for name, net in zip(("a", "b"), nets, strict=True):
        directory = tmp_path / name
        server = GunicornServer(
            net.run([str(QUEUELOG), "serve", "--host", net.address, "--port", str(PORT),
                     "--workers", "1"]),
            server_environment(
                directory,
                QUEUELOG_DATABASE_URL=_database_url_at(url, net.database_address),
                QUEUELOG_JOB_TYPES=JOB_TYPES),
            port=PORT, logs=tmp_path, name=f"host-{name}", cwd=directory, host=net.address)
        servers.append(server)
        # Each host's worker key is its own: a job's worker_id says which host claimed it.
        worker = create_api_key(url, f"worker-on-{name}", "worker")
        hosts.append(Host(name, net, server, {**tokens, "worker": worker}))
    for host in hosts:
        host.server.start()
    for host in hosts:
        host.server.wait_until_answering("/readyz")
    yield hosts
    for host in hosts:
        host.close_clients()


def _is_503_problem(response: requests.Response) -> bool:
    return (response.status_code == 503
            and response.headers.get("Content-Type") == "application/problem+json"
            and response.json().get("status") == 503
            and bool(response.headers.get("Retry-After")))


@dataclass
class Timed:
    """A request's answer (or the exception it raised) and how long it took."""

    response: requests.Response | None
    error: BaseException | None
    seconds: float
    done_at: float


def _timed(call: Callable[[], requests.Response]) -> Timed:
    started = time.monotonic()
    try:
        response, error = call(), None
    except requests.RequestException as raised:
        response, error = None, raised
    done = time.monotonic()
    return Timed(response, error, done - started, done)


class Ledger:
    """Every job a host acknowledged (201), by id."""

    def __init__(self) -> None:
        self.ids: set[int] = set()

    def enqueue(self, client: QueueClient, body: dict[str, Any]) -> int:
        response = client.enqueue(body)
        assert response.status_code == 201, response.text
        job_id = int(response.json()["id"])
        self.ids.add(job_id)
        return job_id


def _complete(client: QueueClient, claimed: requests.Response) -> None:
    assert claimed.status_code == 200, claimed.text
    done = client.complete(claimed.json()["id"], lease_token=claimed.json()["lease_token"])
    assert done.status_code == 200, done.text


def test_two_hosts_share_one_database_through_a_cut_and_a_kill(
        two_hosts: list[Host]) -> None:
    started = time.monotonic()
    eventually(lambda: [host.leads() for host in two_hosts].count(True) == 1, "one leader")
    a, b = two_hosts if two_hosts[0].leads() else two_hosts[::-1]
    print(f"\nhost {a.name} leads ({a.net.address}), host {b.name} follows ({b.net.address})")
    ledger = Ledger()
    pool = ThreadPoolExecutor(max_workers=8)
    try:
        _enqueued_on_a_claimed_on_b(a, b, ledger)
        _dependents_on_b_wake_when_a_completes(a, b, ledger, pool)
        _a_cut_from_the_database(a, b, ledger, pool)
        _b_restarted_hands_the_lead_back(a, b)
        _a_killed_holding_leases(a, b, ledger, pool)
        _every_job_completed_once(b, ledger)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    print(f"wall time of the scenario: {time.monotonic() - started:.1f} s")


def _enqueued_on_a_claimed_on_b(a: Host, b: Host, ledger: Ledger) -> None:
    job_id = ledger.enqueue(a.client("producer"), {"type": "email", "payload": {"n": 1}})
    worker = b.client("worker")
    claimed = worker.claim(types=["email"], lease_seconds=60)
    assert claimed.status_code == 200, claimed.text
    assert (claimed.json()["id"], claimed.json()["worker_id"]) == (job_id, f"worker-on-{b.name}")
    _complete(worker, claimed)
    assert a.client("admin").get(job_id).json()["status"] == "completed"


def _dependents_on_b_wake_when_a_completes(a: Host, b: Host, ledger: Ledger,
                                           pool: ThreadPoolExecutor) -> None:
    producer = a.client("producer")
    first = ledger.enqueue(producer, {"type": "pdf"})
    dependents = [ledger.enqueue(producer, {"type": "sync", "depends_on": [first],
                                            "payload": {"n": n}}) for n in range(2)]
    assert {a.client("admin").get(job).json()["status"] for job in dependents} == {"waiting"}
    # Long-polling claims on B for the dependents' type, waiting before the dependency ends.
    workers_on_b = [b.client("worker") for _ in dependents]
    waiting = [pool.submit(_timed, lambda w=w: w.claim(types=["sync"], wait_seconds=20,
                                                       lease_seconds=60))
               for w in workers_on_b]
    time.sleep(0.5)
    assert not any(future.done() for future in waiting), [f.result() for f in waiting]

    worker_on_a = a.client("worker")
    claimed = worker_on_a.claim(types=["pdf"], lease_seconds=60)
    assert claimed.json()["id"] == first, claimed.text
    # From before the complete is sent: B may answer before A's own answer is read.
    completed_at = time.monotonic()
    _complete(worker_on_a, claimed)

    answers = [future.result(timeout=30) for future in waiting]
    woken = [answer.done_at - completed_at for answer in answers]
    print(f"dependents claimed on B {', '.join(f'{s:.2f}' for s in woken)} s after A "
          "sent the complete of their dependency")
    responses = [answer.response for answer in answers if answer.response is not None]
    assert sorted(response.json()["id"] for response in responses) == dependents, answers
    for response, worker in zip(responses, workers_on_b, strict=True):
        _complete(worker, response)
    assert all(0 <= seconds < 5 for seconds in woken), woken


def _a_cut_from_the_database(a: Host, b: Host, ledger: Ledger,
                             pool: ThreadPoolExecutor) -> None:
    # A long-polling claim on A, waiting when the cut comes.
    waiting_on_a = pool.submit(_timed, lambda: a.client("worker").claim(
        types=["email"], wait_seconds=20, lease_seconds=60))
    time.sleep(0.5)
    assert a.leads()
    cut_at = time.monotonic()
    a.net.back.cut()
    print(f"A's database link cut ({a.net.back.root} down)")

    timeout = CUT_ANSWER_SECONDS + 10  # a hang fails the test, never holds it
    while_cut: dict[str, Future[Timed]] = {
        "GET /readyz": pool.submit(_timed, lambda: a.readyz(timeout=timeout)),
        "POST /jobs": pool.submit(_timed, lambda: a.client("producer").request(
            "POST", "/jobs", json={"type": "email"}, timeout=timeout)),
        "POST /jobs/claim": pool.submit(_timed, lambda: a.client("worker").request(
            "POST", "/jobs/claim", json={"types": ["email"]}, timeout=timeout)),
        "GET /jobs": pool.submit(_timed, lambda: a.client("admin").request(
            "GET", "/jobs", timeout=timeout)),
    }

    # B serves on: a job enqueued and claimed there while A is cut.
    held_by_b = ledger.enqueue(b.client("producer"), {"type": "email", "payload": {"n": 2}})
    worker_on_b = b.client("worker")
    claimed_on_b = worker_on_b.claim(types=["email"], lease_seconds=60)
    assert claimed_on_b.status_code == 200, claimed_on_b.text
    assert claimed_on_b.json()["id"] == held_by_b

    answers = {**{what: future.result(timeout=timeout + 5) for what, future in while_cut.items()},
               "the claim waiting at the cut": waiting_on_a.result(timeout=timeout + 25)}
    for what, answer in answers.items():
        print(f"  A, cut: {what} answered {getattr(answer.response, 'status_code', None)} "
              f"in {answer.seconds:.1f} s")
        assert answer.response is not None, f"{what}: {answer.error!r}"
        assert _is_503_problem(answer.response), (what, answer.response.status_code,
                                                  answer.response.text)
    assert all(answer.seconds < CUT_ANSWER_SECONDS for what, answer in answers.items()
               if what != "the claim waiting at the cut"), answers
    # Still cut, A's next answers come as quickly: its dead connections are gone from the
    # pool, and a new one gives up at connect_timeout.
    again = [_timed(lambda: a.client("worker").request(
                 "POST", "/jobs/claim", json={"types": ["email"]}, timeout=timeout))
             for _ in range(2)]
    for answer in again:
        assert answer.response is not None and _is_503_problem(answer.response), answer
        assert answer.seconds < CUT_ANSWER_SECONDS, answer.seconds
    print(f"  A, still cut: claims answered 503 in "
          f"{', '.join(f'{answer.seconds:.1f}' for answer in again)} s")

    # The server drops A's session (its keepalives go unanswered), and with it the lead.
    eventually(b.leads, "B to take the lead from the cut A")
    print(f"B leads {time.monotonic() - cut_at:.1f} s after the cut")

    restored_at = time.monotonic()
    a.net.back.restore()
    eventually(lambda: a.readyz().status_code == 200, "A to serve again", timeout=30)
    print(f"A ready again {time.monotonic() - restored_at:.1f} s after the link came back")
    # B's job is not A's to answer: it is held, and nothing else is claimable.
    worker_on_a = a.client("worker")
    assert worker_on_a.claim(types=["email"]).status_code == 204
    assert a.client("admin").get(held_by_b).json()["worker_id"] == f"worker-on-{b.name}"
    _complete(worker_on_b, claimed_on_b)
    assert not a.leads() and b.leads()


def _b_restarted_hands_the_lead_back(a: Host, b: Host) -> None:
    """B stopped gracefully gives the lead up as its worker exits; A, asking every few
    seconds, takes it; B comes back as a follower."""
    b.close_clients()  # a graceful stop waits for its clients' idle keep-alive connections
    stopped_at = time.monotonic()
    assert b.server.stop() == 0
    eventually(a.leads, "A to take the lead B gave up")
    print(f"A leads {time.monotonic() - stopped_at:.1f} s after B was stopped")
    b.server.start()
    b.server.wait_until_answering("/readyz")
    assert not b.leads()


def _a_killed_holding_leases(a: Host, b: Host, ledger: Ledger,
                             pool: ThreadPoolExecutor) -> None:
    producer = a.client("producer")
    jobs = [ledger.enqueue(producer, {"type": "email", "payload": {"n": 10 + n}})
            for n in range(4)]
    assert a.leads()
    worker_on_a = a.client("worker")
    claimed_at = time.monotonic()
    held = [worker_on_a.claim(types=["email"], lease_seconds=LEASE_SECONDS).json()["id"]
            for _ in range(2)]
    assert set(held) < set(jobs)
    # A claim under way on A at the kill (waiting for a type with nothing to claim).
    under_way = pool.submit(_timed, lambda: a.client("worker").claim(types=["pdf"],
                                                                   wait_seconds=20))
    time.sleep(0.3)
    killed_at = time.monotonic()
    a.server.kill()  # kill -9 of its process group: master and worker at once
    assert killed_at - claimed_at < LEASE_SECONDS, "A's leases ran out before it was killed"
    cut_short = under_way.result(timeout=30)
    assert cut_short.response is None, cut_short.response.text  # no answer at all
    print(f"A killed -9 holding leases on {held}")

    worker_on_b = b.client("worker")
    eventually(b.leads, "B to take the lead from the killed A")
    print(f"B leads {time.monotonic() - killed_at:.1f} s after the kill")
    claimed: dict[int, requests.Response] = {}

    def claim_on_b() -> bool:
        answer = worker_on_b.claim(types=["email"], wait_seconds=1, lease_seconds=60)
        if answer.status_code == 200:
            claimed[answer.json()["id"]] = answer
        return set(claimed) == set(jobs)

    eventually(claim_on_b, "B to claim every job, the rescued ones included")
    print(f"B claimed all {len(jobs)} jobs {time.monotonic() - killed_at:.1f} s after the kill")
    for job_id in held:
        assert claimed[job_id].json()["retry_count"] == 1, claimed[job_id].text
    for answer in claimed.values():
        _complete(worker_on_b, answer)
    admin = b.client("admin")
    for job_id in held:
        outcomes = [attempt["outcome"] for attempt in
                    admin.request("GET", f"/jobs/{job_id}/attempts").json()["attempts"]]
        assert outcomes == ["lease_expired", "completed"], outcomes


def _every_job_completed_once(b: Host, ledger: Ledger) -> None:
    admin = b.client("admin")
    stored = {job["id"]: job for job in admin.list_all()}
    assert set(stored) == ledger.ids, (sorted(stored), sorted(ledger.ids))
    assert {job["status"] for job in stored.values()} == {"completed"}, stored
    for job_id in stored:
        events = admin.request("GET", f"/jobs/{job_id}/events").json()["events"]
        assert [event["event"] for event in events].count("completed") == 1, events
    print(f"every job acknowledged ({len(ledger.ids)}) stored and completed once")
