"""The client libraries' tests run against a real stack: `web` and `worker` as the Procfile starts them
(tests/conftest.py's `web_stack` and `web_worker`), the sandbox, and, for webhooks, a `webhooks` worker
delivering to a receiver on loopback. The libraries talk to `web` over TCP, directly or through
tests/support/proxy.py's FlakyProxy."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from jobs.services import client_create
from tests.conftest import WEB_STACK_ENV, WEBHOOK_TEST_ENV, purge_queue
from tests.support.procs import ProcfileProcess
from tests.support.proxy import FlakyProxy
from tests.support.webhook_receiver import WebhookReceiver


@dataclass
class Account:
    """A client of the running stack, as an app holds it: the web's URL, its API key, its webhook secret."""

    url: str
    api_key: str
    webhook_secret: str
    client_id: str


@pytest.fixture
def account(web_stack, web_worker, ledger) -> Account:
    """A fresh client on a running stack whose sandbox ledger is empty (`ledger` resets it)."""
    credentials = client_create(name="client-library")
    return Account(web_stack.url, credentials["api_key"], credentials["webhook_secret"], credentials["client_id"])


@pytest.fixture
def flaky_proxy(web_stack):
    """`flaky_proxy("lose_answer")` or `flaky_proxy("answer_503")`: a started FlakyProxy in front of `web`."""
    made: list[FlakyProxy] = []

    def make(fault: str, **options) -> FlakyProxy:
        proxy = FlakyProxy(int(web_stack.port), fault, **options).start()
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.stop()


@pytest.fixture
def hooks(web_stack, web_worker):
    """A webhook receiver on loopback and a `webhooks` worker on the web stack's broker that delivers to
    it; `hooks.account` is a client whose webhook URL is the receiver, so every job of its ends in a real,
    signed delivery (`hooks.receiver.requests`)."""
    purge_queue(WEB_STACK_ENV["BROKER_URL"], "webhooks")
    worker = ProcfileProcess("webhooks", {**WEB_STACK_ENV, **WEBHOOK_TEST_ENV}).start()
    with WebhookReceiver() as receiver:
        credentials = client_create(name="client-library-hooks", webhook_url=receiver.url)
        receiver.secrets.append(credentials["webhook_secret"])
        yield Hooks(receiver, Account(web_stack.url, credentials["api_key"], credentials["webhook_secret"],
                                      credentials["client_id"]))
    worker.stop()


@dataclass
class Hooks:
    receiver: WebhookReceiver
    account: Account
