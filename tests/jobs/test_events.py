"""GET /v1/jobs/{id}/events against the real `web` process (ASGI): frames as the job moves, no frame for
an unchanged snapshot, Last-Event-ID honoured (and ignored when it is not a frame id), the stream ended
after the terminal frame or closed at SSE_MAX_S (8 s in this stack), 200 streams at once, and the bounds
on open streams per client (shared by the web processes) and per process."""

import asyncio
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
import requests

from jobs.models import Job
from jobs.services import client_create
from tests.conftest import WEB_STACK_ENV
from tests.support.engine import EngineHttpApi
from tests.support.http_api import HttpApi
from tests.support.procs import ProcfileProcess, free_port
from tests.support.reports import report_body

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
SSE_MAX_S = 8


def read_frames(url: str, api_key: str, last_event_id: str | bytes | None = None, until=None, timeout: float = 30.0,
                ends: list | None = None):
    """Frames of one stream: [(id, data, seconds since the request)], until the server closes it or
    `until(frames)` holds. Returns (frames, whether the server closed the stream). An `event: end` is not
    a frame: its data (and seconds) go into `ends` when given."""
    headers = {"Authorization": f"Bearer {api_key}", "Accept": "text/event-stream"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    started = time.monotonic()
    frames, frame, closed = [], {}, False
    with requests.get(url, headers=headers, stream=True, timeout=timeout) as response:
        assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/event-stream")
        lines = response.iter_lines(decode_unicode=True)
        while True:
            try:
                line = next(lines)
            except StopIteration:
                closed = True
                break
            if line.startswith("id: "):
                frame["id"] = line[4:]
            elif line.startswith("event: "):
                frame["event"] = line[7:]
            elif line.startswith("data: "):
                frame["data"] = json.loads(line[6:])
            elif line == "" and frame:
                if frame.get("event") == "end":
                    assert "id" not in frame  # the client's last id stays the terminal frame's
                    if ends is not None:
                        ends.append((frame["data"], time.monotonic() - started))
                else:
                    frames.append((frame["id"], frame["data"], time.monotonic() - started))
                frame = {}
                if until is not None and until(frames):
                    break
    return frames, closed


@pytest.fixture
def alice(web_stack, engine):
    """A client of the real web process; the jobs it waits for run on the in-process engine."""
    return EngineHttpApi(web_stack.url, client_create(name="alice"), engine)


@pytest.fixture
def alice_with_worker(web_stack, web_worker):
    """A client whose jobs a worker runs while the test reads their stream (the frames follow the run)."""
    return HttpApi(web_stack.url, client_create(name="alice"))


def test_frames_follow_a_report_as_its_chapters_finish_and_never_repeat_a_snapshot(alice_with_worker, ledger):
    alice = alice_with_worker
    chapters = ["one", "two", "three", "four"]
    # The synthesis, then each chapter answered a little later than the one before.
    ledger.faults([{"model": "llm", "action": "delay", "seconds": s} for s in (0.2, 1.0, 2.0, 3.0, 4.0)])
    job_id = alice.create(report_body(chapters), key="stream").json()["id"]
    url = f"{alice.base_url}/v1/jobs/{job_id}/events"

    frames, _ = read_frames(url, alice.api_key, until=lambda fs: fs[-1][1]["status"] == "succeeded")

    snapshots = [data for _, data, _ in frames]
    assert snapshots[-1]["status"] == "succeeded" and snapshots[-1]["chapters"] == {"done": 4, "total": 4}
    assert all(a != b for a, b in zip(snapshots, snapshots[1:]))  # a frame only when something changed
    ids = [int(frame_id) for frame_id, _, _ in frames]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    done = [s["chapters"]["done"] for s in snapshots if "chapters" in s]
    assert done == sorted(done) and len(set(done)) >= 3  # seen as they finished, not all at the end
    assert snapshots[-1]["cost"]["total_usd"] == alice.job(job_id)["cost"]["total_usd"]

    # Reconnecting with the last id sends nothing the client has; an older id sends the current one once.
    again, closed = read_frames(url, alice.api_key, last_event_id=frames[-1][0])
    assert again == [] and closed  # nothing new, and the stream ended (the job had)
    older, _ = read_frames(url, alice.api_key, last_event_id=frames[0][0], until=lambda fs: True)
    assert [int(older[0][0])] == [ids[-1]] and older[0][1] == snapshots[-1]


def test_a_stream_of_a_job_still_open_closes_at_its_limit(alice, ledger, engine):
    job_id = alice.create({"kind": "media", "models": ["sandbox/video-keyed"],
                           "input": {"prompt": "slow", "render_s": 60}}, key="limit").json()["id"]
    engine.start(Job.objects.get(id=job_id))
    engine.run(lambda: alice.job(job_id)["attempts"])  # submitted: running, its render out for 60 s
    started = time.monotonic()
    ends = []
    frames, closed = read_frames(f"{alice.base_url}/v1/jobs/{job_id}/events", alice.api_key, ends=ends)
    elapsed = time.monotonic() - started
    assert closed and SSE_MAX_S - 0.5 <= elapsed <= SSE_MAX_S + 3 and ends == []
    assert len(frames) == 1 and frames[0][1]["status"] == "running"  # the current snapshot, once
    assert [s["name"] for s in frames[0][1]["steps"]][:1] == ["check_output"]  # media jobs stream steps, in order
    assert alice.post(f"/v1/jobs/{job_id}/cancel").status_code == 200


def test_a_stream_ends_after_the_terminal_frame_and_at_once_when_the_client_has_it(alice_with_worker, ledger):
    alice = alice_with_worker
    job_id = alice.create({"kind": "media", "models": ["sandbox/video-keyed"],
                           "input": {"prompt": "quick", "render_s": 2}}, key="end").json()["id"]
    url = f"{alice.base_url}/v1/jobs/{job_id}/events"

    # Followed while it runs: the terminal frame, then `event: end`, then the server closes.
    ends = []
    frames, closed = read_frames(url, alice.api_key, ends=ends)
    assert closed and frames[-1][1]["status"] == "succeeded"
    assert [data for data, _ in ends] == [{"status": "succeeded"}]
    assert ends[0][1] >= frames[-1][2] and ends[0][1] < SSE_MAX_S - 2

    # Already ended on connect: its snapshot once, the end, closed well before SSE_MAX_S.
    ends = []
    started = time.monotonic()
    again, closed = read_frames(url, alice.api_key, ends=ends)
    assert closed and time.monotonic() - started < 3
    assert [data for _, data, _ in again] == [frames[-1][1]] and [data for data, _ in ends] == [{"status": "succeeded"}]

    # The client already has the terminal frame: only the end.
    ends = []
    started = time.monotonic()
    none, closed = read_frames(url, alice.api_key, last_event_id=frames[-1][0], ends=ends)
    assert closed and none == [] and len(ends) == 1 and time.monotonic() - started < 3


@pytest.mark.parametrize("last_event_id", ["7" * 4301, "１２３".encode(), "12a", "-5", "9" * 20])
def test_a_last_event_id_that_is_not_a_frame_id_is_ignored(alice, ledger, last_event_id):
    job_id = alice.create({"kind": "media", "models": ["sandbox/video-keyed"],
                           "input": {"prompt": "odd id", "render_s": 0}}, key="odd-id").json()["id"]
    alice.wait(job_id)
    ends = []
    frames, closed = read_frames(f"{alice.base_url}/v1/jobs/{job_id}/events", alice.api_key,
                                 last_event_id=last_event_id, ends=ends)
    # As a first connection: the current snapshot, then the end (4,301 digits was a 500).
    assert closed and [data["status"] for _, data, _ in frames] == ["succeeded"] and len(ends) == 1


def test_another_clients_job_is_404_and_no_key_is_401(alice, web_stack):
    job_id = alice.create({"kind": "media", "models": ["sandbox/video-keyed"],
                           "input": {"prompt": "mine", "render_s": 0}}, key="mine").json()["id"]
    bob = client_create(name="bob")
    url = f"{web_stack.url}/v1/jobs/{job_id}/events"
    assert requests.get(url, headers={"Authorization": f"Bearer {bob['api_key']}"}, timeout=5).status_code == 404
    anonymous = requests.get(url, timeout=5)
    assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "UNAUTHENTICATED"
    alice.wait(job_id)


def open_job(web_stack, name: str) -> tuple[HttpApi, str]:
    """A client and a job of it that stays queued (no worker runs in these tests): its streams stay open
    until the client closes them or SSE_MAX_S."""
    api = HttpApi(web_stack.url, client_create(name=name))
    created = api.create({"kind": "media", "models": ["sandbox/video-keyed"], "input": {"prompt": name, "render_s": 0}},
                         key=f"open-{name}")
    assert created.status_code == 201, created.text
    return api, created.json()["id"]


class OpenStream:
    """One event stream on a raw socket, held open until close() (the client going away)."""

    def __init__(self, port: int, api: HttpApi, job_id: str, timeout: float = 10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.sendall((f"GET /v1/jobs/{job_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           f"Authorization: Bearer {api.api_key}\r\nAccept: text/event-stream\r\n\r\n").encode())
        seen = b""
        while not self._answered(seen):
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            seen += chunk
        head, _, self.body = seen.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1])
        self.headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}

    @staticmethod
    def _answered(seen: bytes) -> bool:
        """A stream's first frame, or a whole error answer (Content-Length)."""
        head, sep, body = seen.partition(b"\r\n\r\n")
        if not sep:
            return False
        if b" 200 " in head.split(b"\r\n", 1)[0]:
            return b"data: " in body
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        return len(body) >= length

    def error(self) -> dict:
        return json.loads(self.body)["error"]

    def close(self) -> None:
        self.sock.close()


def open_streams(web_stack, api, job_id, n: int) -> list[OpenStream]:
    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(lambda _: OpenStream(web_stack.port, api, job_id), range(n)))


