"""GET /v1/jobs/{id}/events against the real `web` process (ASGI): frames as the job moves, no frame for
an unchanged snapshot, Last-Event-ID honoured, the stream closed at SSE_MAX_S (8 s in this stack), and 200
streams at once on one web process."""

import asyncio
import json
import time

import pytest
import requests

from jobs.services import client_create
from tests.support.http_api import HttpApi
from tests.test_reports import report_body

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
SSE_MAX_S = 8


def read_frames(url: str, api_key: str, last_event_id: str | None = None, until=None, timeout: float = 30.0):
    """Frames of one stream: [(id, data, seconds since the request)], until the server closes it or
    `until(frames)` holds. Returns (frames, whether the server closed the stream)."""
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
            elif line.startswith("data: "):
                frame["data"] = json.loads(line[6:])
            elif line == "" and frame:
                frames.append((frame["id"], frame["data"], time.monotonic() - started))
                frame = {}
                if until is not None and until(frames):
                    break
    return frames, closed


@pytest.fixture
def alice(web_stack, web_worker):
    return HttpApi(web_stack.url, client_create(name="alice"))


def test_frames_follow_a_report_as_its_chapters_finish_and_never_repeat_a_snapshot(alice, ledger):
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
    assert again == [] and closed  # nothing new, and the stream ended at the limit
    older, _ = read_frames(url, alice.api_key, last_event_id=frames[0][0], until=lambda fs: True)
    assert [int(older[0][0])] == [ids[-1]] and older[0][1] == snapshots[-1]


def test_a_stream_closes_at_its_limit(alice, ledger):
    job_id = alice.create({"kind": "media", "models": ["sandbox/video-keyed"],
                           "input": {"prompt": "quick", "render_s": 0}}, key="limit").json()["id"]
    alice.wait(job_id)
    started = time.monotonic()
    frames, closed = read_frames(f"{alice.base_url}/v1/jobs/{job_id}/events", alice.api_key)
    elapsed = time.monotonic() - started
    assert closed and SSE_MAX_S - 0.5 <= elapsed <= SSE_MAX_S + 3
    assert len(frames) == 1 and frames[0][1]["status"] == "succeeded"  # the current snapshot, once
    assert [s["name"] for s in frames[0][1]["steps"]][:1] == ["check_output"]  # media jobs stream steps, in order


def test_another_clients_job_is_404_and_no_key_is_401(alice, web_stack):
    job_id = alice.create({"kind": "media", "models": ["sandbox/video-keyed"],
                           "input": {"prompt": "mine", "render_s": 0}}, key="mine").json()["id"]
    bob = client_create(name="bob")
    url = f"{web_stack.url}/v1/jobs/{job_id}/events"
    assert requests.get(url, headers={"Authorization": f"Bearer {bob['api_key']}"}, timeout=5).status_code == 404
    anonymous = requests.get(url, timeout=5)
    assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "UNAUTHENTICATED"
    alice.wait(job_id)


def test_two_hundred_streams_at_once_are_all_served(alice, web_stack):
    job_id = alice.create({"kind": "media", "models": ["sandbox/video-keyed"],
                           "input": {"prompt": "watched", "render_s": 0}}, key="many").json()["id"]
    alice.wait(job_id)
    request = (f"GET /v1/jobs/{job_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               f"Authorization: Bearer {alice.api_key}\r\nAccept: text/event-stream\r\n\r\n").encode()

    async def one() -> bool:
        reader, writer = await asyncio.open_connection("127.0.0.1", web_stack.port)
        try:
            writer.write(request)
            await writer.drain()
            seen = b""
            while b"\ndata: " not in seen:
                chunk = await reader.read(4096)
                if not chunk:
                    return False
                seen += chunk
            return b" 200 " in seen.split(b"\r\n", 1)[0]
        finally:
            writer.close()  # the client goes away: its stream is freed

    async def all_of_them():
        return await asyncio.wait_for(asyncio.gather(*(one() for _ in range(200))), timeout=60)

    started = time.monotonic()
    served = asyncio.run(all_of_them())
    assert served.count(True) == 200, f"{served.count(True)} of 200 streams served"
    assert time.monotonic() - started < 60
    # Still answering afterwards: the streams that went away hold nothing.
    assert requests.get(f"{web_stack.url}/v1/whoami", headers={"Authorization": f"Bearer {alice.api_key}"},
                        timeout=10).status_code == 200
