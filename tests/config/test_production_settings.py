"""The settings docs/operating.md's production sections lean on, each read from the environment by a real
process: SECRET_KEY_FALLBACKS (a link signed before a key rotation still opens), a multi-host DATABASE_URL
with libpq's own parameters (a failover's promoted host is found), DB_SERVER_SIDE_CURSORS=0 (no cursor
outlives its transaction behind a PgBouncer in transaction mode) and DB_HEALTH_CHECKS=1 (a connection
PostgreSQL dropped is never lent to a query)."""

import re
import uuid

import pytest
import requests
from django.db import connection
from django.test import override_settings

from jobs.models import Report
from jobs.kinds.report.reports import link_token
from jobs.services import client_create
from tests.support.commands import run_django
from tests.support.engine import media_job
from tests.support.procs import ProcfileProcess, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

NEW_KEY = "payonce-rotated-in-" + "n" * 40
OLD_KEY = "payonce-rotated-out-" + "o" * 40


def a_report_being_written() -> uuid.UUID:
    client = client_create(name=f"rotation-{uuid.uuid4().hex[:8]}")
    job = media_job(client["client_id"])
    job.kind = "report"
    job.save(update_fields=["kind"])
    Report.objects.create(job=job, email="buyer@example.com", chapter_keys=["sun"])
    return job.id


def report_page_status(token: str, **env) -> int:
    web = ProcfileProcess("web", {"PORT": free_port(), "SECRET_KEY": NEW_KEY, **env}).start()
    try:
        return requests.get(f"http://127.0.0.1:{web.port}/r/{token}", timeout=10).status_code
    finally:
        web.stop()


def test_a_report_link_signed_with_the_previous_secret_key_opens_while_that_key_is_a_fallback():
    job_id = a_report_being_written()
    with override_settings(SECRET_KEY=OLD_KEY):
        old_token = link_token(job_id)
    with override_settings(SECRET_KEY=NEW_KEY):
        new_token = link_token(job_id)

    # 202: the report's page while it is being written (404 is a token that is not ours).
    assert report_page_status(old_token, SECRET_KEY_FALLBACKS=f"another-{'x' * 40}, {OLD_KEY}") == 202
    assert report_page_status(old_token) == 404  # the old key dropped: its links no longer open
    assert report_page_status(new_token, SECRET_KEY_FALLBACKS=OLD_KEY) == 202  # new links use SECRET_KEY


def test_a_multi_host_database_url_reaches_the_first_host_that_accepts_writes():
    db = connection.settings_dict
    unreachable = free_port()  # nobody listens there: a primary that is gone
    url = (f"postgres://127.0.0.1:{unreachable},{db['HOST'] or 'localhost'}:{db['PORT'] or 5432}/{db['NAME']}"
           "?target_session_attrs=read-write&connect_timeout=3")

    done = run_django("""
        from django.db import connection
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_database(), pg_is_in_recovery(), current_setting('transaction_read_only')")
            print(cursor.fetchone())
        print(connection.connection.info.port, connection.settings_dict["HOST"])
    """, DATABASE_URL=url)

    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0] == repr((db["NAME"], False, "off"))
    port, hosts = lines[1].split(" ", 1)
    assert port == str(db["PORT"] or 5432) and hosts == f"127.0.0.1,{db['HOST'] or 'localhost'}"


ITERATE_JOBS = """
    from django.db import connection
    from jobs.models import Job
    for job in Job.objects.all().iterator(chunk_size=1):
        with connection.cursor() as cursor:  # between two FETCHes, as a bulk action's own transactions are
            cursor.execute("SELECT count(*) FROM pg_cursors")
            print(cursor.fetchone()[0])
        break
"""


@pytest.mark.parametrize(("setting", "open_cursors"), [(None, "1"), ("1", "1"), ("0", "0")])
def test_db_server_side_cursors_off_leaves_no_cursor_open_between_transactions(setting, open_cursors):
    client = client_create(name=f"cursors-{uuid.uuid4().hex[:8]}")
    media_job(client["client_id"]), media_job(client["client_id"])
    env = {} if setting is None else {"DB_SERVER_SIDE_CURSORS": setting}

    done = run_django(ITERATE_JOBS, **env)

    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == open_cursors


