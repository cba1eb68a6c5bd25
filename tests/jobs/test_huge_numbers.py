"""A number too large for a double, wherever a client can put one (a job's body, an order's, a list's
query), is a 4xx with the JSON error body: never a 500, and nothing written.

Python reads a 310-digit integer exactly, and math.isfinite() of it raises OverflowError (a declared
parameter was a 500 that way); JSON readers elsewhere (a JavaScript client, a webhook receiver, a
provider) make it infinity. Past 4,300 digits Python refuses to read it at all, and 1e400 is refused by
the body's parser. Every request below is answered through the real view and its error handler."""

import base64
import json

import pytest
from django.test import Client as DjangoClient

from jobs.models import Job
from orders.models import Order

REPLICATE = "replicate/black-forest-labs/flux-schnell"  # passes its parameters through unchecked
HUGE = {
    "310 digits": "1" + "0" * 309,
    "-310 digits": "-1" + "0" * 309,
    "4400 digits": "9" * 4400,  # past Python's int-string limit
    "1e400": "1e400",
    "-1e400": "-1e400",
}
JOB = {"kind": "media", "models": ["sandbox/video-keyed"], "input": {"prompt": "x"}}
REPORT = {"kind": "report", "models": ["sandbox/llm"],
          "input": {"subject": {"name": "Ada"}, "chapters": ["sun"], "email": "buyer@example.com"}}
ORDER = {"payment_id": "pi_1", "run_id": "run-1", "product": "natal-chart",
         "input": {"subject": {"name": "Ada"}, "chapters": ["sun"]}, "email": "buyer@example.com"}
N = "__N__"  # where the number goes, as written in the body (json.dumps cannot write 1e400)


def with_number(body: dict, *path, list_item: bool = False) -> str:
    """The body's JSON with N at `path` (inside a list there when `list_item`)."""
    body = json.loads(json.dumps(body))
    place = body
    for key in path[:-1]:
        place = place.setdefault(key, {})
    place[path[-1]] = [N] if list_item else N
    return json.dumps(body)


# (the request's path, its body with N where the number goes): every numeric field a job or an order has,
# every field that holds the client's own JSON, and strings and lists that a number can be sent in place of.
BODIES = {
    "job input.render_s (a declared number)": ("/v1/jobs", with_number(JOB, "input", "render_s")),
    "job input.expected_s (a number with no maximum)": ("/v1/jobs", with_number(JOB, "input", "expected_s")),
    "job input.size_bytes (a declared integer)": ("/v1/jobs", with_number(JOB, "input", "size_bytes")),
    "job input.seed (passed through)": ("/v1/jobs", with_number({**JOB, "models": [REPLICATE]}, "input", "seed")),
    "job input.prompt": ("/v1/jobs", with_number(JOB, "input", "prompt")),
    "job policy.attempts_per_model": ("/v1/jobs", with_number(JOB, "policy", "attempts_per_model")),
    "job policy.paid_retries": ("/v1/jobs", with_number(JOB, "policy", "paid_retries")),
    "job policy.window_s": ("/v1/jobs", with_number(JOB, "policy", "window_s")),
    "job policy.fallback_on": ("/v1/jobs", with_number(JOB, "policy", "fallback_on", list_item=True)),
    "job metadata": ("/v1/jobs", with_number(JOB, "metadata", "n")),
    "job metadata, in a list": ("/v1/jobs", with_number(JOB, "metadata", "ids", list_item=True)),
    "job kind": ("/v1/jobs", with_number(JOB, "kind")),
    "job models": ("/v1/jobs", with_number(JOB, "models", list_item=True)),
    "job output_key": ("/v1/jobs", with_number(JOB, "output_key")),
    "report input.subject": ("/v1/jobs", with_number(REPORT, "input", "subject", "born")),
    "report input.chapters": ("/v1/jobs", with_number(REPORT, "input", "chapters", list_item=True)),
    "report input.email": ("/v1/jobs", with_number(REPORT, "input", "email")),
    "order payment_id": ("/v1/orders", with_number(ORDER, "payment_id")),
    "order product": ("/v1/orders", with_number(ORDER, "product")),
    "order email": ("/v1/orders", with_number(ORDER, "email")),
    "order input.subject": ("/v1/orders", with_number(ORDER, "input", "subject", "born")),
    "order input.chapters": ("/v1/orders", with_number(ORDER, "input", "chapters", list_item=True)),
    "order input.email": ("/v1/orders", with_number(ORDER, "input", "email")),
}


