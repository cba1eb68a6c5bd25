"""manage.py jobs_replay: send every delivery of the jobs a filter matches again (operators.operations, as the
admin's bulk replay): the stored envelopes under the same webhook-id; no provider is called."""

from operators.cli import JobActionCommand
from operators.models import OperatorActionKind


class Command(JobActionCommand):
    help = ("Send every webhook delivery of the matching jobs again (the exact stored envelope, the same "
            "webhook-id: receivers dedupe on it); nothing is paid. A reason and one audit row. No filter at all "
            "is refused unless --all is given. --dry-run previews.")
    action = OperatorActionKind.REPLAY
