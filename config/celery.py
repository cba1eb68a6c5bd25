"""The Celery app. Two queues: `jobs` (paid work) and `webhooks` (deliveries), each served by its own
worker process, so a broken receiver never slows paid work (docs/operating.md,
"Running on several machines")."""

import logging
import os
import random
import time
from functools import lru_cache
from pathlib import Path

from celery import Celery, signals
from celery.beat import PersistentScheduler
from celery.worker.consumer import Consumer as CeleryConsumer
from kombu import Exchange, Queue

from config import logs, tracing

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("payonce")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Both queues hang off the default (nameless) exchange and are addressed by name. On Redis that means a
# publish goes straight to the list and needs no binding keys, so a FLUSHALL (or a Redis restart, which
# keeps nothing here) cannot leave publishers sending into an exchange that routes nowhere; on RabbitMQ
# the default exchange routes by queue name natively.
_default = Exchange("", type="direct")
app.conf.task_queues = (Queue("jobs", _default, routing_key="jobs"), Queue("webhooks", _default, routing_key="webhooks"))
app.conf.task_default_exchange = ""
app.conf.task_default_routing_key = "jobs"
app.conf.worker_consumer = "config.celery:Consumer"  # a message of a newer release is kept (below)
app.autodiscover_tasks()
# Autodiscovery looks for `<app>.tasks`; the jobs tasks live in the engine's room (jobs/engine/tasks.py),
# so name that package too, or a worker would start without them and drop every job message it is sent.
app.autodiscover_tasks(["jobs.engine"])


logger = logging.getLogger("payonce.worker")

# How long a worker holds a message whose task it does not know before it gives it back to its queue: 2 s,
# give or take half a second. Redis hands a message to the consumer that has waited longest, and kombu's
# consumers wait in rounds of one second, so a hold of whole seconds handed it back to the worker that gave
# it back, round after round (a worker that knew the task waited 20 s for it in a loaded test run).
UNKNOWN_TASK_AGAIN_S = (1.5, 2.5)


class Consumer(CeleryConsumer):
    """Celery's consumer, but a message whose task this worker does not know is given back, not dropped.

    In a rolling deploy two releases' workers consume one queue for minutes (docs/operating.md,
    "Upgrading with jobs in flight"). Celery rejects a message naming a task it has not registered
    without requeueing it (and marks it failed): a newer release's message would be lost on an older
    worker, and its job wait for a sweep to ring its row again. Here the worker holds the message,
    unacknowledged (a crash gives it back too), for about 2 s (UNKNOWN_TASK_AGAIN_S), then rejects it with
    requeue, so a worker that knows the task takes it; while only workers that do not know it run, it goes
    round every 2 s or so at the cost of one message, never lost. A release sends only tasks the release
    before knows (tests/project/test_release_tasks.py), so this is the net under a deploy that skipped a
    release."""

    def on_unknown_task(self, body, message, exc):
        name = (message.headers or {}).get("task") or "?"
        again_s = random.uniform(*UNKNOWN_TASK_AGAIN_S)
        logger.warning("task %s is not known to this release: given back to its queue in %.1f s for a worker "
                       "that knows it", name, again_s)
        self.timer.call_after(again_s, self._give_back, (message,))

    def _give_back(self, message) -> None:
        try:
            message.reject(requeue=True)
        except self.connection_errors:  # the connection is gone: the broker gives it back itself
            logger.warning("an unknown task's message could not be given back: the broker returns it unacknowledged")


@signals.setup_logging.connect
def _log_through_django(**_):
    """Worker and beat log through Django's LOGGING (config.logs: JSON lines, redacted), not Celery's
    own handler and format: a receiver of this signal is what tells Celery to leave logging alone. As
    Celery does by default, stray writes to stdout and stderr (a print, the console mail backend) become
    records too (logger celery.redirected), so they come out as JSON lines. Celery's banner and its
    shutdown notice are written to the original streams, before and after, and stay plain text."""
    from logging.config import dictConfig

    from django.conf import settings

    dictConfig(settings.LOGGING)
    if app.conf.worker_redirect_stdouts:
        app.log.redirect_stdouts(app.conf.worker_redirect_stdouts_level)


@signals.worker_init.connect
@signals.beat_init.connect
def _refuse_development_settings(**_):
    """worker, webhooks and beat never start with the repository's SECRET_KEY when DEBUG is off (the
    worker signs the report links it mails): config.startup says why, and what to set. It exits
    (SystemExit): Celery logs and swallows an exception a signal's receiver raises."""
    from django.conf import settings

    # Not at the top: the web process runs `python -m config.startup`, which runpy would then find imported.
    from config.startup import refuse_to_serve_with_development_settings  # (see above)

    refuse_to_serve_with_development_settings(settings)


@signals.worker_init.connect
def _tracing_worker(**_):
    """Traces (config.tracing) in a worker: set up in its one process (a pool of threads: no child to
    set up again), named as its log lines name it (`worker` or `webhooks`)."""
    tracing.setup(logs.process_name() or "worker")


@signals.beat_init.connect
def _tracing_beat(**_):
    tracing.setup("beat")


@signals.worker_shutdown.connect
def _tracing_flush(**_):
    """A warm shutdown exports the spans still batched (a SIGKILL loses them: executor.tracing says what
    the next execution emits again)."""
    tracing.flush()


@signals.task_prerun.connect
def _task_log_context(task=None, args=None, kwargs=None, **_):
    """Every line a task logs carries its arguments named like a log field (job_id, run, delivery_id)."""
    logs.task_context_start(task, args, kwargs)


@signals.task_postrun.connect
def _task_log_context_end(**_):
    logs.task_context_end()


@app.task(name="payonce.noop", ignore_result=True)
def noop(counter: str | None = None) -> None:
    """Does nothing: a liveness probe (`celery -A config call payonce.noop`) and the floor of
    bench/e2e_throughput.py (a bare chain of these is the least a job can cost in messages). With
    `counter`, it counts itself in Redis so the bench can see a chain finish."""
    if counter:
        _counter_client().incr(counter)


@lru_cache(maxsize=1)
def _counter_client():
    from redis import Redis

    return Redis.from_url(app.conf.broker_url)


def beat_started_mark(schedule_filename: str) -> Path:
    """The file beat rewrites each time it starts (its pid and the time), next to its schedule file: what
    `make run` (config.devrun) reads to know that beat is up. Not the schedule file's own time: a beat
    started again on an unchanged schedule need not write it (issue 38: a second `make run` waited 120 s
    and said that beat did not answer)."""
    return Path(f"{schedule_filename}.started")


class Scheduler(PersistentScheduler):
    """beat's own scheduler, which first makes the directory of its schedule file (PAYONCE_VAR_DIR):
    a fresh checkout has none yet; and, once the schedule is set up, rewrites its started mark."""

    def setup_schedule(self):
        Path(self.schedule_filename).parent.mkdir(parents=True, exist_ok=True)
        super().setup_schedule()
        mark = beat_started_mark(self.schedule_filename)
        temporary = mark.with_name(f"{mark.name}.{os.getpid()}")
        temporary.write_text(f"{os.getpid()} {time.time():.3f}\n")
        temporary.replace(mark)  # whole or not at all: a reader never sees half a mark
