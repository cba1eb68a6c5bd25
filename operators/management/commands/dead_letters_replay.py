"""manage.py dead_letters_replay: replay_deliveries with --dead always on, as the admin's dead letter replay:
send dead webhook deliveries again, the exact stored envelope under the same webhook-id; nothing is paid."""

from operators.management.commands import replay_deliveries


class Command(replay_deliveries.Command):
    action = "replay_dead"
    dead_only = True
