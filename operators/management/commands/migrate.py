"""`manage.py migrate`, Django's, which first creates the database if it is missing, run so that it cannot
stall the release that is serving (docs/operating.md, "Releasing"): every connection it opens has a
`lock_timeout` (MIGRATE_LOCK_TIMEOUT_S, `--lock-timeout`) and a `statement_timeout`
(MIGRATE_STATEMENT_TIMEOUT_S, `--statement-timeout`; 0 is none), and it goes over MIGRATE_DATABASE_URL, a
direct connection to the primary, when that is set. A migration whose lock is not
free within the timeout fails, having changed nothing (each migration is its own transaction), and can be
run again; without one, its ALTER TABLE would wait in the lock queue with every query of the running
release waiting behind it."""

import psycopg
from django.conf import settings
from django.core.management.base import CommandError
from django.core.management.commands.migrate import Command as DjangoMigrate
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.signals import connection_created

from config.db import ensure_database

# Stock Debian, Ubuntu and Fedora PostgreSQL know only the `postgres` role: the default DATABASE_URL,
# which names no user, connects as the login user and is refused. One line says what to do instead of a
# traceback.
HINT = ("DATABASE_URL must name a PostgreSQL role that may create databases (README.md, Requirements): on "
        "Debian or Ubuntu `sudo -u postgres createuser --createdb --pwprompt $USER`, then "
        "DATABASE_URL=postgres://$USER:<password>@127.0.0.1:5432/payonce; where the server trusts local "
        "connections, DATABASE_URL=postgres://postgres@127.0.0.1:5432/payonce")


def _timeout(value, name: str) -> float:
    if value < 0:
        raise CommandError(f"--{name} is seconds, 0 or more: {value}")
    return value


class Command(DjangoMigrate):
    help = (DjangoMigrate.help
            + " (payonce: with a lock_timeout and a statement_timeout, over MIGRATE_DATABASE_URL when set)")

    def add_arguments(self, parser):
        super().add_arguments(parser)
        parser.add_argument("--lock-timeout", type=float, default=None, metavar="SECONDS",
                            help="how long a statement may wait for a lock "
                                 "(default MIGRATE_LOCK_TIMEOUT_S; 0: for ever)")
        parser.add_argument("--statement-timeout", type=float, default=None, metavar="SECONDS",
                            help="how long a statement may run (default MIGRATE_STATEMENT_TIMEOUT_S; 0: for ever)")

    def handle(self, *args, **options):
        lock_s = _timeout(settings.MIGRATE_LOCK_TIMEOUT_S if options["lock_timeout"] is None
                          else options["lock_timeout"], "lock-timeout")
        statement_s = _timeout(settings.MIGRATE_STATEMENT_TIMEOUT_S if options["statement_timeout"] is None
                               else options["statement_timeout"], "statement-timeout")
        alias = options["database"]
        if settings.MIGRATE_DATABASE is not None and alias == DEFAULT_DB_ALIAS:
            _direct(connections[alias], settings.MIGRATE_DATABASE)
        self._ensure_database(connections[alias].settings_dict)

        def bounded(sender, connection, **kwargs):
            if connection.alias == alias:
                _set(connection, f"{round(lock_s * 1000)}ms", f"{round(statement_s * 1000)}ms")

        connection_created.connect(bounded, weak=False)
        try:
            if connections[alias].connection is not None:  # opened before this command (call_command)
                bounded(None, connections[alias])
            return super().handle(*args, **options)
        finally:
            connection_created.disconnect(bounded)
            connection = connections[alias]
            if connection.connection is not None and not connection.needs_rollback:
                _reset(connection)  # the caller's connection as it was (call_command)

    def _ensure_database(self, database: dict) -> None:
        try:
            created = ensure_database(database)
        except psycopg.Error as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CommandError(f"DATABASE_URL {database.get('USER') or '(the login user)'}@{database.get('HOST') or 'localhost'}: "
                               f"{first}\n{HINT}") from exc
        if created:
            self.stdout.write(f"Created database {database['NAME']!r}.")


def _set(connection, lock: str, statement: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('lock_timeout', %s, false), set_config('statement_timeout', %s, false)",
                       [lock, statement])


def _reset(connection) -> None:
    with connection.cursor() as cursor:
        cursor.execute("RESET lock_timeout")
        cursor.execute("RESET statement_timeout")


def _direct(connection, database: dict) -> None:
    """The alias's connection made a direct one to MIGRATE_DATABASE_URL's server: its own parameters, and no
    pool (one command, one connection)."""
    connection.close()
    options = {**connection.settings_dict["OPTIONS"], **database["OPTIONS"]}
    options.pop("pool", None)
    connection.settings_dict.update({key: database[key] for key in ("NAME", "USER", "PASSWORD", "HOST", "PORT")},
                                    OPTIONS=options)
