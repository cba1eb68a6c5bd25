"""`manage.py migrate` cannot stall the release that is serving (operators/management/commands/migrate.py):
a migration that cannot have its lock in time fails having changed nothing, and is run again once the lock
is free; a statement past its timeout fails the same way; MIGRATE_DATABASE_URL is the connection it uses.

The blocked migration is jobs 0012's last operation (`jobs_job`'s autovacuum settings, which waits for a
SHARE UPDATE EXCLUSIVE lock), undone and done again on this worker's test database while another session
holds a conflicting lock, as a long-running transaction of the serving release would."""

import subprocess
import sys
import time

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.migrations.recorder import MigrationRecorder
from django.db.utils import OperationalError

from tests.support.procs import REPO_ROOT, free_port, process_env

pytestmark = pytest.mark.django_db(transaction=True)

LAST = ("jobs", "0012_fair_dispatch_first_start")
BEFORE = "0011_fair_dispatch"


def _applied() -> bool:
    return MigrationRecorder.Migration.objects.filter(app=LAST[0], name=LAST[1]).exists()


def _session():
    db = connection.settings_dict
    return psycopg.connect(dbname=db["NAME"], user=db["USER"] or None, host=db["HOST"] or "localhost",
                           port=db["PORT"] or 5432, autocommit=False)


def _migrate_while_locked(*args) -> tuple[BaseException | None, float]:
    with _session() as holder:
        holder.execute("LOCK TABLE jobs_job IN SHARE UPDATE EXCLUSIVE MODE")  # held until the block ends
        started = time.monotonic()
        try:
            call_command("migrate", LAST[0], BEFORE, "--noinput", *args, verbosity=0)
        except (OperationalError, CommandError) as failure:
            return failure, time.monotonic() - started
        return None, time.monotonic() - started


def test_a_migration_whose_lock_is_held_fails_in_its_lock_timeout_and_changes_nothing():
    assert _applied()
    try:
        failure, took = _migrate_while_locked("--lock-timeout", "0.5")
        assert failure is not None and "lock timeout" in str(failure)
        assert 0.4 < took < 5
        assert _applied()  # nothing changed: the migration rolled back whole
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_proc WHERE proname = 'payonce_job_start_first'")
            assert cursor.fetchone() is not None
            # The test's own connection, which the command used, is as it was: no timeout left on it.
            cursor.execute("SHOW lock_timeout")
            assert cursor.fetchone()[0] == "0"
        # The lock free, the same command goes through.
        call_command("migrate", LAST[0], BEFORE, "--noinput", "--lock-timeout", "0.5", verbosity=0)
        assert not _applied()
    finally:
        call_command("migrate", LAST[0], "--noinput", verbosity=0)
    assert _applied()


def test_a_statement_past_its_timeout_fails_the_same_way():
    try:
        failure, took = _migrate_while_locked("--lock-timeout", "0", "--statement-timeout", "0.5")
        assert failure is not None and "statement timeout" in str(failure)
        assert 0.4 < took < 5 and _applied()
    finally:
        call_command("migrate", LAST[0], "--noinput", verbosity=0)


def test_a_negative_timeout_is_refused():
    with pytest.raises(CommandError, match="0 or more"):
        call_command("migrate", "--noinput", "--lock-timeout", "-1", verbosity=0)


@pytest.mark.e2e
def test_migrate_url_is_the_connection_it_uses():
    # DATABASE_URL (a PgBouncer, say) unreachable, MIGRATE_DATABASE_URL the database: it migrates. And the
    # other way round it fails: the direct URL, not DATABASE_URL, is the one it connected to.
    env = process_env()
    port = free_port()
    closed = f"postgres://localhost:{port}/nowhere"

    def migrate(**overrides):
        return subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=REPO_ROOT,
                              env={**env, **overrides}, capture_output=True, text=True, timeout=120)

    direct = migrate(DATABASE_URL=closed, MIGRATE_DATABASE_URL=env["DATABASE_URL"])
    assert direct.returncode == 0, direct.stderr
    assert "No migrations to apply" in direct.stdout
    refused = migrate(MIGRATE_DATABASE_URL=closed)
    assert refused.returncode != 0 and f"port {port} failed" in refused.stderr
