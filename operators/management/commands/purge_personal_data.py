"""Remove reports' personal input after the retention period (docs/design.md, "Personal data")."""

import json
import re
from datetime import timedelta

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from operators.purge import personal_data_purge

_AGE = re.compile(r"\A(\d+)([dh])\Z", re.ASCII)


class Command(BaseCommand):
    help = "Remove the personal input of reports older than the retention period (default REPORT_RETENTION_DAYS)."

    def add_arguments(self, parser):
        parser.add_argument("--older-than", default=f"{settings.REPORT_RETENTION_DAYS}d",
                            help="an age: 90d, 36h (default: REPORT_RETENTION_DAYS days)")
        parser.add_argument("--dry-run", action="store_true", help="say which reports, change nothing")

    def handle(self, *args, older_than, dry_run, **options):
        match = _AGE.match(older_than)
        if not match:
            raise CommandError(f"--older-than {older_than!r}: an age like 90d or 36h")
        amount, unit = int(match.group(1)), match.group(2)
        cutoff = timezone.now() - (timedelta(days=amount) if unit == "d" else timedelta(hours=amount))
        purged = personal_data_purge(older_than=cutoff, dry_run=dry_run)
        self.stdout.write(json.dumps({"dry_run": dry_run, "older_than": cutoff.isoformat(), "reports": purged}))
