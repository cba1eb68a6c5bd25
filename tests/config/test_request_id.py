"""X-Request-Id (config.requestid): every answer of the web process carries one, the caller's own when it
is valid and a new one otherwise, and every line logged while serving the request names it, on Django's
thread too. First the ASGI application of config.asgi, whole, in this process (its probes, body limit,
static files and Django); then the `web` process as the Procfile starts it, behind uvicorn."""

import asyncio
import json
import logging
import re
import uuid
from contextlib import contextmanager

import pytest
import requests

from config import logs, requestid
from tests.support.asgi import serve

NEW_ID = re.compile(r"[0-9a-f]{32}")


def request_ids(headers: list[tuple[str, str]]) -> list[str]:
    return [value for name, value in headers if name == "x-request-id"]


@contextmanager
def captured():
    """The JSON lines logged while the block runs, each with the thread that logged it."""
    lines: list[tuple[str, dict]] = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append((record.threadName, json.loads(self.format(record))))

    handler = Keep()
    handler.addFilter(logs.ContextFilter())
    handler.addFilter(logs.RedactFilter())
    handler.setFormatter(logs.JsonFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield lines
    finally:
        root.removeHandler(handler)


# --- the ASGI application, in this process -------------------------------------------------------------


def test_a_django_answer_a_probe_and_a_refused_body_each_carry_a_new_id():
    answers = {
        "django": serve("GET", "/no-such-path"),  # Django's JSON 404
        "probe": serve("GET", "/healthz"),  # answered before Django
        "refused": serve("POST", "/v1/jobs", [(b"content-type", b"application/json"),
                                              (b"content-length", str(10 << 20).encode())]),  # before Django too
    }
    assert {name: status for name, (status, _) in answers.items()} == {"django": 404, "probe": 200, "refused": 413}
    ids = {name: request_ids(headers) for name, (_, headers) in answers.items()}
    assert all(len(found) == 1 and NEW_ID.fullmatch(found[0]) for found in ids.values()), ids
    assert len({found[0] for found in ids.values()}) == 3  # one id per request


def test_a_callers_valid_id_is_echoed():
    for given in ("req-42", "0af7651916cd43dd8448eb211c80319c", "a/b:c.d_e+f=g-h", "x" * 128):
        status, headers = serve("GET", "/healthz", [(b"x-request-id", given.encode())])
        assert status == 200 and request_ids(headers) == [given], given


@pytest.mark.parametrize("given", [
    b"x" * 129,  # too long
    b"abc\r\nSet-Cookie: session=stolen",  # a header injected
    b"abc\nX-Evil: 1",
    "caf\u00e9".encode(),  # not ASCII (UTF-8)
    b"caf\xe9",  # not ASCII (Latin-1)
    b"two words",
    b"",
    b"<script>",
], ids=["too-long", "crlf", "lf", "utf8", "latin1", "space", "empty", "markup"])
def test_an_invalid_id_is_replaced_by_a_new_one_never_echoed(given):
    status, headers = serve("GET", "/no-such-path", [(b"x-request-id", given)])
    assert status == 404
    found = request_ids(headers)
    assert len(found) == 1 and NEW_ID.fullmatch(found[0]), found
    assert all(name not in ("set-cookie", "x-evil") for name, _ in headers)
    assert all(given.decode("latin-1") not in value for _, value in headers if given)


def test_only_the_first_of_two_ids_is_read():
    _, headers = serve("GET", "/healthz", [(b"x-request-id", b"first"), (b"x-request-id", b"second")])
    assert request_ids(headers) == ["first"]
    _, headers = serve("GET", "/healthz", [(b"x-request-id", b"bad value"), (b"x-request-id", b"second")])
    assert NEW_ID.fullmatch(request_ids(headers)[0])


def test_a_line_logged_on_djangos_thread_while_serving_carries_the_request_id():
    with captured() as lines:
        _, given = serve("GET", "/no-such-path", [(b"x-request-id", b"trace-me-1")])
        _, generated = serve("GET", "/no-such-path/either")
    not_found = [(thread, line) for thread, line in lines if line["event"].startswith("Not Found: /no-such-path")]
    # Django logs the 404 on the request's web thread, not the event loop's: the context crossed over.
    assert [(thread.startswith("web-sync-"), line["request_id"]) for thread, line in not_found] == [
        (True, "trace-me-1"), (True, request_ids(generated)[0])]
    assert request_ids(given) == ["trace-me-1"]
    assert list(not_found[0][1])[:4] == ["ts", "level", "logger", "event"]
    assert requestid.current() is None  # outside a request, none


def test_current_names_the_request_being_served():
    seen = []

    async def app(scope, receive, send):
        seen.append(requestid.current())
        await asyncio.to_thread(lambda: seen.append(requestid.current()))  # a thread of the request's too
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    layer = requestid.RequestIdMiddleware(app)
    sent = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/", "headers": [(b"x-request-id", b"mine")]}
    asyncio.run(layer(scope, None, send))
    asyncio.run(layer({**scope, "headers": []}, None, send))
    assert seen[:2] == ["mine", "mine"]
    assert seen[2] == seen[3] and NEW_ID.fullmatch(seen[2])
    assert [dict(message["headers"])[b"x-request-id"].decode() for message in sent
            if message["type"] == "http.response.start"] == ["mine", seen[2]]
    assert requestid.current() is None


# --- the web process -------------------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_every_answer_of_the_web_process_carries_an_id_and_its_log_lines_name_it(web_stack):
    offset = len(web_stack.output())
    mine = f"e2e-{uuid.uuid4()}"
    answers = {
        "probe": requests.get(f"{web_stack.url}/healthz", timeout=10),
        "django": requests.get(f"{web_stack.url}/v1/whoami", timeout=10),  # 401: no key
        "refused": requests.post(f"{web_stack.url}/v1/jobs", data=b"x" * (1 << 20), timeout=10,
                                 headers={"Content-Type": "application/json"}),
        "echoed": requests.get(f"{web_stack.url}/v1/whoami", headers={"X-Request-Id": mine}, timeout=10),
        "replaced": requests.get(f"{web_stack.url}/v1/whoami", headers={"X-Request-Id": "y" * 129}, timeout=10),
    }
    assert {name: answer.status_code for name, answer in answers.items()} == {
        "probe": 200, "django": 401, "refused": 413, "echoed": 401, "replaced": 401}
    for name in ("probe", "django", "refused", "replaced"):
        assert NEW_ID.fullmatch(answers[name].headers["X-Request-Id"]), name
    assert answers["echoed"].headers["X-Request-Id"] == mine

    def lines_of(request_id: str) -> list[dict]:
        found = []
        for line in web_stack.output(offset).splitlines():
            if line.startswith("{"):
                entry = json.loads(line)
                if entry.get("request_id") == request_id:
                    found.append(entry)
        return found

    # Django's own line for the 401 (django.request, on a web thread) names each request's id.
    assert [line["event"] for line in lines_of(mine)] == ["Unauthorized: /v1/whoami"]
    assert [line["event"] for line in lines_of(answers["replaced"].headers["X-Request-Id"])] == [
        "Unauthorized: /v1/whoami"]
    assert "y" * 129 not in web_stack.output(offset)
