"""GET /v1/spend (API.md): a client's month of spend, as the budget guard keeps it."""

import re
from datetime import date

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from billing import selectors
from billing.services import month_of
from jobs.errors import InvalidRequest

_MONTH = re.compile(r"^(\d{4})-(\d{2})$")
# What the schema says: YYYY-MM from 2000-01 on (parse_month checks the same).
MONTH_PATTERN = r"^([2-9][0-9]{3})-(0[1-9]|1[0-2])$"
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
    if not match or not (1 <= int(match.group(2)) <= 12) or not (2000 <= int(match.group(1)) <= 9999):
        raise InvalidRequest("Invalid month.", fields={"month": ["YYYY-MM, a month from 2000-01 on."]})
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
