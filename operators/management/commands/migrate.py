"""`migrate`, which first creates the database named by DATABASE_URL if it is missing."""

import psycopg
from django.conf import settings
from django.core.management.base import CommandError
from django.core.management.commands.migrate import Command as MigrateCommand

from config.db import ensure_database

# Stock Debian, Ubuntu and Fedora PostgreSQL know only the `postgres` role: the default DATABASE_URL,
# which names no user, connects as the login user and is refused. One line says what to do instead of a
# traceback.
HINT = ("DATABASE_URL must name a PostgreSQL role that may create databases (README.md, Requirements): on "
        "Debian or Ubuntu `sudo -u postgres createuser --createdb --pwprompt $USER`, then "
        "DATABASE_URL=postgres://$USER:<password>@127.0.0.1:5432/payonce; where the server trusts local "
        "connections, DATABASE_URL=postgres://postgres@127.0.0.1:5432/payonce")


class Command(MigrateCommand):
    def handle(self, *args, **options):
        database = settings.DATABASES[options.get("database") or "default"]
        try:
            created = ensure_database(database)
        except psycopg.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CommandError(f"DATABASE_URL {database.get('USER') or '(the login user)'}@{database.get('HOST') or 'localhost'}: "
                               f"{first}\n{HINT}") from exc
        if created:
            self.stdout.write(f"Created database {database['NAME']!r}.")
        return super().handle(*args, **options)
