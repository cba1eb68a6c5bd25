"""The database away (PostgreSQL restarting or unreachable) is `503 DATABASE_UNAVAILABLE` with
`Retry-After` on every endpoint, DRF's views and the plain Django ones alike (jobs.api.errors): a passing
outage the caller waits out and sends again, never a 500.

The outage is PostgreSQL's own words at the cursor: every statement of every connection, in every thread,
fails as it does while the server restarts (Django's cursor raises OperationalError), while the server
itself stays up for the test's setup and its checks afterwards."""

import contextlib
import uuid

import pytest
from django.db import OperationalError, connection
from django.db.backends.utils import CursorWrapper
from django.test import Client as DjangoClient

from jobs.api import events
from jobs.kinds.report.reports import link_token
from jobs.models import Job
from tests.conftest import media_body
from tests.support.callbacks import signed

pytestmark = pytest.mark.django_db(transaction=True)  # no test transaction left open across the outage


@contextlib.contextmanager
def database_down(monkeypatch):
    def refuse(self, *args, **kwargs):
        raise OperationalError("terminating connection due to administrator command")

    with monkeypatch.context() as patched:
        patched.setattr(CursorWrapper, "execute", refuse)
        patched.setattr(CursorWrapper, "executemany", refuse)
        yield


def _callback(http, api):
    body, headers = signed({"id": f"gen_{uuid.uuid4().hex}", "status": "succeeded"})
    return http.post("/v1/callbacks/sandbox", data=body, content_type="application/json",
                     headers={k: v for k, v in headers.items() if k != "Content-Type"})


# Each way in: the three plain Django views, and a DRF view beside them (the same answer).
REQUESTS = {
    "a provider callback": _callback,
    "the report page": lambda http, api: http.get(f"/r/{link_token(uuid.uuid4())}"),
    "the event stream": lambda http, api: http.get(f"/v1/jobs/{uuid.uuid4()}/events", headers=api.headers()),
    "a job (DRF)": lambda http, api: http.get(f"/v1/jobs/{uuid.uuid4()}", headers=api.headers()),
}


@pytest.fixture
def stream_threads_close_their_connections(monkeypatch):
    """The event stream reads the database in executor threads (sync_to_async, thread_sensitive=False). In
    the web process those threads live as long as it does, and keep their connections; here each request
    runs on an event loop of its own whose threads end with it, and a connection left open in one would
    outlive the test (and keep the test database from being dropped). Each read closes its thread's."""
    for name in ("_authenticate", "_read"):
        original = getattr(events, name)

        def closing(*args, _original=original, **kwargs):
            try:
                return _original(*args, **kwargs)
            finally:
                connection.close()

        monkeypatch.setattr(events, name, closing)


@pytest.mark.parametrize("send", list(REQUESTS.values()), ids=list(REQUESTS))
def test_a_request_while_the_database_is_away_is_503_with_retry_after_never_500(api, monkeypatch, send,
                                                                               stream_threads_close_their_connections):
    http = DjangoClient(raise_request_exception=False)  # a 500 is an answer to assert on, not an error here

    with database_down(monkeypatch):
        answer = send(http, api)

    assert answer.status_code == 503, answer.content
    assert answer["Content-Type"] == "application/json"
    assert answer.json() == {"error": {"code": "DATABASE_UNAVAILABLE",
                                       "message": "The database is unavailable; try again shortly."}}
    assert answer["Retry-After"] == "1"
    # The database back, the same request is answered as it would have been (here: nothing of ours).
    assert send(http, api).status_code == 404


def test_a_job_created_while_the_database_is_away_is_503_and_written_once_sent_again(api, monkeypatch):
    with database_down(monkeypatch):
        refused = api.create(media_body(), key="outage")

    assert (refused.status_code, refused.json()["error"]["code"]) == (503, "DATABASE_UNAVAILABLE")
    assert Job.objects.count() == 0
    again = api.create(media_body(), key="outage")
    assert again.status_code == 201 and Job.objects.count() == 1