def assert_error_answer(answer) -> dict:
    assert 400 <= answer.status_code < 500, (answer.status_code, answer.content[:300])
    assert answer["Content-Type"] == "application/json"
    error = answer.json()["error"]
    assert error["code"] and error["message"]
    return error


@pytest.mark.parametrize("number", list(HUGE.values()), ids=list(HUGE))
@pytest.mark.parametrize("path, body", list(BODIES.values()), ids=list(BODIES))
def test_a_huge_number_anywhere_in_a_body_is_a_4xx_with_the_error_body_and_writes_nothing(api, path, body, number):
    http = DjangoClient(raise_request_exception=False)  # a 500 is an answer to assert on

    answer = http.post(path, data=body.replace(json.dumps(N), number), content_type="application/json",
                       headers=api.headers(**{"Idempotency-Key": "huge"}))

    assert_error_answer(answer)
    assert Job.objects.count() == 0 and Order.objects.count() == 0


def _cursor(number: str) -> str:
    raw = '{"t": ' + number + ', "i": ' + number + ', "d": "next"}'
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


@pytest.mark.parametrize("number", list(HUGE.values()), ids=list(HUGE))
@pytest.mark.parametrize("query", ["limit", "status", "cursor", "month"])
def test_a_huge_number_in_a_query_is_a_4xx_with_the_error_body(api, query, number):
    http = DjangoClient(raise_request_exception=False)
    value = _cursor(number) if query == "cursor" else number
    path = "/v1/spend" if query == "month" else "/v1/jobs"

    answer = http.get(path, {query: value}, headers=api.headers())

    assert_error_answer(answer)


# The 310-digit number, refused at its place: a 422 naming the field it was sent in.
NAMED = {
    "job input.render_s (a declared number)": {"input": {"render_s"}},
    "job input.expected_s (a number with no maximum)": {"input": {"expected_s"}},
    "job input.size_bytes (a declared integer)": {"input": {"size_bytes"}},
    "job input.seed (passed through)": {"input": {"seed"}},
    "job metadata": {"metadata": {"n"}},
    "job metadata, in a list": {"metadata": {"ids"}},
    "report input.subject": {"input": {"subject"}},
    "order input.subject": {"input": {"subject"}},
}


@pytest.mark.parametrize("case", list(NAMED))
def test_a_310_digit_number_is_422_naming_where_it_was_sent(api, case):
    path, body = BODIES[case]

    answer = api.http.post(path, data=body.replace(json.dumps(N), HUGE["310 digits"]),
                           content_type="application/json", headers=api.headers(**{"Idempotency-Key": "huge"}))

    assert answer.status_code == 422, answer.content[:300]
    fields = answer.json()["error"]["fields"]
    [(top, named)] = NAMED[case].items()
    assert list(fields) == [top] and set(fields[top]) == named, fields
    assert Job.objects.count() == 0 and Order.objects.count() == 0


def test_the_largest_numbers_a_double_holds_are_still_taken(api):
    largest = {"int": 10 ** 308, "float": 1.7976931348623157e308, "negative": -(10 ** 308)}
    answer = api.create({**JOB, "input": {"prompt": "x", "expected_s": 10 ** 308}, "metadata": largest}, key="big")

    assert answer.status_code == 201, answer.content[:300]
    # jsonb keeps a number as numeric: 1.79e308 comes back written out in digits, the same double.
    stored = Job.objects.get(id=answer.json()["id"]).metadata
    assert {key: float(value) for key, value in stored.items()} == {key: float(v) for key, v in largest.items()}
