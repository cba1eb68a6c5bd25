"""Paid orders, the bad input of reports and orders, personal data, and real money kept opt-in."""

import json
import re
import time
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from jobs.models import Job, Report
from jobs.kinds.report.reports import report_from_token
from operators.models import OperatorAction
from orders.models import Order
from tests.support.books import assert_books_balance
from tests.support.orders import order_body, post_order
from tests.support.procs import REPO_ROOT
from tests.support.reports import CHAPTERS, SUBJECT, report_body

# Under rollback, reports run on the in-process engine (tests/support/engine.py); the tests against the web
# process commit (web_api).
pytestmark = pytest.mark.django_db


def ended(engine, api, job_id: str) -> dict:
    """Run the job in process until it ends; the API's answer for it."""
    engine.run_job(job_id)
    return api.job(job_id)


def test_a_paid_order_makes_one_report_and_its_replay_is_the_same_order(engine, ledger, api, mailbox, mail_to):
    mail_to(mailbox)
    first = post_order(api, order_body())
    assert first.status_code == 201, first.content
    order = first.json()
    assert order["status"] == "paid" and order["job_id"] and order["duplicate_of"] is None

    replay = post_order(api, order_body())
    assert replay.status_code == 200 and replay.json()["id"] == order["id"] and replay.json()["job_id"] == order["job_id"]
    conflict = post_order(api, order_body(product="another-product"))
    assert conflict.status_code == 409 and conflict.json()["error"]["code"] == "IDEMPOTENCY_CONFLICT"

    job = ended(engine, api, order["job_id"])
    assert job["status"] == "succeeded" and job["metadata"]["order_id"] == order["id"]
    shown = api.get(f"/v1/orders/{order['id']}").json()
    assert shown["job"]["status"] == "succeeded" and shown["job"]["cost"]["total_usd"] == job["cost"]["total_usd"]
    assert Order.objects.count() == 1 and Job.objects.count() == 1
    [mail] = mailbox.wait_for(1)
    assert mail["to"] == ["buyer@example.com"]
    assert len(assert_books_balance(ledger)) == 4  # the synthesis and 3 chapters, once


def test_a_second_payment_for_the_same_run_and_product_is_a_duplicate_that_mails_only_the_buyer_of_record(
        engine, ledger, api, mailbox, mail_to, django_capture_on_commit_callbacks):
    mail_to(mailbox)
    paid = post_order(api, order_body(payment="pi_1")).json()
    ended(engine, api, paid["job_id"])
    [first_mail] = mailbox.wait_for(1)
    assert first_mail["to"] == ["buyer@example.com"]

    # Someone pays for the same run again and names their own address and subject.
    with django_capture_on_commit_callbacks(execute=True):  # the duplicate's mail is sent on commit
        second = post_order(api, order_body(payment="pi_2", email="someone.else@example.com",
                                            input={"subject": {"name": "Someone Else"}, "chapters": CHAPTERS[:3]}))
    engine.run()  # the worker's part: billing.mail_duplicate

    assert second.status_code == 201
    duplicate = second.json()
    assert (duplicate["status"], duplicate["job_id"], duplicate["duplicate_of"]) == ("duplicate", None, paid["id"])
    assert Job.objects.count() == 1  # no second report
    mails = mailbox.wait_for(2)
    assert [m["to"] for m in mails] == [["buyer@example.com"], ["buyer@example.com"]]  # never the other address
    again_link = mails[1]["body"].split("/r/")[1].split()[0]
    assert str(report_from_token(again_link).job_id) == paid["job_id"]  # the existing report's link
    recorded = Order.objects.get(id=duplicate["id"])
    # The duplicate keeps what it gave, and says where the link went.
    assert (recorded.email, recorded.input["subject"]) == ("someone.else@example.com", {"name": "Someone Else"})
    assert recorded.mailed_at is not None and recorded.mailed_to == "buyer@example.com"
    time.sleep(1.0)  # a mail sent late to the other address would have arrived by now
    assert [m["to"] for m in mailbox.messages()] == [["buyer@example.com"], ["buyer@example.com"]]
    assert len(assert_books_balance(ledger)) == 4