def test_two_hundred_streams_at_once_are_all_served(web_stack):
    # Ten clients, each at its bound (SSE_MAX_PER_CLIENT, 20 by default): 200 streams open at the same moment.
    clients = [open_job(web_stack, f"watcher-{n}") for n in range(10)]
    request = {job_id: (f"GET /v1/jobs/{job_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        f"Authorization: Bearer {api.api_key}\r\nAccept: text/event-stream\r\n\r\n").encode()
               for api, job_id in clients}

    async def all_of_them():
        everyone_served = asyncio.Event()
        served = []

        async def one(job_id) -> bool:
            reader, writer = await asyncio.open_connection("127.0.0.1", web_stack.port)
            try:
                writer.write(request[job_id])
                await writer.drain()
                seen = b""
                while b"\ndata: " not in seen:
                    chunk = await reader.read(4096)
                    if not chunk:
                        return False
                    seen += chunk
                ok = b" 200 " in seen.split(b"\r\n", 1)[0]
                served.append(ok)
                if len(served) == 200:
                    everyone_served.set()
                await asyncio.wait_for(everyone_served.wait(), timeout=60)  # all 200 open at once
                return ok
            finally:
                writer.close()  # the client goes away: its stream is freed

        return await asyncio.wait_for(
            asyncio.gather(*(one(job_id) for _, job_id in clients for _ in range(20))), timeout=60)

    started = time.monotonic()
    served = asyncio.run(all_of_them())
    assert served.count(True) == 200, f"{served.count(True)} of 200 streams served"
    assert time.monotonic() - started < 60
    # Still answering afterwards, and the streams that went away hold nothing: each client opens 20 again.
    api, job_id = clients[0]
    assert api.get("/v1/whoami").status_code == 200
    deadline = time.monotonic() + 10
    while True:
        again = open_streams(web_stack, api, job_id, 20)
        statuses = [stream.status for stream in again]
        for stream in again:
            stream.close()
        if statuses == [200] * 20 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert statuses == [200] * 20


def test_streams_beyond_a_clients_bound_are_429_while_reads_stay_fast_and_others_are_served(web_stack):
    alice, job_id = open_job(web_stack, "greedy")
    bob, bobs_job = open_job(web_stack, "patient")
    bound = 20  # SSE_MAX_PER_CLIENT's default, which the suite's web process runs with

    # Given: alice holds as many streams as she may, spread over the web processes.
    held = open_streams(web_stack, alice, job_id, bound)
    try:
        assert [stream.status for stream in held] == [200] * bound
        # The count is shared by the processes: one lease per stream, each running out within a lease.
        leases = redis.Redis.from_url(WEB_STACK_ENV["BROKER_URL"])
        key = f"payonce:sse:{alice.client_id}"
        now = float(".".join(str(part) for part in leases.time()))
        scores = [score for _, score in leases.zrange(key, 0, -1, withscores=True)]
        assert len(scores) == bound and all(now < score <= now + 31 for score in scores)

        # When: she opens ten more. Then: each is 429 TOO_MANY_STREAMS with a Retry-After.
        extra = open_streams(web_stack, alice, job_id, 10)
        for stream in extra:
            stream.close()
        assert [stream.status for stream in extra] == [429] * 10
        assert {stream.error()["code"] for stream in extra} == {"TOO_MANY_STREAMS"}
        assert all(stream.headers["retry-after"].isdigit() and int(stream.headers["retry-after"]) > 0
                   for stream in extra)
        assert extra[0].error()["limit"] == bound and extra[0].error()["scope"] == "client"

        # A plain read of the job stays fast, and another client is not held up by her bound.
        for _ in range(5):
            started = time.monotonic()
            assert alice.get(f"/v1/jobs/{job_id}").status_code == 200
            assert time.monotonic() - started < 1.0
        bobs = OpenStream(web_stack.port, bob, bobs_job)
        assert bobs.status == 200
        bobs.close()

        # Closing streams frees their slots at once (well before a lease could run out).
        for stream in held[:5]:
            stream.close()
        deadline = time.monotonic() + 5
        while True:
            freed = open_streams(web_stack, alice, job_id, 5)
            if [s.status for s in freed] == [200] * 5 or time.monotonic() > deadline:
                break
            for stream in freed:
                stream.close()
            time.sleep(0.2)
        held[:5] = freed
        assert [stream.status for stream in freed] == [200] * 5
        assert OpenStream(web_stack.port, alice, job_id).status == 429  # and the bound is still there
    finally:
        for stream in held:
            stream.close()


def test_a_web_process_serves_at_most_its_own_bound_of_streams(transactional_db, sandbox):
    web = ProcfileProcess("web", {**WEB_STACK_ENV, "PORT": free_port(), "WEB_CONCURRENCY": 1,
                                  "SSE_MAX_PER_PROCESS": 3}).start()
    held = []
    try:
        clients = [open_job(web, f"viewer-{n}") for n in range(4)]
        held = [OpenStream(web.port, api, job_id) for api, job_id in clients[:3]]
        assert [stream.status for stream in held] == [200] * 3
        refused = OpenStream(web.port, *clients[3])
        assert refused.status == 429 and refused.error()["code"] == "TOO_MANY_STREAMS"
        assert refused.error()["scope"] == "process" and refused.headers["retry-after"].isdigit()
        held.pop().close()
        deadline = time.monotonic() + 5
        while (again := OpenStream(web.port, *clients[3])).status != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        held.append(again)
        assert again.status == 200
    finally:
        for stream in held:
            stream.close()
        web.stop()
