"""manage.py jobs_cancel: cancel every open job a filter matches (jobs.operations, as the admin's bulk cancel)."""

from jobs.management.cli import JobActionCommand
from jobs.models import OperatorActionKind


class Command(JobActionCommand):
    help = ("Cancel every queued, running or waiting job the filter matches (ended jobs are skipped), with a "
            "reason and one audit row. No filter at all is refused unless --all is given. --dry-run previews.")
    action = OperatorActionKind.CANCEL
