"""What a month is to billing: a budget is kept per client and UTC calendar month. One home for the month of
a moment, the month after, and a month named `YYYY-MM` (GET /v1/spend, the admin's filters, the CLI)."""

import re
from datetime import date, datetime, timedelta
from datetime import timezone as dt_timezone

from django.utils import timezone

# ASCII digits only (`\d` would take any script's digits, fullwidth ones included), the whole value
# (`$` would also match before a final newline).
_MONTH = re.compile(r"\A([0-9]{4})-([0-9]{2})\Z", re.ASCII)
# 2000-01 to 9999-11: a month's spend names the moment it resets, and 9999-12 would reset in the year
# 10000, which no date holds. MONTH_PATTERN says the same for the OpenAPI document.
FIRST, LAST = (2000, 1), (9999, 11)
MONTH_PATTERN = r"^(([2-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9]|999[0-8])-(0[1-9]|1[0-2])|9999-(0[1-9]|1[01]))$"
MONTH_WORDS = "YYYY-MM, a month from 2000-01 to 9999-11."


def month_of(at: datetime) -> date:
    """The first day of `at`'s UTC calendar month."""
    at = at.astimezone(dt_timezone.utc) if timezone.is_aware(at) else at
    return date(at.year, at.month, 1)


def next_month(month: date) -> date:
    return (month.replace(day=28) + timedelta(days=4)).replace(day=1)


def parse_month(text: str) -> date:
    """`YYYY-MM` as the first day of that month; ValueError (saying MONTH_WORDS) for anything else."""
    match = _MONTH.match(text or "")
    if not match or not 1 <= int(match.group(2)) <= 12 or not FIRST <= (int(match.group(1)), int(match.group(2))) <= LAST:
        raise ValueError(MONTH_WORDS)
    return date(int(match.group(1)), int(match.group(2)), 1)


def month_bounds(month: date) -> tuple[datetime, datetime]:
    """The month as [its first instant, the next month's first instant), in UTC."""
    return (datetime.combine(month, datetime.min.time(), tzinfo=dt_timezone.utc),
            datetime.combine(next_month(month), datetime.min.time(), tzinfo=dt_timezone.utc))
