"""The web process's request threads (config.asgi.PooledThreadsASGIHandler): a request is queued on the thread
with the fewest requests, but never behind one that has blocked its thread for longer than STALLED_S while
another thread is free of such a request (a key page fetch waiting out its timeout held a bystander's
whoami for 3 s: tests/executor/test_key_page_outage.py)."""

import time

from config.asgi import STALLED_S, PooledThreadsASGIHandler


def test_a_stalled_thread_is_passed_over_even_with_fewer_requests():
    handler = PooledThreadsASGIHandler(threads=2)
    now = time.monotonic()
    handler._started = [[now - STALLED_S - 2.5], [now - 0.01, now - 0.02]]  # one blocked; two quick ones queued
    assert handler._least_busy(now) == 1
    handler._started = [[now - 0.01], [now - 0.01, now - 0.02]]  # none blocked: the fewest
    assert handler._least_busy(now) == 0
    handler._started = [[now - 3.0], [now - 2.0, now - 0.02]]  # both blocked: the fewest still
    assert handler._least_busy(now) == 0
