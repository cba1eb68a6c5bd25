"""manage.py jobs_retry: a person's decision to pay again, for every failed or waiting job a filter matches
(operators.actions' "retry", as the admin's bulk retry)."""

from operators.cli import JobActionCommand


class Command(JobActionCommand):
    action = "retry"
