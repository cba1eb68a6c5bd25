"""The `web` process runs Django's sync code on a few long-lived threads (config.asgi), not on a thread
made and joined for every request: under load the set of its threads stays the same."""

import os
import threading
import uuid

import pytest

from jobs.services import client_create
from tests.support.http_api import HttpApi

pytestmark = pytest.mark.e2e


def _thread_ids(pids: list[int]) -> set[tuple[int, int]]:
    ids = set()
    for pid in pids:
        try:
            ids.update((pid, int(tid)) for tid in os.listdir(f"/proc/{pid}/task"))
        except FileNotFoundError:
            pass
    return ids


def _hammer(api: HttpApi, threads: int, each: int, statuses: list[int], seen: set, pids: list[int]) -> None:
    """`threads` clients send `each` requests; after every request the web processes' threads are read."""
    lock = threading.Lock()

    def client() -> None:
        own = HttpApi(api.base_url, {"client_id": api.client_id, "api_key": api.api_key})
        for n in range(each):
            response = own.get("/v1/whoami") if n % 2 else own.create({"kind": "media",
                "models": ["sandbox/image-lookup"], "input": {"prompt": "p"}}, key=str(uuid.uuid4()))
            with lock:
                statuses.append(response.status_code)
                seen.update(_thread_ids(pids))

    workers = [threading.Thread(target=client) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def test_web_keeps_its_threads_under_load(web_stack, transactional_db):
    api = HttpApi(web_stack.url, client_create(name="threads"))
    pids = web_stack.children()  # WEB_CONCURRENCY processes (and multiprocessing's resource tracker)
    assert len(pids) >= 2
    statuses: list[int] = []
    # Warm up: every connection, the sync threads and whatever a process starts once.
    _hammer(api, threads=8, each=10, statuses=statuses, seen=set(), pids=pids)
    before = _thread_ids(pids)
    seen: set = set()
    _hammer(api, threads=8, each=40, statuses=statuses, seen=seen, pids=pids)
    assert set(statuses) == {200, 201}, statuses
    # A thread per request would show up here as hundreds of new thread ids.
    assert seen - before == set(), f"{len(seen - before)} threads started during 320 requests"
    assert _thread_ids(pids) == before