def test_the_admin_shows_a_duplicates_own_email_where_the_link_went_and_what_it_duplicates(admin_client, api):
    paid = post_order(api, order_body(payment="pi_1")).json()
    duplicate = post_order(api, order_body(payment="pi_2", email="someone.else@example.com")).json()
    Order.objects.filter(id=duplicate["id"]).update(mailed_at=timezone.now(), mailed_to="buyer@example.com")

    page = admin_client.get(f"/admin/orders/order/{duplicate['id']}/change/").content.decode()

    assert "someone.else@example.com" in page  # the email the duplicate gave
    assert "link mailed to" in page.lower() and "buyer@example.com" in page  # where the existing link went
    assert f"/admin/orders/order/{paid['id']}/change/" in page and "order pi_1 (paid)" in page


def test_another_clients_order_is_404(api, make_api):
    created = post_order(api, order_body()).json()
    other = make_api("other")
    assert other.get(f"/v1/orders/{created['id']}").status_code == 404
    assert api.get(f"/v1/orders/{created['id']}").status_code == 200


BAD_REPORTS = {
    "no chapters": {"chapters": []},
    "200 chapters": {"chapters": [f"c{n}" for n in range(200)]},
    "a chapter twice": {"chapters": ["sun", "sun"]},
    "a key that is not a slug": {"chapters": ["Sun Sign"]},
    "no email": {"email": None},
    "an invalid email": {"email": "not-an-email"},
    "an empty subject": {"subject": {}},
}


@pytest.mark.parametrize("change", list(BAD_REPORTS.values()), ids=list(BAD_REPORTS))
def test_a_bad_report_is_422_with_field_errors_and_writes_nothing(api, ledger, change):
    body = report_body()
    body["input"] = {**body["input"], **change}
    if body["input"].get("email") is None:
        body["input"].pop("email")
    response = api.create(body, key="bad")
    assert response.status_code == 422, response.content
    assert "input" in response.json()["error"]["fields"]
    assert Job.objects.count() == 0 and ledger.ledger()["charges"] == []


@pytest.mark.parametrize("missing", ["payment_id", "run_id", "product", "input", "email"])
def test_an_order_missing_a_field_is_422_and_writes_nothing(api, ledger, missing):
    body = order_body()
    body.pop(missing)
    response = post_order(api, body)
    assert response.status_code == 422 and missing in response.json()["error"]["fields"]
    assert Order.objects.count() == 0 and Job.objects.count() == 0 and ledger.ledger()["charges"] == []


@pytest.mark.parametrize("field", ["payment_id", "run_id", "product"])
@pytest.mark.parametrize("value", [0, 42, True])
def test_an_order_whose_id_is_not_a_string_is_422_never_turned_into_one(api, ledger, field, value):
    # Found by schemathesis (tests/e2e/test_fuzz_api.py, --checks all): {"payment_id": 0} was the payment "0".
    response = post_order(api, order_body(**{field: value}))
    assert response.status_code == 422, response.content
    assert field in response.json()["error"]["fields"]
    assert Order.objects.count() == 0 and Job.objects.count() == 0


def nested(levels: int) -> dict:
    """An object `levels` deep: {"a": {"a": ... {"a": 1}}}."""
    value: object = 1
    for _ in range(levels):
        value = {"a": value}
    return value


