"""schemathesis hooks for payonce's API fuzzing: a request answered 4xx wrote nothing and can pay nothing.

Loaded by schemathesis from tests/fuzz/schemathesis.toml (`hooks = "tests.fuzz.hooks"`). The runner
(tests/e2e/test_fuzz_api.py) runs only `web` while schemathesis sends requests one at a time (`workers = 1`),
so any change between just before a request and just after its answer is that request's doing. Around
every request these hooks take a snapshot of:

1. every table of the database (`public` schema): its row count and a digest of its rows with their
   `xmin`, so an insert, a delete and an update (even one that writes the same values) all show;
2. every list in the broker's Redis database: the Celery queues (`jobs`, `webhooks`, and their priority
   lists), where a message for a worker would wait;
3. the number of calls the sandbox provider has logged (`/control/calls`).

The `rejected_request_wrote_nothing` check fails a case answered 4xx whose snapshot changed, and also a
4xx case after which something changed before the next request went out (a write that lands after its
answer). Every answer is appended to FUZZ_ANSWERS_PATH as one JSON line (operation, status, what changed,
the job a 2xx answer created, the names of the headers the case set), for the runner's checks after the run.

Settings (environment, set by the runner): FUZZ_WATCH_DATABASE_URL, FUZZ_WATCH_BROKER_URL,
FUZZ_WATCH_SANDBOX_URL, FUZZ_ANSWERS_PATH.
"""

from __future__ import annotations

import json
import os
import threading

import psycopg
import redis
import requests
import schemathesis

DATABASE_URL = os.environ["FUZZ_WATCH_DATABASE_URL"]
BROKER_URL = os.environ["FUZZ_WATCH_BROKER_URL"]
SANDBOX_URL = os.environ["FUZZ_WATCH_SANDBOX_URL"]
ANSWERS_PATH = os.environ["FUZZ_ANSWERS_PATH"]

# The 2xx answers that create a job, and where the job's id is in their body.
CREATES_JOB = {"POST /v1/jobs": "id", "POST /v1/orders": "job_id"}


class Snapshots:
    """What a request could have written, read from outside the web process."""

    def __init__(self):
        self.db = psycopg.connect(DATABASE_URL, autocommit=True)  # each statement sees every commit so far
        tables = [name for (name,) in self.db.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename")]
        assert tables, f"no tables in {DATABASE_URL}"
        self.sql = " UNION ALL ".join(
            f"SELECT '{name}', count(*), md5(coalesce(string_agg(r.xmin::text || ' ' || r::text, E'\\n'"
            f" ORDER BY r.xmin::text || ' ' || r::text), '')) FROM \"{name}\" r"
            for name in tables
        )
        self.broker = redis.Redis.from_url(BROKER_URL)
        self.http = requests.Session()

    def take(self) -> dict:
        rows = {name: (count, digest) for name, count, digest in self.db.execute(self.sql)}
        queues = {key.decode(errors="replace"): self.broker.llen(key) for key in self.broker.scan_iter(_type="list")}
        calls = self.http.get(f"{SANDBOX_URL}/control/calls", timeout=10)
        calls.raise_for_status()
        return {"rows": rows, "queues": queues, "provider_calls": len(calls.json()["calls"])}


def changes(before: dict, after: dict) -> list[str]:
    """What differs between two snapshots, in words."""
    found = []
    for table in sorted(set(before["rows"]) | set(after["rows"])):
        (was, was_digest), (now, now_digest) = before["rows"].get(table, (0, "")), after["rows"].get(table, (0, ""))
        if (was, was_digest) != (now, now_digest):
            found.append(f"table {table}: {was} -> {now} rows" + (", rows changed" if was == now else ""))
    for queue in sorted(set(before["queues"]) | set(after["queues"])):
        was, now = before["queues"].get(queue, 0), after["queues"].get(queue, 0)
        if was != now:
            found.append(f"broker list {queue!r}: {was} -> {now} messages")
    if before["provider_calls"] != after["provider_calls"]:
        found.append(f"sandbox provider calls: {before['provider_calls']} -> {after['provider_calls']}")
    return found


class Watch:
    """The snapshot before the request in flight, what the last answered request left behind, and the
    breaches of the rule not reported yet."""

    def __init__(self):
        self.lock = threading.Lock()
        self.snapshots: Snapshots | None = None
        self.in_flight: dict[str, dict] = {}  # case id -> snapshot before its request
        self.last: tuple[str, int, dict] | None = None  # (request, status, snapshot after its answer)
        self.breaches: list[str] = []
        self.seq = 0

    def take(self) -> dict:
        if self.snapshots is None:
            self.snapshots = Snapshots()
        return self.snapshots.take()


WATCH = Watch()


def rejected(status: int) -> bool:
    return 400 <= status < 500


@schemathesis.hook
def before_call(context, case, **kwargs):
    with WATCH.lock:
        if WATCH.in_flight:  # what changed could be either request's doing: the verdicts would mean nothing
            raise RuntimeError("tests/fuzz/hooks.py needs one request at a time (workers = 1)")
        snapshot = WATCH.take()
        WATCH.in_flight[case.id] = snapshot
        if WATCH.last is not None:
            request, status, after = WATCH.last
            if rejected(status):
                WATCH.breaches += [f"after {request} was answered {status}, before the next request: {change}"
                                   for change in changes(after, snapshot)]


@schemathesis.hook
def after_call(context, case, response):
    with WATCH.lock:
        after = WATCH.take()
        before = WATCH.in_flight.pop(case.id, None)
        wrote = changes(before, after) if before is not None else ["(no snapshot was taken before the request)"]
        request = f"{case.method} {case.formatted_path}"
        if rejected(response.status_code):
            WATCH.breaches += [f"{request} answered {response.status_code}: {change}" for change in wrote]
        WATCH.last = (request, response.status_code, after)
        WATCH.seq += 1
        operation = f"{case.method} {case.operation.path}"
        record = {"seq": WATCH.seq, "operation": operation, "path": case.formatted_path,
                  "phase": case.meta.phase.name.value if case.meta is not None else None,
                  "status": response.status_code, "wrote": wrote, "job_id": None,
                  "headers": sorted({name.lower() for name in (case.headers or {})})}
        if operation in CREATES_JOB and 200 <= response.status_code < 300:
            try:
                record["job_id"] = response.json().get(CREATES_JOB[operation])
            except (ValueError, AttributeError):
                pass  # a body that is not the schema's is the conformance checks' failure to report
        with open(ANSWERS_PATH, "a") as log:
            log.write(json.dumps(record) + "\n")


@schemathesis.hook
def after_network_error(context, case, request):
    with WATCH.lock:  # no answer: nothing to judge, and the next request starts from a fresh snapshot
        WATCH.in_flight.pop(case.id, None)
        WATCH.last = None


@schemathesis.check
def rejected_request_wrote_nothing(ctx, response, case):
    """A 4xx answer wrote no row, queued no task and called no provider. Checks run right after their
    case's request, so what is pending is this case's (or, for a late write, the request before it)."""
    with WATCH.lock:
        breaches, WATCH.breaches = WATCH.breaches, []
    if breaches:
        raise AssertionError("A rejected request changed state:\n  " + "\n  ".join(breaches))
    return None
