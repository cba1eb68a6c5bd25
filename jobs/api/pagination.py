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


def job_page(request, *, client_id, status: str | None) -> dict:
    """`{"next", "previous", "results"}` for the client's jobs (optionally of one status)."""
    limit = _limit(request.query_params.get("limit"))
    raw_cursor = request.query_params.get("cursor")
    cursor = decode_cursor(raw_cursor) if raw_cursor else None  # `cursor=` (empty) is the first page
    backwards = cursor is not None and cursor[2] == "prev"
    rows = job_list_rows(client_id=client_id, status=status, after=cursor[:2] if cursor else None,
                         backwards=backwards, limit=limit + 1)
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