@pytest.mark.parametrize("levels", [31, 32, 200])
def test_an_orders_input_is_bounded_in_depth_as_a_jobs_is(api, ledger, levels):
    # The subject is one level inside the input: 31 levels make an input 32 deep, the most a job's takes.
    subject = {"name": "Ada", "deep": nested(levels - 1)}

    job = api.create(report_body(CHAPTERS[:1], input={"subject": subject, "chapters": ["sun"],
                                                       "email": "buyer@example.com"}), key=f"deep-{levels}")
    order = post_order(api, order_body(input={"subject": subject, "chapters": ["sun"]}))

    if levels <= 31:
        assert (job.status_code, order.status_code) == (201, 201), order.content
        return
    assert (job.status_code, order.status_code) == (422, 422), order.content
    assert order.json()["error"]["fields"] == job.json()["error"]["fields"] == {
        "input": ["Nested deeper than 32 levels."]}
    assert Order.objects.count() == 0 and Job.objects.count() == 0


def test_an_order_with_a_bad_report_input_is_422(api, ledger):
    response = post_order(api, order_body(input={"subject": SUBJECT, "chapters": ["Not A Slug"]}))
    assert response.status_code == 422 and "input" in response.json()["error"]["fields"]
    assert Order.objects.count() == 0


# --- personal data ---------------------------------------------------------------------------------------


def test_purging_personal_data_keeps_the_sealed_report_readable(engine, ledger, api):
    job_id = api.create(report_body(CHAPTERS[:2]), key="purge").json()["id"]
    assert ended(engine, api, job_id)["status"] == "succeeded"
    before = api.get(f"/v1/jobs/{job_id}/report").content
    figures = Report.objects.get(job_id=job_id).figures
    Report.objects.filter(job_id=job_id).update(created_at=timezone.now() - timedelta(days=91))

    call_command("purge_personal_data", "--older-than", "90d")

    report = Report.objects.get(job_id=job_id)
    assert report.subject is None and report.email == "" and report.purged_at is not None
    assert report.figures == figures
    job = api.job(job_id)
    assert "subject" not in job["input"] and "email" not in job["input"]
    assert "Ada Example" not in json.dumps(job)  # nor in what the attempts sent
    from executor.models import Attempt
    from webhooks.models import Delivery

    assert not any("Ada Example" in json.dumps(a.request) for a in Attempt.objects.filter(job_id=job_id))
    assert not any("Ada Example" in d.envelope for d in Delivery.objects.filter(job_id=job_id))
    assert api.get(f"/v1/jobs/{job_id}/report").content == before  # still readable, the same report


def test_a_report_younger_than_the_retention_is_kept(engine, ledger, api):
    job_id = api.create(report_body(CHAPTERS[:1]), key="young").json()["id"]
    ended(engine, api, job_id)
    call_command("purge_personal_data", "--older-than", "90d")
    assert Report.objects.get(job_id=job_id).subject == SUBJECT


# --- real money is opt-in -------------------------------------------------------------------------------


def test_smoke_provider_refuses_without_the_flag_with_real_providers_off_or_without_a_key(db, settings):
    with pytest.raises(CommandError, match="--i-will-spend-money"):
        call_command("smoke_provider", "anthropic", "claude-haiku-4-5")
    settings.REAL_PROVIDERS = False
    with pytest.raises(CommandError, match="REAL_PROVIDERS is off"):
        call_command("smoke_provider", "anthropic", "claude-haiku-4-5", "--i-will-spend-money")
    settings.REAL_PROVIDERS, settings.ANTHROPIC_API_KEY = True, ""
    with pytest.raises(CommandError, match="ANTHROPIC_API_KEY"):
        call_command("smoke_provider", "anthropic", "claude-haiku-4-5", "--i-will-spend-money")


