"""config.broker: Celery's Redis transport with one redis-py client per channel, against the real Redis."""

import uuid

import pytest
from django.conf import settings
from kombu import Connection

from config import broker
from config.celery import app


def test_the_app_publishes_through_the_transport_that_keeps_its_client():
    assert settings.CELERY_BROKER_TRANSPORT == "config.broker:Transport"
    with app.connection_for_write() as conn:
        assert isinstance(conn.default_channel, broker.Channel)


def test_one_client_serves_every_call_until_kombu_replaces_the_pool():
    with Connection(settings.CELERY_BROKER_URL, transport=broker.Transport) as conn:
        channel = conn.default_channel
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second
            assert first.connection_pool is channel.pool
        given = object()
        with channel.conn_or_acquire(given) as passed:
            assert passed is given  # a client the caller holds (a pipeline's) is used as it is
        channel._disconnect_pools()  # what kombu does after a lost connection
        with channel.conn_or_acquire() as after:
            assert after is not first and after.connection_pool is channel.pool
            assert after.ping()


def test_messages_go_and_come_back_through_it():
    name = f"test-broker-{uuid.uuid4().hex}"
    with Connection(settings.CELERY_BROKER_URL, transport=broker.Transport) as conn:
        simple = conn.SimpleQueue(name)
        try:
            for n in range(3):
                simple.put({"n": n}, serializer="json")
            got = []
            for _ in range(3):
                message = simple.get(timeout=5)
                got.append(message.payload["n"])
                message.ack()
            assert sorted(got) == [0, 1, 2]
            with pytest.raises(simple.Empty):  # each message came once
                simple.get(block=False)
        finally:
            simple.close()
