"""The Idempotency-Key's hash (a job's) and the payment id's (an order's) are computed from every validated
request field but an explicit exclusion list (jobs.services.HASH_EXCLUDED, orders.services.ORDER_HASH_EXCLUDED):
each field of the request, changed alone under the same key, is a 409. The fields are read from the
serializers, so a field added later is covered here without an edit, or this test fails asking for a
value to change it to. And the hash of today's fields is the one written by hand before, so a stored
job's or order's replay still replays."""

import json

import pytest

from jobs import services
from jobs.api.serializers import JobCreateSerializer, PolicySerializer
from jobs.models import Job
from orders import services as order_services
from orders.models import Order
from orders.views import OrderCreateSerializer
from tests.conftest import media_body

pytestmark = pytest.mark.django_db

# A body that gives every field of POST /v1/jobs (the policy every field of its own).
JOB_BODY = media_body(policy={"attempts_per_model": 3, "fallback_on": ["exhausted"], "window_s": 600,
                              "paid_retries": 1, "deadline_s": 3600, "deadline_at": "2099-01-01T00:00:00Z"},
                      output_key="outputs/hash/one.mp4", webhook_url="http://127.0.0.1:9/hooks", metadata={"n": 1},
                      priority=4)
# Each field's other value: the body with only that field changed. A field of the serializer missing
# here fails test_every_field_has_another_value: add its other value.
JOB_CHANGED = {
    "kind": "report",
    "models": ["sandbox/image-lookup"],
    "input": {"prompt": "a lighthouse at dawn", "render_s": 1},
    "policy": {**JOB_BODY["policy"], "attempts_per_model": 2},
    "output_key": "outputs/hash/two.mp4",
    "webhook_url": "http://127.0.0.1:9/other-hooks",
    "metadata": {"n": 2},
    "priority": 2,
}
POLICY_CHANGED = {"attempts_per_model": 2, "fallback_on": ["unavailable"], "window_s": 60, "paid_retries": 0,
                  "deadline_s": 60, "deadline_at": "2098-01-01T00:00:00Z"}

ORDER_BODY = {"payment_id": "pi_hash", "run_id": "run-1", "product": "natal-chart",
              "input": {"subject": {"name": "Ada Example", "born": "1990-04-12T06:30", "place": "Lyon"},
                        "chapters": ["sun", "moon"]},
              "email": "buyer@example.com"}
ORDER_CHANGED = {
    "payment_id": None,  # the payment id is the key itself: another one is another order, never a 409
    "run_id": "run-2",
    "product": "another-product",
    "input": {**ORDER_BODY["input"], "chapters": ["sun"]},
    "email": "other@example.com",
}


@pytest.fixture(autouse=True)
def _local_webhook_urls(settings):
    settings.WEBHOOK_ALLOW_PRIVATE = True  # the bodies' webhook URLs are local: no DNS


def _job_answer_to_the_same_key_with(api, field: str, key: str, policy_field: str | None = None) -> int:
    first = api.create(JOB_BODY, key=key)
    assert first.status_code == 201, first.content
    if policy_field is None:
        changed = {**JOB_BODY, field: JOB_CHANGED[field]}
    else:
        changed = {**JOB_BODY, "policy": {**JOB_BODY["policy"], policy_field: POLICY_CHANGED[policy_field]}}
    return api.create(changed, key=key).status_code


def _order_answer_to_the_same_payment_with(api, field: str) -> int:
    def post(body):
        return api.http.post("/v1/orders", data=json.dumps(body), content_type="application/json",
                             headers=api.headers())

    body = {**ORDER_BODY, "payment_id": f"pi-{field}"}
    first = post(body)
    assert first.status_code == 201, first.content
    return post({**body, field: ORDER_CHANGED[field]}).status_code


def test_every_field_has_another_value():
    assert set(JOB_CHANGED) == set(JobCreateSerializer().fields) == set(JOB_BODY)
    assert set(POLICY_CHANGED) == set(PolicySerializer().fields) == set(JOB_BODY["policy"])
    assert set(ORDER_CHANGED) == set(OrderCreateSerializer().fields) == set(ORDER_BODY)


