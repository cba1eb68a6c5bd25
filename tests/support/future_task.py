"""A task only a "newer release" knows: a worker started with `--include tests.support.future_task` stands
for the next release's worker (tests/project/test_release_workers.py). It counts itself in the broker's
Redis under the key it is given, so the test sees it run."""

from celery import shared_task

NAME = "payonce.future_task"


@shared_task(name=NAME, ignore_result=True)
def future_task(counter: str) -> None:
    from config.celery import _counter_client

    _counter_client().incr(counter)
