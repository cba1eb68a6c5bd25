"""Paid orders as the tests place them: through the API (a body and its POST), or as the data
orders.services.order_create takes."""

import json

from tests.support.reports import CHAPTERS, SUBJECT


def order_body(payment: str = "pi_1", run: str = "run-42", product: str = "natal-chart", **overrides) -> dict:
    body = {"payment_id": payment, "run_id": run, "product": product,
            "input": {"subject": SUBJECT, "chapters": CHAPTERS[:3]}, "email": "buyer@example.com"}
    body.update(overrides)
    return body


def post_order(api, body):
    return api.http.post("/v1/orders", data=json.dumps(body), content_type="application/json", headers=api.headers())


def order_data(payment: str, run: str = "run-1", product: str = "natal-chart") -> dict:
    return {"payment_id": payment, "run_id": run, "product": product,
            "input": {"subject": {"name": "Ada"}, "chapters": ["sun", "moon"]}, "email": "buyer@example.com"}
