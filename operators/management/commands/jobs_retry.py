"""manage.py jobs_retry: a person's decision to pay again, for every failed or waiting job a filter matches
(operators.operations, as the admin's bulk retry)."""

from operators.cli import JobActionCommand
from operators.models import OperatorActionKind


class Command(JobActionCommand):
    help = ("Retry every failed or waiting job the filter matches: each starts a new run, which PAYS AGAIN "
            "(its done steps are read back, not paid); the worst case it may reserve is printed first. A reason "
            "and one audit row. No filter at all is refused unless --all is given. --dry-run previews.")
    action = OperatorActionKind.RETRY
    pays_again = True
