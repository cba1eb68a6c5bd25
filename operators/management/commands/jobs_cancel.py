"""manage.py jobs_cancel: cancel every open job a filter matches (operators.actions' "cancel", as the admin's
bulk cancel)."""

from operators.cli import JobActionCommand


class Command(JobActionCommand):
    action = "cancel"