def test_ci_cannot_construct_a_real_adapter(db, settings, monkeypatch):
    """With REAL_PROVIDERS off (CI), every real adapter answers from recorded fixtures: its calls never
    reach a socket of the outside world."""
    import socket

    from executor.providers import provider_for, real

    settings.REAL_PROVIDERS = False
    opened = []
    original = socket.create_connection

    def watch(address, *args, **kwargs):
        opened.append(address)
        return original(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", watch)
    for name in ("anthropic", "openai"):
        adapter = provider_for(name)
        assert real.replaying(adapter.replay)
        answer = adapter.complete("claude-sonnet-4-5" if name == "anthropic" else "gpt-4.1-mini", system="s",
                                  messages=[{"role": "user", "content": "hi"}], max_tokens=10,
                                  upstream_key="k", metadata={})
        assert answer.text
    assert [host for host, _ in opened if host not in ("127.0.0.1", "localhost", "::1")] == []


# --- the admin ---------------------------------------------------------------------------------------------


def test_the_admin_shows_cost_per_order_and_re_runs_only_after_a_confirmation(admin_client, api, ledger):
    from jobs.models import JobStatus

    order = post_order(api, order_body()).json()
    Job.objects.filter(id=order["job_id"]).update(status=JobStatus.FAILED)
    listing = admin_client.get("/admin/orders/order/").content.decode()
    assert "pi_1" in listing and "natal-chart" in listing

    chosen = {"action": "rerun", "_selected_action": [order["id"]]}
    asked = admin_client.post("/admin/orders/order/", chosen)
    assert asked.status_code == 200 and "pays again" in asked.content.decode()
    assert Job.objects.get(id=order["job_id"]).run == 1  # nothing happened yet
    refused = admin_client.post("/admin/orders/order/", {**chosen, "confirm": "yes", "reason": ""})
    assert refused.status_code == 200 and "a reason is required" in refused.content.decode()
    assert Job.objects.get(id=order["job_id"]).run == 1 and not OperatorAction.objects.exists()

    done = admin_client.post("/admin/orders/order/", {**chosen, "confirm": "yes", "reason": "the buyer asked"})
    assert done.status_code == 302
    job = Job.objects.get(id=order["job_id"])
    assert (job.run, job.status) == (2, "queued")
    [entry] = OperatorAction.objects.all()
    assert (entry.action, entry.acted, entry.reason) == ("rerun", 1, "the buyer asked")


# --- an order's job key, and what an order's input may hold (through the real web process) ------------


@pytest.fixture
def web_api(transactional_db, web_stack):  # the web process reads the client this process writes
    from jobs.services import client_create
    from tests.support.http_api import HttpApi

    return HttpApi(web_stack.url, client_create(name="shop"))


def post_web_order(web_api, body):
    return web_api.http.post(f"{web_api.base_url}/v1/orders", data=json.dumps(body), timeout=10,
                             headers=web_api.headers(**{"Content-Type": "application/json"}))


@pytest.mark.e2e
def test_two_long_payment_ids_that_differ_only_at_their_end_are_two_paid_orders(web_api):
    common = "pi_" + "x" * 249  # with "order:" in front, both were cut to one 255-character job key

    first = post_web_order(web_api, order_body(payment=common + "001", run="run-a"))
    second = post_web_order(web_api, order_body(payment=common + "002", run="run-b"))

    assert (first.status_code, second.status_code) == (201, 201), second.text
    assert first.json()["status"] == second.json()["status"] == "paid"
    assert first.json()["job_id"] != second.json()["job_id"]
    assert Job.objects.count() == 2


@pytest.mark.e2e
def test_a_clients_own_idempotency_key_cannot_block_a_payment(web_api, ledger):
    squatted = web_api.create({"kind": "media", "models": ["sandbox/video-keyed"], "input": {"prompt": "x"}},
                              key="order:pi_squatted")
    assert squatted.status_code == 201, squatted.text

    order = post_web_order(web_api, order_body(payment="pi_squatted"))

    assert order.status_code == 201, order.text
    assert order.json()["status"] == "paid" and order.json()["job_id"] != squatted.json()["id"]
    # And no client can send the order's own key: it has a space, which no Idempotency-Key may.
    order_key = Job.objects.get(id=order.json()["job_id"]).idempotency_key
    assert " " in order_key and web_api.create({}, key=order_key).status_code == 400


@pytest.mark.e2e
def test_an_unknown_field_inside_an_orders_input_is_422_naming_it(web_api):
    body = order_body(input={"subject": SUBJECT, "chapters": CHAPTERS[:3], "notes": "buyer.two@example.com"})

    answer = post_web_order(web_api, body)

    assert answer.status_code == 422, answer.text
    assert list(answer.json()["error"]["fields"]["input"]) == ["notes"]
    assert Order.objects.count() == 0 and Job.objects.count() == 0


# --- the buyer's email, in the order and in its input ----------------------------------------------------


@pytest.mark.parametrize("given", ["buyer.two@example.com", "Buyer@example.com", "buyer@example.org",
                                   "not-an-email", "", 5, None])
def test_an_input_email_that_is_not_the_orders_own_is_422_naming_input_email(api, ledger, given):
    # The local part's case is the mail server's to judge: payonce does not take Buyer@ for buyer@.
    body = order_body(input={"subject": SUBJECT, "chapters": CHAPTERS[:3], "email": given})

    answer = post_order(api, body)

    assert answer.status_code == 422, answer.content
    fields = answer.json()["error"]["fields"]
    assert list(fields) == ["input"] and list(fields["input"]) == ["email"], fields
    assert Order.objects.count() == 0 and Job.objects.count() == 0


def test_an_order_naming_its_email_in_its_input_too_is_one_order_with_or_without_it(api, ledger):
    chapters = {"subject": SUBJECT, "chapters": CHAPTERS[:3]}

    first = post_order(api, order_body(input={**chapters, "email": "buyer@example.com"}))
    without = post_order(api, order_body(input=chapters))
    domain_in_capitals = post_order(api, order_body(input={**chapters, "email": " buyer@EXAMPLE.com "}))

    assert first.status_code == 201, first.content
    # The same order: its input is stored, and hashed, as checked and without the email.
    assert (without.status_code, domain_in_capitals.status_code) == (200, 200), domain_in_capitals.content
    assert without.json()["id"] == domain_in_capitals.json()["id"] == first.json()["id"]
    order = Order.objects.get()
    assert order.input == chapters and order.email == "buyer@example.com"
    assert Job.objects.get(id=order.job_id).input == {**chapters, "email": "buyer@example.com"}
    # Another body under the same payment is still a conflict.
    other = post_order(api, order_body(input={**chapters, "chapters": CHAPTERS[:2], "email": "buyer@example.com"}))
    assert other.status_code == 409 and other.json()["error"]["code"] == "IDEMPOTENCY_CONFLICT"


def documented_order_bodies() -> dict[str, dict]:
    """The order bodies the documents show: docs/api.md's (under "Orders") and the README's."""
    api_md = (REPO_ROOT / "docs" / "api.md").read_text().split("\n## Orders\n", 1)[1]
    readme = (REPO_ROOT / "README.md").read_text()
    heredoc = re.search(r"ORDER_BODY=\$\(cat <<EOF\n(.*?)\nEOF\n", readme, re.S).group(1)
    return {"docs/api.md": json.loads(re.search(r"```json\n(.*?)```", api_md, re.S).group(1)),
            "README.md": json.loads(heredoc.replace("$PAYMENT_ID", "pi_readme"))}


@pytest.mark.parametrize("document", ["docs/api.md", "README.md"])
def test_the_documented_order_is_201_with_its_email_in_its_input_and_the_same_order_without(api, ledger, document):
    documented = documented_order_bodies()[document]
    with_email = {**documented, "input": {**documented["input"], "email": documented["email"]}}

    first = post_order(api, with_email)
    as_documented = post_order(api, documented)

    assert first.status_code == 201, first.content
    assert first.json()["status"] == "paid" and first.json()["job_id"]
    assert as_documented.status_code == 200 and as_documented.json()["id"] == first.json()["id"]