@pytest.mark.parametrize("field", sorted(JobCreateSerializer().fields))
def test_a_job_field_changed_alone_under_the_same_key_is_409(api, field):
    assert _job_answer_to_the_same_key_with(api, field, key=f"k-{field}") == 409
    assert Job.objects.count() == 1


@pytest.mark.parametrize("field", sorted(PolicySerializer().fields))
def test_a_policy_field_changed_alone_under_the_same_key_is_409(api, field):
    assert _job_answer_to_the_same_key_with(api, "policy", key=f"k-policy-{field}", policy_field=field) == 409


@pytest.mark.parametrize("field", sorted(set(OrderCreateSerializer().fields) - {"payment_id"}))
def test_an_order_field_changed_alone_under_the_same_payment_id_is_409(api, field):
    assert _order_answer_to_the_same_payment_with(api, field) == 409
    assert Order.objects.count() == 1


def test_a_field_left_out_of_the_hash_would_fail_the_checks_above(api, monkeypatch):
    # Planted: metadata left out of a job's hash, the email out of an order's. The checks above then see
    # a replay where a conflict is due.
    monkeypatch.setattr(services, "HASH_EXCLUDED", services.HASH_EXCLUDED | {"metadata"})
    assert _job_answer_to_the_same_key_with(api, "metadata", key="k-planted") == 202
    monkeypatch.setattr(order_services, "ORDER_HASH_EXCLUDED", frozenset({"email"}))
    assert _order_answer_to_the_same_payment_with(api, "email") == 200


# --- stored hashes still match -----------------------------------------------------------------------------

def _hand_written_job_hash(data: dict) -> str:
    # jobs.services.job_create's canonical form before the hash was derived from the fields, verbatim.
    canonical = {
        "kind": data["kind"],
        "models": data["models"],
        "input": data.get("input_as_sent", data["input"]),
        "policy": data["policy"],
        "output_key": data.get("output_key"),
        "webhook_url": data.get("webhook_url"),
        "metadata": data["metadata"],
    }
    return services.request_hash(canonical)


@pytest.mark.parametrize("body", [
    # Every field a body could have before `priority` existed (a field added since is hashed only when sent).
    {name: value for name, value in JOB_BODY.items() if name != "priority"},
    media_body(),  # no policy, output key, webhook URL or metadata: the defaults and the nulls
    media_body(input={"prompt": "  spaces around, cleaned  ", "render_s": 2.0}),  # cleaned: hashed as sent
    {"kind": "report", "models": ["sandbox/llm"],
     "input": {**ORDER_BODY["input"], "email": "  ada@example.com "}, "metadata": {"a": [1, 2.0]}},
], ids=["every-field", "least", "media-cleaned", "report-cleaned"])
def test_the_hash_of_todays_fields_is_the_hand_written_one(api, body):
    serializer = JobCreateSerializer(data=body)
    assert serializer.is_valid(), serializer.errors
    assert services.job_request_hash(serializer.validated_data) == _hand_written_job_hash(serializer.validated_data)
    replayed = JobCreateSerializer(data=body, replay=True)  # a key whose job exists: only the shape is checked
    assert replayed.is_valid(), replayed.errors
    assert services.job_request_hash(replayed.validated_data) == _hand_written_job_hash(replayed.validated_data)


def test_the_hash_of_an_orders_fields_is_the_hand_written_one():
    # input.email given: the stored and hashed input is the checked one without it (OrderCreateSerializer)
    with_email = {**ORDER_BODY["input"], "email": ORDER_BODY["email"]}
    serializer = OrderCreateSerializer(data={**ORDER_BODY, "input": with_email})
    assert serializer.is_valid(), serializer.errors
    data = serializer.validated_data
    by_hand = services.request_hash({key: data[key] for key in ("payment_id", "run_id", "product", "input", "email")})
    assert "email" not in data["input"]
    assert order_services.order_hash(data) == by_hand
