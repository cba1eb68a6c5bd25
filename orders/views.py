"""POST /v1/orders and GET /v1/orders/{id} (docs/api.md, "Orders"): thin views over orders.services."""

import re

from drf_spectacular.utils import OpenApiExample, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.selectors import own_job
from jobs.serializers import ReportInputSerializer, StrictRegexField, StrictSerializer, bounded_json, job_as_dict
from jobs.views import ERROR_SCHEMA, read_json_body
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
        """The input is a report's input without its email (the order's own `email` is the buyer's): an
        `email` or any other unknown field inside it is refused, naming `input.<field>`, never dropped.
        What is stored (and hashed: a body still accepted cleans to itself, chapter keys being taken as
        sent, so a replay hashes as its row did) is the checked input, not the raw dict beside it."""
        if "email" in attrs["input"]:
            raise serializers.ValidationError({"input": {"email": [
                "Unknown field: the buyer's email is the order's own `email`, not part of its input."]}})
        checked = ReportInputSerializer(data={**attrs["input"], "email": attrs["email"]})
        if not checked.is_valid():
            raise serializers.ValidationError({"input": checked.errors})
        attrs["input"] = {key: value for key, value in checked.validated_data.items() if key != "email"}
        return attrs


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
