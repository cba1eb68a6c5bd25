"""GET /v1/spend (docs/api.md, "Spend: GET /v1/spend"): a client's month of spend, as the budget guard keeps it."""

import re
from datetime import date

from django.utils import timezone
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from billing import selectors
from billing.services import month_of
from jobs.errors import InvalidRequest
from jobs.serializers import ReportInputSerializer, StrictRegexField, StrictSerializer

# ASCII digits only (`\d` would take any script's digits, fullwidth ones included), anchored at both ends
# (`$` also matches before a final newline).
_MONTH = re.compile(r"\A([0-9]{4})-([0-9]{2})\Z", re.ASCII)
# What the schema says: YYYY-MM from 2000-01 to 9999-11; a month's answer names the moment it resets, and
# 9999-12 would reset in the year 10000, which no date holds (parse_month checks the same).
MONTH_PATTERN = r"^(([2-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9]|999[0-8])-(0[1-9]|1[0-2])|9999-(0[1-9]|1[01]))$"
_MONEY = serializers.CharField(help_text="USD as a decimal string with 6 places")

_SPEND = inline_serializer("Spend", {
    "month": serializers.CharField(), "resets_at": serializers.DateTimeField(),
    "cap_usd": _MONEY, "spent_usd": _MONEY, "reserved_usd": _MONEY, "headroom_usd": _MONEY,
    "unpriced_attempts": serializers.IntegerField(),
    "by_model": inline_serializer("SpendByModel", {
        "model": serializers.CharField(), "spent_usd": _MONEY, "attempts": serializers.IntegerField(),
        "unpriced_attempts": serializers.IntegerField(),
    }, many=True),
})
_ERROR = inline_serializer("SpendError", {"error": serializers.DictField()})


def parse_month(raw: str | None) -> date:
    if raw is None or raw == "":
        return month_of(timezone.now())
    match = _MONTH.match(raw)
    if not match or not (1 <= int(match.group(2)) <= 12) or not ((2000, 1) <= (int(match.group(1)), int(match.group(2)))
                                                                  <= (9999, 11)):
        raise InvalidRequest("Invalid month.", fields={"month": ["YYYY-MM, a month from 2000-01 to 9999-11."]})
    return date(int(match.group(1)), int(match.group(2)), 1)


class SpendView(APIView):
    @extend_schema(
        operation_id="spend",
        parameters=[OpenApiParameter("month", {"type": "string", "pattern": MONTH_PATTERN},
                                     description="YYYY-MM (UTC); default: the current month")],
        responses={200: _SPEND, 401: _ERROR, 422: _ERROR},
    )
    def get(self, request):
        return Response(selectors.month_spend(request.user, parse_month(request.query_params.get("month"))))


# --- orders ------------------------------------------------------------------------------------------------

# The whole value (\A...\Z; drf-spectacular writes them ^...$ in the schema).
_VISIBLE = re.compile(r"\A[\x21-\x7e]{1,255}\Z")


class OrderCreateSerializer(StrictSerializer):
    """A paid order: the payment provider's id, the run and product it pays for, the report's input and
    the buyer's email. Unknown fields are errors, like every request body of payonce's."""

    payment_id = StrictRegexField(_VISIBLE.pattern, max_length=255)
    run_id = StrictRegexField(_VISIBLE.pattern, max_length=255)
    product = StrictRegexField(r"\A[a-z0-9][a-z0-9._-]{0,99}\Z")
    input = serializers.DictField()
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
                   responses={201: _ORDER, 200: _ORDER, 400: _ERROR, 401: _ERROR, 409: _ERROR, 413: _ERROR,
                              415: _ERROR, 422: _ERROR})
    def post(self, request):
        from billing.orders import order_as_dict, order_create
        from jobs.views import read_json_body

        serializer = OrderCreateSerializer(data=read_json_body(request))
        serializer.is_valid(raise_exception=True)
        order, created = order_create(client=request.user, data=serializer.validated_data)
        return Response(order_as_dict(order), status=201 if created else 200)


class OrderDetailView(APIView):
    @extend_schema(operation_id="orders_retrieve", responses={200: _ORDER, 401: _ERROR, 404: _ERROR})
    def get(self, request, order_id):
        from rest_framework.exceptions import NotFound

        from billing.models import Order
        from billing.orders import order_as_dict

        order = Order.objects.filter(id=order_id, client_id=request.user.id).first()
        if order is None:
            raise NotFound("Not found.")
        return Response(order_as_dict(order))
