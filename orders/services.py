"""Paid orders (docs/design.md, "Orders"): a payment becomes one report job, and never two.

1. The order is inserted with ON CONFLICT DO NOTHING, naming no arbiter, so either constraint makes it
   do nothing: `order_client_payment` (a replay of the same payment id: the same order, or a 409 when
   its body differs) or `order_one_paid_per_run_product` (a second payment for a run and product that
   already has a paid order, even one racing it).
2. The second case is recorded as a `duplicate` of the paid order (with the email, input and subject it
   gave): no job, and the paid order's buyer (the buyer of record, never the address the duplicate
   names) is emailed the existing link (a task, after commit, once: `mailed_at`, `mailed_to`).
3. A paid order creates its report job in the same transaction, under the idempotency key
   `order_job_key(payment_id)`, so the order and its job exist together or not at all.
"""

import hashlib
import logging
import uuid

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from config.celery import app
from executor import policy
from jobs.api.errors import IdempotencyConflict, InvalidRequest
from jobs.kinds.report import templates
from jobs.kinds.report.kind import report_input
from jobs.kinds.report.reports import report_mail_link
from jobs.services import job_create, request_hash
from orders.models import Order, OrderStatus

logger = logging.getLogger(__name__)

_INSERT_SQL = """
INSERT INTO orders_order (id, client_id, payment_id, run_id, product, input, email, request_hash, status,
                           job_id, duplicate_of_id, mailed_at, created_at)
VALUES (%(id)s, %(client)s, %(payment)s, %(run)s, %(product)s, %(input)s, %(email)s, %(hash)s, %(status)s,
        NULL, %(duplicate_of)s, NULL, now())
ON CONFLICT DO NOTHING
RETURNING id
"""


def order_job_key(payment_id: str) -> str:
    """The idempotency key of a paid order's report job: a namespace of its own, which no client's key
    can reach, made from a hash of the whole payment id.

    A client's Idempotency-Key is 1 to 255 visible ASCII characters (jobs.api.views): never a space, so a key
    with a space in it is never one a client sent (once it was `order:<payment id>`: a client's own
    `order:X` blocked payment X). The hash covers the whole payment id (once cut at 255 characters, two
    long ids differing only at their end were one key: a 409). Jobs made under the old keys keep them:
    an order is replayed by its payment id (order_client_payment) before a job is made, and a re-run
    reuses its job, so no old key is ever looked up again and no row needs rewriting."""
    return "order sha256:" + hashlib.sha256(payment_id.encode("utf-8")).hexdigest()


# Validated fields of POST /v1/orders that are not hashed, each with why: none, every field says what was
# paid for. Every other field is hashed, so a field added to the serializer is part of a payment id's
# hash without an edit here (tests/jobs/test_idempotency_hash.py changes each field in turn and expects
# 409). The five fields of today are the ones the hash was written by hand with, so a stored order's
# hash still matches its replay; a field added later must be absent when a body leaves it out (no
# default), or every older order's replay would answer 409.
ORDER_HASH_EXCLUDED: frozenset[str] = frozenset()


def order_hash(data: dict) -> str:
    """The payment id's hash of a validated POST /v1/orders body: every field but ORDER_HASH_EXCLUDED."""
    return request_hash({key: value for key, value in data.items() if key not in ORDER_HASH_EXCLUDED})


def _insert(client, data: dict, digest: str, status: str, duplicate_of=None) -> uuid.UUID | None:
    params = {"id": uuid.uuid4(), "client": client.id, "payment": data["payment_id"], "run": data["run_id"],
              "product": data["product"], "email": data["email"], "hash": digest, "status": status,
              "input": Order._meta.get_field("input").get_db_prep_save(data["input"], connection),
              "duplicate_of": duplicate_of}
    with connection.cursor() as cursor:
        cursor.execute(_INSERT_SQL, params)
        found = cursor.fetchone()
    return found[0] if found else None


