"""Celery's Redis transport, with one redis-py client per channel instead of one per command.

kombu's Redis channel builds a new `redis.Redis` around its connection pool for every publish, ack and
queue-size call (`Channel.conn_or_acquire`), and redis-py builds its table of response callbacks anew
for each: in `web` that was a quarter of the CPU of a POST (bench/README.md, issue 26's profile). A
`redis.Redis` holds no connection of its own (each command takes one from the pool and gives it back),
so one client per pool serves every call of the channel; it is rebuilt when kombu replaces the pool
(after a lost connection, `Channel._disconnect_pools`). Nothing else of kombu's behaviour changes.

Selected by CELERY_BROKER_TRANSPORT for redis:// and rediss:// broker URLs only (config.settings).
"""

from contextlib import contextmanager

from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    # (the pool, the client made around it): the pool's identity says whether the client is still its own.
    _sync_client = None

    @contextmanager
    def conn_or_acquire(self, client=None):
        if client:
            yield client
            return
        pool = self.pool
        cached = self._sync_client
        if cached is None or cached[0] is not pool:
            cached = self._sync_client = (pool, self._create_client())
        yield cached[1]


class Transport(kombu_redis.Transport):
    Channel = Channel
