"""Fair dispatch through real processes (web, two worker processes, the sandbox): a client's running limit
under parallel creates, a waiting render holding no slot, priorities ordering a backlog, and a deadline
ending an unpaid queued job while a paid one goes on, each checked against the sandbox's ledger. The rules one by one are tests/jobs/test_dispatch.py."""

import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest

from accounts.models import Client
from executor.models import Attempt
from jobs.models import Job
from jobs.services import client_create
from tests.conftest import WEB_STACK_ENV, media_body, purge_queue
from tests.support.books import assert_books_balance
from tests.support.http_api import HttpApi
from tests.support.overlap import most_at_once
from tests.support.procs import ProcfileProcess, procfile_command, stop_all

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def _workers(count: int, **env) -> list[ProcfileProcess]:
    """`count` worker processes, as on as many machines (each its own Celery node name)."""
    env = {**WEB_STACK_ENV, **env}
    workers = [ProcfileProcess("worker", env, command=procfile_command("worker").replace("jobs@%h", f"jobs{n}@%h"))
               for n in range(count)]
    for worker in workers:
        worker.launch()
    for worker in workers:
        worker.ready_within(60)
    return workers


def _limited_api(web_stack, max_running: int, **create) -> HttpApi:
    """A new client with its running limit set, as an operator sets it, and its API."""
    credentials = client_create(name="limited", **create)
    Client.objects.filter(id=credentials["client_id"]).update(max_running=max_running)
    return HttpApi(web_stack.url, credentials)


def _create_all(api: HttpApi, bodies: list[tuple[dict, str]], parallel: int) -> list[str]:
    with ThreadPoolExecutor(parallel) as pool:
        created = list(pool.map(lambda item: api.create(item[0], key=item[1]), bodies))
    assert {answer.status_code for answer in created} == {201}, [a.content for a in created if a.status_code != 201][:3]
    return [answer.json()["id"] for answer in created]


def test_a_clients_running_limit_holds_under_200_parallel_creates_on_two_workers(web_stack, ledger):
    purge_queue(WEB_STACK_ENV["BROKER_URL"], "jobs")
    workers = _workers(2, PROVIDER_CALLBACK_BASE_URL=web_stack.url)
    try:
        api = _limited_api(web_stack, 4, monthly_cap_usd=Decimal("1000"))  # 200 renders fit under the cap
        # render_s 0: each render ends with its submit's answer, so a job holds its slot from its start to its
        # end, and both are on the row.
        bodies = [(media_body(input={"prompt": f"job {n}", "render_s": 0}), f"k{n}") for n in range(200)]
        ids = _create_all(api, bodies, parallel=50)
        ended = [api.wait(job_id, timeout=180) for job_id in ids]
    finally:
        stop_all(workers)
    assert {job["status"] for job in ended} == {"succeeded"}, [job["error"] for job in ended if job["error"]][:3]
    spans = list(Job.objects.filter(id__in=ids).values_list("started_at", "completed_at"))
    assert most_at_once(spans) == 4  # never more than its limit in progress at once, and the limit reached
    assert not Job.objects.filter(holds_slot=True).exists()
    charges = assert_books_balance(ledger)  # every charge is one attempt row with its upstream key
    assert len(charges) == 200 and Attempt.objects.count() == 200


def test_a_render_waiting_on_its_provider_holds_no_slot(web_stack, ledger):
    purge_queue(WEB_STACK_ENV["BROKER_URL"], "jobs")
    workers = _workers(1, PROVIDER_CALLBACK_BASE_URL=web_stack.url)
    try:
        api = _limited_api(web_stack, 2)
        bodies = [(media_body(input={"prompt": f"job {n}", "render_s": 4}), f"w{n}") for n in range(8)]
        ids = _create_all(api, bodies, parallel=8)
        ended = [api.wait(job_id, timeout=120) for job_id in ids]
    finally:
        stop_all(workers)
    assert {job["status"] for job in ended} == {"succeeded"}
    # Every render was out at the provider at once although only two jobs may be in progress: a render
    # that waits lets go of its slot.
    attempts = list(Attempt.objects.filter(job_id__in=ids).values_list("created_at", "finished_at"))
    assert most_at_once(attempts) == 8
    assert len(assert_books_balance(ledger)) == 8


def test_priorities_order_a_backlog(web_stack, ledger):
    purge_queue(WEB_STACK_ENV["BROKER_URL"], "jobs")
    api = HttpApi(web_stack.url, client_create(name="backlog"))
    # The backlog is posted with no worker running, lowest priority first (arrival order is the reverse of
    # the order wanted), then one worker thread works through it.
    bodies = [(media_body(input={"prompt": f"job {n}", "render_s": 0}, priority=priority), f"p{priority}-{n}")
              for priority in (1, 3, 5) for n in range(6)]
    ids = [api.create(body, key=key).json()["id"] for body, key in bodies]
    workers = _workers(1, PROVIDER_CALLBACK_BASE_URL=web_stack.url, WORKER_CONCURRENCY="1")
    try:
        ended = [api.wait(job_id, timeout=120) for job_id in ids]
    finally:
        stop_all(workers)
    assert {job["status"] for job in ended} == {"succeeded"}
    started = list(Job.objects.filter(id__in=ids).order_by("started_at").values_list("priority", "created_at"))
    assert [priority for priority, _ in started] == [5] * 6 + [3] * 6 + [1] * 6
    for priority in (1, 3, 5):  # within a priority, one client's jobs start oldest first
        created = [at for p, at in started if p == priority]
        assert created == sorted(created)
    assert len(assert_books_balance(ledger)) == 18


def test_a_deadline_ends_an_unpaid_queued_job_and_leaves_a_paid_one_alone(web_stack, ledger):
    purge_queue(WEB_STACK_ENV["BROKER_URL"], "jobs")
    api = HttpApi(web_stack.url, client_create(name="deadlines"))
    # Queued with no worker running until its deadline has passed: it never sends its call.
    late = api.create(media_body(input={"prompt": "late", "render_s": 0}, policy={"deadline_s": 1}), key="late")
    time.sleep(1.5)
    workers = _workers(1, PROVIDER_CALLBACK_BASE_URL=web_stack.url)
    try:
        # Paid at once by the worker already up, then its deadline passes while it renders: never cut short.
        # (Sent before the worker was up, its deadline once passed while a loaded machine started it.)
        paid = api.create(media_body(input={"prompt": "paid", "render_s": 10}, policy={"deadline_s": 5}), key="paid")
        ended_late = api.wait(late.json()["id"], timeout=60)
        ended_paid = api.wait(paid.json()["id"], timeout=60)
    finally:
        stop_all(workers)
    assert ended_late["status"] == "failed" and ended_late["error"]["code"] == "DEADLINE_EXCEEDED", ended_late
    assert ended_late["attempts"] == [] and ended_late["cost"]["total_usd"] == "0.000000"
    assert ended_paid["status"] == "succeeded", ended_paid["error"]
    charges = assert_books_balance(ledger)
    assert [charge["metadata"]["payonce_job"] for charge in charges] == [paid.json()["id"]]
