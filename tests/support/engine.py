"""The job engine run in this process, as a worker runs it, with no worker process and no broker: the one
in-process driver of the suite (docs/testing.md, "The pyramid").

`Engine` stands in for the broker and for one worker thread, and for nothing else:

- every message for a task the `worker` process runs (the `jobs` queue: `jobs.run_stage`,
  `jobs.run_substep`, `jobs.stop_upstream` from the API's create, retry and cancel, a provider's wake and
  the tasks themselves; an order's duplicate mail) goes to a queue of the engine's instead of the broker;
  a task of another process's queue (`webhooks.*`) goes out as before;
- a message is run by the task's own body (jobs.engine.tasks) under a Celery request with the message's id,
  root id, chain and retries, so the task's own `_follow` turns the runner's outcome into messages (the
  next link, the same task again after a back-off, a fan-out's group, a new chain), and the chain's
  next link is sent when a task returns with its chain left, as Celery's tracer does;
- a job's doorbell (jobs.dispatch) run for that job alone (`run(job=...)`, `run_job`) starts that job, as a
  named first stage does; run with no job, it starts whoever's turn it is, as on a worker;
- messages run one at a time, in the order they are due; a countdown is honoured, because the sandbox's
  renders and the provider's fault windows take real time, unless `pauses=False` runs a message as soon
  as it is the next one due (the runner allows it wherever the lease kept across the pause belongs to
  the task or chain that comes back for it).

What the engine cannot show is a process boundary (a worker killed mid-step, a lost broker, two workers at
once): those tests start real processes (tests/e2e, tests/chaos).
"""

import itertools
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from fnmatch import fnmatch

from celery import signature
from celery._state import _task_stack
from celery.exceptions import Retry
from django.conf import settings
from django.utils import timezone

from config.celery import app
from jobs.engine import chain, runner, tasks
from jobs.models import Job, JobStatus
from tests.support.http_api import HttpApi

ENDED = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.WAITING})


def worker_runs(name: str) -> bool:
    """Whether the `worker` process runs this task: every task not routed to another queue
    (CELERY_TASK_ROUTES sends `webhooks.*` to the webhooks process)."""
    return not any(fnmatch(name, pattern) for pattern in settings.CELERY_TASK_ROUTES)


@dataclass(order=True)
class Message:
    due: float
    seq: int
    name: str = field(compare=False)
    args: tuple = field(compare=False)
    kwargs: dict = field(compare=False)
    id: str = field(compare=False)
    root_id: str | None = field(compare=False)
    parent_id: str | None = field(compare=False)
    chain: list | None = field(compare=False)
    retries: int = field(compare=False, default=0)

    @property
    def job_id(self) -> str:
        """The first argument: the job's id for the engine's tasks (another task's own id otherwise)."""
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Ran:
    """One message run: the task, its arguments, and what the runner answered it (jobs.engine.outcomes)."""

    message: Message
    outcome: object


