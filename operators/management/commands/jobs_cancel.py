"""manage.py jobs_cancel: cancel every open job a filter matches (operators.operations, as the admin's bulk cancel)."""

from operators.cli import JobActionCommand
from operators.models import OperatorActionKind


class Command(JobActionCommand):
    help = ("Cancel every queued, running or waiting job the filter matches (ended jobs are skipped), with a "
            "reason and one audit row. No filter at all is refused unless --all is given. --dry-run previews.")
    action = OperatorActionKind.CANCEL