LEND_A_DROPPED_CONNECTION = """
    import psycopg
    from django.db import connection
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    connection.close()  # back to the pool, as at the end of a request or a task
    params = connection.get_connection_params()
    params.pop("cursor_factory", None), params.pop("context", None), params.pop("prepare_threshold", None)
    with psycopg.connect(**{**params, "application_name": "admin"}, autocommit=True) as admin:
        # A failover, a restart: the server drops every connection of this process's pool (however many
        # the pool opened), and waits until they are gone.
        dropped = [row[0] for row in admin.execute(
            "SELECT pid, pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE application_name = %s",
            [params["application_name"]])]
    assert dropped, "no pooled connection found"
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            print("answered", cursor.fetchone()[0] not in dropped)
    except Exception as exc:
        print("failed", type(exc).__name__)
"""


@pytest.mark.parametrize(("setting", "outcome"), [(None, "failed OperationalError"), ("1", "answered True")])
def test_db_health_checks_lend_no_connection_the_server_dropped(setting, outcome):
    env = {} if setting is None else {"DB_HEALTH_CHECKS": setting}
    db = connection.settings_dict
    # Its own application_name (a libpq parameter, passed through), so only its pool's connections are dropped.
    user = f"{db['USER']}@" if db["USER"] else ""
    url = (f"postgres://{user}{db['HOST'] or 'localhost'}:{db['PORT'] or 5432}/{db['NAME']}"
           f"?application_name=payonce-health-{uuid.uuid4().hex[:8]}")

    done = run_django(LEND_A_DROPPED_CONNECTION, DATABASE_URL=url, **env)

    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == outcome


# --- TLS terminated by a proxy -----------------------------------------------------------------------------


def admin_login_behind_a_proxy(port: int, **headers) -> int:
    """A wrong-password admin login as a browser sends it through a TLS-terminating proxy for
    https://payonce.test: the status of the POST (200, the form again: the CSRF check passed; 403: refused)."""
    session = requests.Session()
    base = f"http://127.0.0.1:{port}/admin/login/"
    common = {"Host": "payonce.test", **headers}
    page = session.get(base, headers=common, timeout=10)
    assert page.status_code == 200, page.status_code
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    answer = session.post(base, data={"csrfmiddlewaretoken": token, "username": "nobody", "password": "wrong",
                                      "next": "/admin/"},
                          headers={**common, "Origin": "https://payonce.test",
                                   "Referer": "https://payonce.test/admin/login/"}, timeout=10)
    return answer.status_code


def test_the_admin_behind_a_tls_proxy_takes_https_from_x_forwarded_proto_of_a_trusted_proxy_only():
    """docs/operating.md, "TLS and proxy headers": uvicorn believes X-Forwarded-Proto from FORWARDED_ALLOW_IPS
    (default 127.0.0.1), so Django sees https and the admin's CSRF check accepts the https Origin without
    SECURE_PROXY_SSL_HEADER or CSRF_TRUSTED_ORIGINS naming it."""
    hosts = {"ALLOWED_HOSTS": "payonce.test,127.0.0.1"}
    trusted = ProcfileProcess("web", {"PORT": free_port(), **hosts}).start()
    try:
        assert admin_login_behind_a_proxy(trusted.port, **{"X-Forwarded-Proto": "https"}) == 200
        assert admin_login_behind_a_proxy(trusted.port) == 403  # plain http: the https Origin is foreign
    finally:
        trusted.stop()
    untrusted = ProcfileProcess("web", {"PORT": free_port(), "FORWARDED_ALLOW_IPS": "10.9.9.9", **hosts}).start()
    try:  # the header from an address that is not the proxy's: ignored
        assert admin_login_behind_a_proxy(untrusted.port, **{"X-Forwarded-Proto": "https"}) == 403
    finally:
        untrusted.stop()