def order_job_input(*, client, data: dict) -> dict:
    """The report's input as the order's job gets it: written from the template the input names; else from
    the client's template named as the order's `product`, where it has one (at its `live` version); else
    from the built-in default. Its version is pinned now (jobs.kinds.report.kind.report_input), on the job
    only: the order keeps its input as sent, so a replay sent after `live` moved is the same order (200).
    A template the subject cannot fill (or one the client does not have) is refused, before anything is
    written: InvalidRequest naming `input.<field>`."""
    report = {**data["input"], "email": data["email"]}
    if "template" not in report and templates.has_template(client_id=client.id, name=data["product"]):
        report["template"] = {"name": data["product"]}
    errors, job_input = report_input(report, client_id=client.id)
    if errors:
        raise InvalidRequest("The request body is not valid.", fields={"input": errors})
    return job_input


def order_create(*, client, data: dict) -> tuple[Order, bool]:
    """A paid order (validated data). Returns (order, created): created False for a replay."""
    digest = order_hash(data)
    with transaction.atomic():
        inserted = _insert(client, data, digest, OrderStatus.PAID)
        if inserted is None:
            replay = Order.objects.filter(client=client, payment_id=data["payment_id"]).first()
            if replay is not None:
                if replay.request_hash != digest:
                    raise IdempotencyConflict("This payment_id was already used with a different order.",
                                              order_id=str(replay.id))
                return replay, False
            paid = Order.objects.get(client=client, run_id=data["run_id"], product=data["product"],
                                     status=OrderStatus.PAID)
            inserted = _insert(client, data, digest, OrderStatus.DUPLICATE, duplicate_of=paid.id)
            if inserted is None:  # the same payment id raced us in the meantime: it is a replay
                return order_create(client=client, data=data)
            transaction.on_commit(lambda: _mail_duplicate_safely(inserted))
            return Order.objects.get(id=inserted), True
        job, _ = job_create(client=client, idempotency_key=order_job_key(data["payment_id"]), data={
            "kind": "report", "models": [settings.ORDER_REPORT_MODEL],
            "input": order_job_input(client=client, data=data),
            "policy": policy.default_policy(),
            "metadata": {"order_id": str(inserted), "payment_id": data["payment_id"], "run_id": data["run_id"],
                         "product": data["product"]},
        })
        Order.objects.filter(id=inserted).update(job=job)
        return Order.objects.get(id=inserted), True


def _mail_duplicate_safely(order_id) -> None:
    try:  # by name: orders.tasks.mail_duplicate, which calls back into this module
        app.send_task("billing.mail_duplicate", args=[str(order_id)])
    except Exception:  # the broker is down: the order is recorded; the buyer can ask again
        logger.exception("could not enqueue the duplicate-order mail for %s", order_id)


def duplicate_mail(*, order_id) -> bool:
    """Email the link of the existing report to the buyer of record: the paid order's email, never the
    address the duplicate names (anyone can pay for a run again and name their own address; the link
    is a bearer token to another person's report). Once: conditional on `mailed_at`, set with
    `mailed_to` after the mail server took it (a crash between sends it again, to the same address).
    A paid order whose personal data was purged has no address left: nothing is sent."""
    order = Order.objects.select_related("duplicate_of").get(id=order_id)
    if order.mailed_at is not None or order.duplicate_of is None or order.duplicate_of.job_id is None:
        return False
    buyer_of_record = order.duplicate_of.email
    if not buyer_of_record:
        return False
    report_mail_link(job_id=order.duplicate_of.job_id, to=buyer_of_record,
                     subject="You already have this report")
    return bool(Order.objects.filter(id=order.id, mailed_at__isnull=True).update(
        mailed_at=timezone.now(), mailed_to=buyer_of_record))


def orders_purge(*, job_ids) -> int:
    """Personal data purged: the orders of these jobs (and their duplicates) keep ids and status only."""
    paid = Order.objects.filter(job_id__in=job_ids)
    return (paid.update(input={"purged": True}, email="")
            + Order.objects.filter(duplicate_of__in=paid).update(input={"purged": True}, email="", mailed_to=""))
