"""Waits under real gunicorn, on both engines, with the server killed -9 in the middle
(docs/WAITS.md): 2,000 jobs suspend on sleeps, events, waitpoint tokens and waits that time
out, while events are posted, tokens answered (some twice at once) and timeouts pass. After
the restart every job resumes exactly once, by what its wait allowed, with the right data,
none is claimed while it is suspended, and no request is answered 5xx."""

from __future__ import annotations

import queue
import random
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import requests

from tests.e2e.client import QueueClient, server_errors
from tests.servers import LiveServer, create_api_key

JOBS = 2000
KINDS = ("sleep", "event", "token", "timeout")
EVENT_KEYS = 40
WORKERS = 8
# A claim the kill cut off is rescued after this long (its lease), and claimed again.
LEASE_SECONDS = 8
# A token whose suspend answer the kill cut off is lost with it: its wait ends by this timeout.
TOKEN_TIMEOUT_SECONDS = 12
SHORT_TIMEOUT_SECONDS = 3
KILL_AFTER_SUSPENDS = JOBS // 3
RUN_TIMEOUT_SECONDS = 240


def kind_of(n: int) -> str:
    return KINDS[n % len(KINDS)]


@dataclass
class Run:
    """What the clients did and saw, across threads."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    suspended: set[int] = field(default_factory=set)
    completed: set[int] = field(default_factory=set)
    # Each claim's `resumed`, by job.
    resumed_seen: dict[int, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    # Token answers that were taken (200), and their data, by job.
    token_taken: dict[int, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    # Event data posted, by key.
    posted: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    unexpected: list[str] = field(default_factory=list)
    tokens: queue.Queue[tuple[int, str]] = field(default_factory=queue.Queue)
    kill_point: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)

    def note(self, message: str) -> None:
        with self.lock:
            self.unexpected.append(message)


def retried(call: Any, *, until: float) -> requests.Response:
    """The call, sent again while the server is down (killed and starting again)."""
    while True:
        try:
            response = call()
            if response.status_code < 500:
                return response
        except requests.RequestException:
            pass
        if time.monotonic() > until:
            raise AssertionError("the server did not come back")
        time.sleep(0.2)


def wait_body(job: dict[str, Any]) -> dict[str, Any]:
    n = job["payload"]["n"]
    kind = kind_of(n)
    if kind == "sleep":
        return {"seconds": 1 + n % 3}
    if kind == "event":
        return {"wait_for": {"event": "paid", "key": str(n % EVENT_KEYS),
                             "timeout_seconds": 3600}}
    if kind == "token":
        return {"wait_for": {"token": True, "timeout_seconds": TOKEN_TIMEOUT_SECONDS}}
    return {"wait_for": {"event": "never", "timeout_seconds": SHORT_TIMEOUT_SECONDS}}


def work(client: QueueClient, run: Run, deadline: float) -> None:
    while not run.done.is_set() and time.monotonic() < deadline:
        answer = retried(lambda: client.claim_many(max_jobs=10, lease_seconds=LEASE_SECONDS),
                         until=deadline)
        jobs = answer.json()["jobs"] if answer.status_code == 200 else []
        if not jobs:
            time.sleep(0.05)
            continue
        for job in jobs:
            if job.get("resumed") is not None:
                with run.lock:
                    run.resumed_seen[job["id"]].append(job["resumed"])
                finished = retried(lambda j=job: client.complete(
                    j["id"], lease_token=j["lease_token"], result={}), until=deadline)
                if finished.status_code == 200:
                    with run.lock:
                        run.completed.add(job["id"])
                continue
            suspended = retried(lambda j=job: client.request(
                "POST", f"/jobs/{j['id']}/suspend",
                json={"lease_token": j["lease_token"], **wait_body(j),
                      "checkpoint": {"n": j["payload"]["n"]}}), until=deadline)
            if suspended.status_code != 200:
                # A lease the kill let run out: the job was rescued and comes back.
                if suspended.status_code != 409:
                    run.note(f"suspend {suspended.status_code} {suspended.text[:200]}")
                continue
            shown = suspended.json()
            with run.lock:
                run.suspended.add(job["id"])
                if len(run.suspended) >= KILL_AFTER_SUSPENDS:
                    run.kill_point.set()
            if "waitpoint" in shown:
                run.tokens.put((job["id"], shown["waitpoint"]["url"]))


def post_events(client: QueueClient, run: Run, deadline: float) -> None:
    seq = 0
    while not run.done.is_set() and time.monotonic() < deadline:
        key = str(seq % EVENT_KEYS)
        data = {"key": key, "seq": seq}
        try:
            posted = client.request("POST", "/events",
                                    json={"name": "paid", "key": key, "data": data},
                                    headers={"Idempotency-Key": f"paid-{seq}"})
        except requests.RequestException:
            posted = None
        # An event the kill cut off may have landed: its data may resume a job, so it is
        # counted as posted either way.
        with run.lock:
            run.posted[key].append(data)
        if posted is not None and posted.status_code >= 500:
            run.note(f"event {posted.status_code}")
        seq += 1
        time.sleep(0.02)


def answer_tokens(url: str, run: Run, deadline: float) -> None:
    session = requests.Session()
    rng = random.Random(7)
    while not run.done.is_set() and time.monotonic() < deadline:
        try:
            job_id, path = run.tokens.get(timeout=0.2)
        except queue.Empty:
            continue
        # Some tokens are answered twice at once: one answer is taken, the other told 409.
        times = 2 if rng.random() < 0.3 else 1
        bodies = [{"data": {"job": job_id, "answer": i}} for i in range(times)]

        def send(body: dict[str, Any], path: str = path) -> requests.Response | None:
            try:
                return session.post(url() + path, json=body, timeout=30)
            except requests.RequestException:
                return None

        with ThreadPoolExecutor(times) as pool:
            answers = list(pool.map(send, bodies))
        for body, answer in zip(bodies, answers, strict=True):
            if answer is not None and answer.status_code == 200:
                with run.lock:
                    run.token_taken[job_id].append(body["data"])
            elif answer is not None and answer.status_code not in (409,):
                run.note(f"waitpoint {answer.status_code} {answer.text[:200]}")


def events_of(client: QueueClient, job_id: int) -> list[dict[str, Any]]:
    answer = client.request("GET", f"/jobs/{job_id}/events")
    assert answer.status_code == 200, answer.text
    events: list[dict[str, Any]] = answer.json()["events"]
    return events


def test_every_wait_resumes_once_across_a_kill(start_server, server_database_url):
    server: LiveServer = start_server(server_database_url, workers=2, threads=8)
    producer = QueueClient(server, create_api_key(server_database_url, "shop", "producer"))
    admin = QueueClient(server, create_api_key(server_database_url, "ops", "admin"))
    worker_token = create_api_key(server_database_url, "mailer", "worker")
    workers = [QueueClient(server, worker_token) for _ in range(WORKERS)]
    for start in range(0, JOBS, 500):
        batch = [{"type": "email", "payload": {"n": n}, "max_retries": 25}
                 for n in range(start, start + 500)]
        made = producer.request("POST", "/jobs/batch", json={"jobs": batch})
        assert made.status_code == 201, made.text
    ids = {job["payload"]["n"]: job["id"] for job in admin.list_all()}
    assert len(ids) == JOBS

    run = Run()
    deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
    threads = [threading.Thread(target=work, args=(client, run, deadline)) for client in workers]
    threads.append(threading.Thread(target=post_events, args=(producer, run, deadline)))
    threads += [threading.Thread(target=answer_tokens, args=(lambda: server.url, run, deadline))
                for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        assert run.kill_point.wait(RUN_TIMEOUT_SECONDS), run.unexpected
        server.kill()  # kill -9, every process of it at once
        server.start()
        while time.monotonic() < deadline:
            with run.lock:
                if len(run.completed) == JOBS:
                    break
            time.sleep(0.5)
    finally:
        run.done.set()
        for thread in threads:
            thread.join(60)

    assert run.unexpected == []
    assert len(run.completed) == JOBS, f"{JOBS - len(run.completed)} jobs never completed"
    assert server_errors([producer, admin, *workers]) == {}

    by_job = {job["id"]: job for job in admin.list_all()}
    for n, job_id in ids.items():
        kind = kind_of(n)
        job = by_job[job_id]
        assert job["status"] == "completed", job
        events = [event["event"] for event in events_of(admin, job_id)]
        # One wait, resumed once; never claimed while suspended.
        assert events.count("suspended") == 1 and events.count("resumed") == 1, (n, events)
        between = events[events.index("suspended") + 1:events.index("resumed")]
        assert between == [], (n, events)
        # Each claim after the resume carried the same `resumed`.
        seen = run.resumed_seen[job_id]
        assert seen and all(resumed == seen[0] for resumed in seen), (n, seen)
        resumed = seen[0]
        if kind == "sleep":
            assert (resumed["by"], resumed["data"]) == ("time", None), (n, resumed)
        elif kind == "timeout":
            assert (resumed["by"], resumed["data"]) == ("timeout", None), (n, resumed)
        elif kind == "event":
            assert resumed["by"] == "event", (n, resumed)
            assert resumed["data"] in run.posted[str(n % EVENT_KEYS)], (n, resumed)
        else:
            taken = run.token_taken.get(job_id, [])
            assert len(taken) <= 1, (n, taken)  # a token completes once
            if resumed["by"] == "token":
                # The answer the server took; a taken answer whose 200 the kill cut off is
                # the only one it may be without the client's record.
                assert taken in ([resumed["data"]], []), (n, resumed, taken)
            else:
                assert (resumed["by"], taken) == ("timeout", []), (n, resumed, taken)
    kinds = Counter(resumed[0]["by"] for resumed in run.resumed_seen.values())
    assert kinds["time"] == JOBS // 4 and kinds["event"] == JOBS // 4, kinds
    assert kinds["token"] > 0, kinds
