"""manage.py jobs_replay: send every delivery of the jobs a filter matches again (operators.actions' "replay", as
the admin's bulk replay): the stored envelopes under the same webhook-id; no provider is called."""

from operators.cli import JobActionCommand


class Command(JobActionCommand):
    action = "replay"
