"""POST /v1/orders and GET /v1/orders/{id} (docs/api.md, "Orders"): thin views over orders.services."""

import re

from drf_spectacular.utils import OpenApiExample, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.api.parsers import read_json_body
from jobs.api.schema import ERROR_SCHEMA
from jobs.api.serializers import StrictRegexField, StrictSerializer, bounded_json, job_as_dict
from jobs.kinds.report.kind import ReportInputSerializer
from jobs.selectors import own_job
from orders import services
from orders.models import Order

# The whole value (\A...\Z; drf-spectacular writes them ^...$ in the schema).
_VISIBLE = re.compile(r"\A[\x21-\x7e]{1,255}\Z")


class OrderCreateSerializer(StrictSerializer):
    """A paid order: the payment provider's id, the run and product it pays for, the report's input and
    the buyer's email. Unknown fields are errors, like every request body of payonce's."""

    payment_id = StrictRegexField(_VISIBLE.pattern, max_length=255)
    run_id = StrictRegexField(_VISIBLE.pattern, max_length=255)
    product = StrictRegexField(r"\A[a-z0-9][a-z0-9._-]{0,99}\Z")
    input = serializers.DictField(validators=[bounded_json])  # bounded as a job's input is
    email = serializers.EmailField(max_length=254)

    def validate(self, attrs):
        """The input is a report's input, checked as a report job's is. Its `email` may be left out (the
        order's own `email` is the buyer's); given, it must be the same address, else it is refused naming
        `input.email` (the report would be mailed to one address and the order name another). Any other
        unknown field inside it is refused too, naming `input.<field>`, never dropped.

        What is stored and hashed is the checked input without its email, as it always was: so an order
        sent with `input.email` and the same order sent without it are one order (the second is a replay,
        200, not a 409), and a body still accepted cleans to itself (chapter keys taken as sent), so a
        replay hashes as its row did."""
        sent = attrs["input"]
        checked = ReportInputSerializer(data={**sent, "email": sent.get("email", attrs["email"])})
        errors = {} if checked.is_valid() else dict(checked.errors)
        if "email" in sent and "email" not in errors and not same_address(sent["email"].strip(), attrs["email"]):
            errors["email"] = ["Must be the order's own `email`, or left out: the report goes to one address."]
        if errors:
            raise serializers.ValidationError({"input": errors})
        attrs["input"] = {key: value for key, value in checked.validated_data.items() if key != "email"}
        return attrs


def same_address(one: str, other: str) -> bool:
    """Whether two valid email addresses are one mailbox, as far as payonce can tell without asking the
    mail server. The domain is compared without case: DNS names are case-insensitive (RFC 5321, 2.4), so
    `buyer@Example.COM` is `buyer@example.com`. The local part is compared exactly: its case belongs to
    the receiving server, which may tell `Buyer` from `buyer`, so payonce does not guess that they are one
    (refused, the buyer sends one spelling). Nothing else is folded (dots, `+tags`): those are one
    provider's rules, not mail's."""
    local, _, domain = one.rpartition("@")
    other_local, _, other_domain = other.rpartition("@")
    return local == other_local and domain.lower() == other_domain.lower()


_ORDER = inline_serializer("Order", {
    "id": serializers.UUIDField(), "status": serializers.ChoiceField(choices=["paid", "duplicate"]),
    "job_id": serializers.UUIDField(allow_null=True), "duplicate_of": serializers.UUIDField(allow_null=True),
    "payment_id": serializers.CharField(), "run_id": serializers.CharField(), "product": serializers.CharField(),
    "created_at": serializers.DateTimeField(),
    "job": inline_serializer("OrderJob", {"status": serializers.CharField(), "cost": serializers.JSONField()},
                             required=False),
})


class OrderListCreateView(APIView):
    @extend_schema(operation_id="orders_create", request=OrderCreateSerializer,
                   examples=[OpenApiExample("order", request_only=True, value={
                       "payment_id": "pi_3PXk2L", "run_id": "run-42", "product": "natal-chart",
                       "input": {"subject": {"name": "Ada Example", "born": "1990-04-12T06:30", "place": "Lyon"},
                                 "chapters": ["sun", "moon"]},
                       "email": "buyer@example.com"})],
                   responses={201: _ORDER, 200: _ORDER, **dict.fromkeys((400, 401, 409, 413, 415, 422), ERROR_SCHEMA)})
    def post(self, request):
        serializer = OrderCreateSerializer(data=read_json_body(request))
        serializer.is_valid(raise_exception=True)
        order, created = services.order_create(client=request.user, data=serializer.validated_data)
        return Response(order_as_dict(order), status=201 if created else 200)


class OrderDetailView(APIView):
    @extend_schema(operation_id="orders_retrieve", responses={200: _ORDER, 401: ERROR_SCHEMA, 404: ERROR_SCHEMA})
    def get(self, request, order_id):
        order = Order.objects.filter(id=order_id, client_id=request.user.id).first()
        if order is None:
            raise NotFound("Not found.")
        return Response(order_as_dict(order))


def order_as_dict(order: Order) -> dict:
    """An order as the API shows it, with its report job's status and cost when it has one."""
    answer = {"id": str(order.id), "status": order.status, "job_id": str(order.job_id) if order.job_id else None,
              "duplicate_of": str(order.duplicate_of_id) if order.duplicate_of_id else None,
              "payment_id": order.payment_id, "run_id": order.run_id, "product": order.product,
              "created_at": order.created_at.isoformat().replace("+00:00", "Z")}
    job = own_job(client_id=order.client_id, job_id=order.job_id) if order.job_id else None
    if job is not None:
        shown = job_as_dict(job)
        answer["job"] = {"status": shown["status"], "cost": shown["cost"]}
    return answer