class Engine:
    def __init__(self, *, pauses: bool = True):
        self.pauses = pauses
        self.queue: list[Message] = []
        self.ran: list[Ran] = []
        self._seq = itertools.count()
        # Threads of a test may each run their own job at once (run(job=...)): the queue is shared, the
        # message being run is each thread's own.
        self._lock = threading.Lock()
        self._local = threading.local()
        self._roots: dict[tuple[str, int], str] = {}

    # --- the broker ------------------------------------------------------------------------------------

    def send_task(self, name, args=None, kwargs=None, countdown=None, eta=None, task_id=None, root_id=None,
                  parent_id=None, chain=None, retries=0, **options):
        """What Celery's send_task does with a message, into the engine's queue: a message sent while a
        task runs inherits its root id and parent (celery.app.base.Celery.send_task)."""
        if not worker_runs(name):
            return self._send_task(name, args, kwargs, countdown=countdown, eta=eta, task_id=task_id,
                                   root_id=root_id, parent_id=parent_id, chain=chain, **options)
        parent = getattr(self._local, "current", None)
        if parent is not None:
            parent_id = parent_id or parent.id
            root_id = root_id or parent.root_id or parent.id
        task_id = task_id or str(uuid.uuid4())
        due = time.monotonic() + (countdown or 0)
        if eta is not None:
            due = time.monotonic() + max(0.0, eta.timestamp() - time.time())
        with self._lock:
            self.queue.append(Message(due, next(self._seq), name, tuple(args or ()), dict(kwargs or {}), task_id,
                                      root_id or task_id, parent_id, list(chain) if chain else None, retries or 0))
        return app.AsyncResult(task_id)

    @contextmanager
    def installed(self):
        """Send the engine's tasks here for the duration (the `engine` fixture)."""
        app.loader.import_default_modules()  # every app's tasks module, as a worker imports them at start
        self._send_task = app.send_task
        app.send_task = self.send_task
        saved_follow, tasks._follow = tasks._follow, self._follow
        try:
            yield self
        finally:
            del app.send_task  # the class's own again
            tasks._follow = saved_follow
            del self._send_task

    def _follow(self, task, outcome, job_id, run):
        self._local.outcome = outcome
        return self._real_follow(task, outcome, job_id, run)

    _real_follow = staticmethod(tasks._follow)

    # --- the worker ------------------------------------------------------------------------------------

    def _run(self, message: Message) -> None:
        """One message, by its task's body, under the request a worker would give it."""
        task = app.tasks[message.name]
        task.push_request(id=message.id, root_id=message.root_id, parent_id=message.parent_id,
                          chain=message.chain, args=list(message.args), kwargs=dict(message.kwargs),
                          retries=message.retries, called_directly=False, is_eager=False, headers=None,
                          delivery_info={"exchange": "", "routing_key": "jobs", "priority": None},
                          hostname="engine@tests")
        _task_stack.push(task)
        self._local.current, self._local.outcome = message, None
        try:
            try:
                task.run(*message.args, **message.kwargs)
            except Retry:  # the task sent itself again (Task.retry), as a worker acks the message
                return
            links = task.request.chain
            if links:  # the task returned with its chain left: the tracer sends the next link
                signature(links.pop(), app=app).apply_async(chain=links or None, parent_id=message.id,
                                                            root_id=message.root_id)
        finally:
            self.ran.append(Ran(message, self._local.outcome))
            self._local.current = None
            _task_stack.pop()
            task.pop_request()

    def run(self, until=None, *, timeout: float = 60.0, job=None, only=None, pauses: bool | None = None) -> list[Ran]:
        """Run the queued messages, and those they send, in the order they are due, until the queue is
        empty or `until()` holds (checked before each message). `job` runs that job's messages alone,
        and `only(message)` those it accepts, leaving the others queued; `pauses` overrides the engine's
        own for this call. Every message run, in order."""
        pauses = self.pauses if pauses is None else pauses
        deadline = time.monotonic() + timeout
        start = len(self.ran)
        while True:
            if until is not None and until():
                return [ran for ran in self.ran[start:] if job is None or ran.message.job_id == str(job)]
            with self._lock:
                mine = [m for m in self.queue if (job is None or m.job_id == str(job)) and (only is None or only(m))]
                message = min(mine) if mine else None  # the first due, and of those the first sent
                if message is not None:
                    self.queue.remove(message)
                    if job is not None and message.kwargs.get("doorbell"):
                        # A test running one job runs that job: its doorbell names it, as a first stage
                        # sent again does, rather than starting whoever's turn it is (jobs.dispatch; the
                        # turns are tests/jobs/test_dispatch.py's and the e2e tests').
                        message.kwargs = {k: v for k, v in message.kwargs.items() if k != "doorbell"}
            if message is None:
                if until is not None:
                    raise AssertionError(f"nothing left to run, and the condition does not hold: {self.ran[-3:]}")
                return [ran for ran in self.ran[start:] if job is None or ran.message.job_id == str(job)]
            wait = max(message.due - time.monotonic(), 0) if pauses else 0
            if time.monotonic() + wait > deadline:
                raise AssertionError(f"the engine did not settle within {timeout} s: {self.ran[-3:]}")
            time.sleep(wait)
            self._run(message)

    # --- what a test asks ------------------------------------------------------------------------------

    def start(self, job: Job, from_stage: int | None = None) -> None:
        """Send the chain of the job's run, from the first stage not done, as the API's enqueue does."""
        if from_stage is None:
            from_stage = runner.resume_point(job) or 0
        chain.start_run(job.id, job.run, job.kind, from_stage)

    def run_job(self, job, *, timeout: float = 60.0, pauses: bool | None = None) -> Job:
        """Run a job until it ends (succeeded, failed, cancelled, or waiting for a person) and nothing of it
        is left queued; started here if nothing of its current run is queued yet (a message of a run since
        replaced only stops, as the runner says). The row as it ended."""
        job_id = getattr(job, "id", job)
        row = Job.objects.get(id=job_id)
        with self._lock:
            queued = any(m.job_id == str(job_id) and m.args[1:2] == (row.run,) for m in self.queue)
        if not queued and row.status not in ENDED:
            self.start(row)
        self.run(job=job_id, timeout=timeout, pauses=pauses)
        row.refresh_from_db()
        assert row.status in ENDED, f"job {job_id} is {row.status} and nothing of it is queued: {self.ran[-3:]}"
        return row

    def stage(self, job: Job, stage: str, *, timeout: float = 60.0, task_id: str | None = None) -> list:
        """Run one stage of the job as a lone message (no chain after it), sent again after each back-off
        or poll (Later) until it settles, as a test steps through a run; the runner's outcomes, in order.
        What else the stage sends (a fan-out, the rest of the run) stays queued. `task_id`: the message's
        id (the lease owner), else a new one (a redelivery is a new message)."""
        # Each call is the next link of one chain of the job's (one root id): a polling lease claimed by
        # one stage is the chain's, and the link that runs the waiting stage takes it back.
        root = self._roots.setdefault((str(job.id), job.run), str(uuid.uuid4()))
        result = app.send_task(chain.RUN_STAGE, (str(job.id), job.run, stage), root_id=root, task_id=task_id)
        return [ran.outcome for ran in self.run(only=lambda message: message.id == result.id, timeout=timeout)]


