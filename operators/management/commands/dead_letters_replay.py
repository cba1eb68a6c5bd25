"""manage.py dead_letters_replay: replay_deliveries with --dead always on, as the admin's dead letter replay:
send dead webhook deliveries again, the exact stored envelope under the same webhook-id; nothing is paid."""

from operators.management.commands import replay_deliveries


class Command(replay_deliveries.Command):
    help = ("Replay dead letters (deliveries that used up their retries), chosen by --id (repeatable), --client "
            "and/or --since; the retry schedule starts again. Deliveries that are not dead are counted and "
            "skipped. A reason and one audit row. No filter at all is refused unless --all is given. "
            "--dry-run previews.")
    dead_only = True
