"""The Celery app. Two queues: `jobs` (paid work) and `webhooks` (deliveries), each served by its own
worker process, so a broken receiver never slows paid work (API.md, "Processes")."""

import os

from celery import Celery
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("payonce")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_queues = (Queue("jobs"), Queue("webhooks"))
app.autodiscover_tasks()