def media_job(client_id, *, models=("sandbox/video-keyed",), input=None, policy=None, output_key=None) -> Job:
    """A media job's row as POST /v1/jobs writes it, not enqueued: the test runs it (Engine.run_job, or
    Engine.stage one stage at a time)."""
    job_id = uuid.uuid4()
    return Job.objects.create(
        id=job_id, client_id=client_id, idempotency_key=f"k-{job_id}", request_hash="0" * 64, kind="media",
        model_chain=list(models), input=input or {"prompt": "a lighthouse at dusk", "render_s": 0},
        policy=policy or {"attempts_per_model": 3, "fallback_on": []},
        output_key=output_key or f"outputs/{job_id}/output.bin", metadata={},
        lease_until=timezone.now() + timedelta(minutes=10))


class EngineHttpApi(HttpApi):
    """A client of the real `web` process (tests/support/http_api.py) whose jobs the in-process engine runs:
    the web process answers, and `wait` runs the job here first (the message the web process sent its own
    broker is left to the purge of the next worker that serves it)."""

    def __init__(self, base_url: str, credentials: dict, engine: Engine):
        super().__init__(base_url, credentials)
        self.engine = engine

    def wait(self, job_id: str, *args, **kwargs) -> dict:
        self.engine.run_job(job_id)
        return super().wait(job_id, *args, **kwargs)
