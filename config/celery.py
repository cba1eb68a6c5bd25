"""The Celery app. Two queues: `jobs` (paid work) and `webhooks` (deliveries), each served by its own
worker process, so a broken receiver never slows paid work (API.md, "Processes")."""

import os
from functools import lru_cache
from pathlib import Path

from celery import Celery
from celery.beat import PersistentScheduler
from kombu import Exchange, Queue

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
app.autodiscover_tasks()


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


class Scheduler(PersistentScheduler):
    """beat's own scheduler, which first makes the directory of its schedule file (PAYONCE_VAR_DIR):
    a fresh checkout has none yet."""

    def setup_schedule(self):
        Path(self.schedule_filename).parent.mkdir(parents=True, exist_ok=True)
        super().setup_schedule()
