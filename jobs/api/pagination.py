"""GET /v1/jobs pages: newest first, keyset-paginated by (created_at, id), bounded in rows and in bytes.

A cursor is base64url of `{"t": created_at, "i": job id, "d": "next" | "prev"}`: where the page before
ended and which way to go. Anything else in `cursor` (a crafted position, a NUL, SQL) is a 422 naming the
field, never a query. A page holds at most `limit` jobs (1 to 200, default 50) and stops before its JSON
grows past PAGE_MAX_BYTES (always at least one job), so no page can reach tens of megabytes however big
each job's input is.
"""

import base64
import binascii
import json
import uuid
from datetime import datetime

from django.utils import timezone
from django.utils.dateparse import parse_datetime
from rest_framework.utils.urls import remove_query_param, replace_query_param

from executor.selectors import attempts_for
from jobs.api.errors import InvalidRequest
from jobs.api.serializers import job_as_dict
from jobs.selectors import job_list_rows

DEFAULT_LIMIT = 50
MAX_LIMIT = 200
PAGE_MAX_BYTES = 1024 * 1024


def _limit(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_LIMIT
    # The length first: int() refuses a string of more than 4,300 digits (a 500, not a 422).
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 6) or not 1 <= int(raw) <= MAX_LIMIT:
        raise InvalidRequest("Invalid limit.", fields={"limit": [f"A whole number from 1 to {MAX_LIMIT}."]})
    return int(raw)


def encode_cursor(created_at: datetime, job_id, direction: str) -> str:
    payload = {"t": created_at.isoformat(), "i": str(job_id), "d": direction}
    return base64.urlsafe_b64encode(json.dumps(payload, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_cursor(raw: str) -> tuple[datetime, uuid.UUID, str]:
    try:
        if len(raw) > 300:
            raise ValueError("too long")
        payload = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode("utf-8"))
        if not isinstance(payload, dict) or set(payload) != {"t", "i", "d"} or payload["d"] not in ("next", "prev"):
            raise ValueError("not a cursor")
        created_at = datetime.fromisoformat(payload["t"])
        if created_at.tzinfo is None:
            raise ValueError("no time zone")
        return created_at, uuid.UUID(payload["i"]), payload["d"]
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError, AttributeError):
        raise InvalidRequest("Invalid cursor.", fields={"cursor": ["Not a cursor from an earlier page."]}) from None


# At most this many `metadata.<key>=<value>` filters on one list request, each key and value bounded.
MAX_METADATA_FILTERS = 10
_METADATA_KEY_MAX, _METADATA_VALUE_MAX = 200, 1000


def list_filters(params) -> dict:
    """The list's filters from the query string: `created_after`, `created_before` (ISO 8601 with an offset)
    and `metadata.<key>=<value>` (a string value; several must all match). InvalidRequest naming the
    parameter for one that cannot be read. The cursor keeps its place within the same filters: a client
    sends the same filters with each page's link (the links carry them)."""
    filters, fields = {"metadata": {}}, {}
    for name in ("created_after", "created_before"):
        raw = params.get(name)
        if raw is None:
            continue
        moment = _moment(raw)
        if (moment is None or timezone.is_naive(moment)) and " " in raw:
            # `+01:00` sent unencoded reads ` 01:00` (a `+` in a query string is a space): take it as meant.
            moment = _moment("+".join(raw.rsplit(" ", 1)))
        if moment is None or timezone.is_naive(moment):
            fields[name] = ["An ISO 8601 time with its offset, e.g. 2026-12-01T00:00:00Z."]
        else:
            filters[name] = moment
    for name, value in params.items():
        if not name.startswith("metadata."):
            continue
        key = name[len("metadata."):]
        if not key or len(key) > _METADATA_KEY_MAX or len(value) > _METADATA_VALUE_MAX or "\x00" in key + value:
            fields[name] = [f"A key of 1 to {_METADATA_KEY_MAX} characters and a value of at most {_METADATA_VALUE_MAX}."]
        else:
            filters["metadata"][key] = value
    if len(filters["metadata"]) > MAX_METADATA_FILTERS:
        fields["metadata"] = [f"At most {MAX_METADATA_FILTERS} metadata filters."]
    if fields:
        raise InvalidRequest("The list's filters are not valid.", fields=fields)
    return filters


def _moment(raw: str) -> datetime | None:
    try:
        return parse_datetime(raw) if "\x00" not in raw else None
    except ValueError:  # well formed, not a time (a 13th month)
        return None


def job_page(request, *, client_id, status: str | None, filters: dict | None = None) -> dict:
    """`{"next", "previous", "results"}` for the client's jobs (optionally of one status, and within the
    list's filters)."""
    limit = _limit(request.query_params.get("limit"))
    raw_cursor = request.query_params.get("cursor")
    cursor = decode_cursor(raw_cursor) if raw_cursor else None  # `cursor=` (empty) is the first page
    backwards = cursor is not None and cursor[2] == "prev"
    rows = job_list_rows(client_id=client_id, status=status, after=cursor[:2] if cursor else None,
                         backwards=backwards, limit=limit + 1, **(filters or {}))
    attempts = attempts_for([job.id for job in rows[:limit]])
    shown, results, size = [], [], 0
    for job in rows[:limit]:
        job.attempt_rows = attempts.get(job.id, [])
        item = job_as_dict(job)
        size += len(json.dumps(item, separators=(",", ":"), ensure_ascii=False, default=str).encode("utf-8"))
        if shown and size > PAGE_MAX_BYTES:
            break
        shown.append(job)
        results.append(item)
    more = len(rows) > len(shown)
    if backwards:
        shown.reverse()
        results.reverse()
    if shown:
        newest, oldest = (shown[0].created_at, shown[0].id), (shown[-1].created_at, shown[-1].id)
    else:  # an empty page still links back to where it was
        newest = oldest = cursor[:2] if cursor is not None else None
    url = remove_query_param(request.build_absolute_uri(), "cursor")

    def link(position, direction: str) -> str | None:
        return replace_query_param(url, "cursor", encode_cursor(*position, direction)) if position else None

    if backwards:  # the page came from older jobs, so older jobs exist
        previous, next_ = link(newest, "prev") if more else None, link(oldest, "next")
    else:
        previous, next_ = link(newest, "prev") if cursor is not None else None, link(oldest, "next") if more else None
    return {"next": next_, "previous": previous, "results": results}
