"""Send deliveries again: the exact stored envelope, under the same webhook-id (receivers dedupe on it)."""

from django.core.management.base import BaseCommand, CommandError
from django.utils.dateparse import parse_datetime

from webhooks.services import deliveries_replay


class Command(BaseCommand):
    help = "Replay deliveries (dead letters with --dead), selected by --since and/or --id."

    def add_arguments(self, parser):
        parser.add_argument("--dead", action="store_true", help="only dead deliveries")
        parser.add_argument("--since", help="only deliveries created at or after this ISO 8601 time")
        parser.add_argument("--id", action="append", dest="ids", help="a delivery id (repeatable)")

    def handle(self, *args, dead, since, ids, **options):
        if not (dead or since or ids):
            raise CommandError("Say which deliveries: --dead, --since ISO and/or --id ID.")
        when = None
        if since:
            when = parse_datetime(since)
            if when is None or when.tzinfo is None:
                raise CommandError(f"--since {since!r}: give an ISO 8601 time with its offset, e.g. 2026-11-29T10:00:00Z")
        count = deliveries_replay(dead_only=dead, since=when, ids=ids)
        self.stdout.write(f"Replaying {count} deliveries.")
