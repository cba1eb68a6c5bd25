"""`migrate`, which first creates the database named by DATABASE_URL if it is missing."""

from django.conf import settings
from django.core.management.commands.migrate import Command as MigrateCommand

from config.db import ensure_database


class Command(MigrateCommand):
    def handle(self, *args, **options):
        database = settings.DATABASES[options.get("database") or "default"]
        if ensure_database(database):
            self.stdout.write(f"Created database {database['NAME']!r}.")
        return super().handle(*args, **options)
