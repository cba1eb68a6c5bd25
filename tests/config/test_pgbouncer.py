"""payonce behind a real PgBouncer in transaction mode (docs/operating.md, "PgBouncer"): what needs session
state, found by making PgBouncer hand a client's next statement to another server connection (other clients
hold the pool's connections in transactions, so the one left free is known).

- server-side binding (DB_SERVER_SIDE_BINDING, on by default) needs none: Django keeps psycopg's prepared
  statements off, so no statement outlives its round trip;
- a QuerySet's .iterator() reads through a named cursor WITH HOLD, which does: DB_SERVER_SIDE_CURSORS=0
  reads without one.

PgBouncer is a Debian package: `make test` installs it when run as root on Debian or Ubuntu; without it
these tests fail saying how to get it (a test that did not run has not passed)."""

import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from jobs.services import client_create
from tests.support.commands import run_django
from tests.support.engine import media_job
from tests.support.procs import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PGBOUNCER = shutil.which("pgbouncer") or next(
    (path for path in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if Path(path).exists()), None)


@pytest.fixture
def pgbouncer(tmp_path):
    """A PgBouncer in transaction mode with two server connections, in front of the test database; its URL."""
    if PGBOUNCER is None:
        pytest.fail("pgbouncer is not installed: Debian, Ubuntu: apt-get install pgbouncer; macOS: brew install pgbouncer")
    db = connection.settings_dict
    port = free_port()
    tmp_path.chmod(0o755)  # PgBouncer refuses to run as root: as root, it is started as nobody
    config = tmp_path / "pgbouncer.ini"
    config.write_text(f"""[databases]
payonce = host={db['HOST'] or '127.0.0.1'} port={db['PORT'] or 5432} dbname={db['NAME']} user={db['USER'] or 'postgres'}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = 2
max_client_conn = 50
""")
    config.chmod(0o644)
    as_nobody = ["-u", "nobody"] if os.geteuid() == 0 else []
    log = open(tmp_path / "pgbouncer.log", "wb")
    process = subprocess.Popen([PGBOUNCER, *as_nobody, str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                psycopg.connect(host="127.0.0.1", port=port, dbname="payonce", user="postgres", connect_timeout=1).close()
                break
            except psycopg.OperationalError:
                assert time.monotonic() < deadline and process.poll() is None, (tmp_path / "pgbouncer.log").read_text()
                time.sleep(0.1)
        yield f"postgres://postgres@127.0.0.1:{port}/payonce", port
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


BOUND_STATEMENTS = """
    import psycopg
    from django.db import connection
    # Two other clients (not autocommit) each hold one of the pool's two server connections in turn, so the one
    # left free for Django is fixed at every moment, whatever order PgBouncer hands idle connections out in.
    first, second = (psycopg.connect(host="127.0.0.1", port={port}, dbname="payonce", user="postgres") for _ in range(2))
    servers = set()
    try:
        first.execute("SELECT 1")  # holds one server connection: Django's statements 0 to 5 run on the other
        for i in range(12):
            with connection.cursor() as cursor:
                cursor.execute("SELECT %s::int + 1, pg_backend_pid(), (SELECT count(*) FROM pg_prepared_statements)", [i])
                answer, server, prepared = cursor.fetchone()
            assert answer == i + 1 and prepared == 0, (answer, prepared)
            servers.add(server)
            if i == 5:
                second.execute("SELECT 1")  # takes the connection Django used (the only free one)
                first.commit()  # and frees the first: Django's statements 6 to 11 run on it
        print("answered", len(servers), type(connection.cursor().cursor).__name__)
    except Exception as exc:
        print("failed", type(exc).__name__)
"""


def test_server_side_binding_needs_no_session_state_behind_pgbouncer(pgbouncer):
    url, port = pgbouncer

    done = run_django(BOUND_STATEMENTS.format(port=port), DATABASE_URL=url)

    assert done.returncode == 0, done.stderr[-3000:]
    # Two server connections served one client's statements, bound on the server, none prepared.
    assert done.stdout.strip().splitlines()[-1] == "answered 2 ServerBindingCursor"


ITERATE = """
    import psycopg
    from jobs.models import Job
    first, second = (psycopg.connect(host="127.0.0.1", port={port}, dbname="payonce", user="postgres") for _ in range(2))
    read = 0
    try:
        first.execute("SELECT 1")  # holds one server connection: the cursor lives on the other
        for job in Job.objects.order_by("id").iterator(chunk_size=1):
            read += 1
            if read == 1:
                second.execute("SELECT 1")  # takes the connection the cursor lives on (the only free one)
                first.commit()  # and frees the first: the next fetch runs there
        print("read", read)
    except Exception as exc:
        print("failed", type(exc).__name__, str(exc).splitlines()[0])
"""


# The cursor is on the other server connection: PostgreSQL names it a cursor or a portal, by the message.
MISSING_CURSOR = r'failed \w+ (cursor|portal) "_django_curs_\w+" does not exist'


@pytest.mark.parametrize(("setting", "outcome"), [(None, MISSING_CURSOR), ("0", "read 3")])
def test_an_iterator_behind_pgbouncer_needs_db_server_side_cursors_off(pgbouncer, setting, outcome):
    url, port = pgbouncer
    client = client_create(name=f"pgbouncer-{uuid.uuid4().hex[:8]}")
    for _ in range(3):
        media_job(client["client_id"])
    env = {} if setting is None else {"DB_SERVER_SIDE_CURSORS": setting}

    done = run_django(ITERATE.format(port=port), DATABASE_URL=url, **env)

    assert done.returncode == 0, done.stderr[-3000:]
    assert re.fullmatch(outcome, done.stdout.strip().splitlines()[-1]), done.stdout
