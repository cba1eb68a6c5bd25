"""The admin login is throttled (django-axes), through a real `web` process of the test's own with a short
lock-out: after ADMIN_LOGIN_FAILURE_LIMIT wrong passwords for one user from one address, even the right
password is refused with 429 until the lock-out ends; another user, or the same one after it, logs in.
Before, 40 wrong passwords in 9.5 s were followed by a login with the right one."""

import os
import time

import pytest
import requests
from django.contrib.auth import get_user_model

from tests.conftest import WEB_STACK_ENV
from tests.support.procs import ProcfileProcess, free_port

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]

PASSWORD = "correct horse battery staple 7"
LIMIT, LOCKOUT_S = 3, 4


@pytest.fixture
def web(django_db_blocker):
    process = ProcfileProcess("web", {**WEB_STACK_ENV, "PORT": free_port(), "ADMIN_LOGIN_FAILURE_LIMIT": LIMIT,
                                      "ADMIN_LOGIN_LOCKOUT_S": LOCKOUT_S}).start()
    yield process
    process.stop()


def log_in(url: str, name: str, password: str) -> requests.Response:
    session = requests.Session()
    session.get(f"{url}/admin/login/", timeout=10)
    return session.post(f"{url}/admin/login/?next=/admin/", timeout=10, allow_redirects=False,
                        data={"username": name, "password": password,
                              "csrfmiddlewaretoken": session.cookies["csrftoken"]},
                        headers={"Referer": f"{url}/admin/login/"})


def logged_in(answer: requests.Response) -> bool:
    return answer.status_code == 302 and "sessionid" in answer.cookies


def test_after_a_few_wrong_passwords_even_the_right_one_is_refused_until_the_lockout_ends(web):
    users = get_user_model().objects
    users.create_superuser("ops", "ops@example.com", PASSWORD)
    users.create_superuser("other", "other@example.com", PASSWORD)

    for _ in range(LIMIT):
        wrong = log_in(web.url, "ops", "guess")
        assert wrong.status_code in (200, 429) and not logged_in(wrong)

    right = log_in(web.url, "ops", PASSWORD)
    assert right.status_code == 429 and not logged_in(right)
    assert int(right.headers["Retry-After"]) == LOCKOUT_S
    # The same words whether the password was right or wrong: the lock-out tells a guesser nothing.
    assert log_in(web.url, "ops", "guess").text == right.text

    # Another user from the same address is not locked out.
    assert logged_in(log_in(web.url, "other", PASSWORD))

    time.sleep(LOCKOUT_S + 1)
    assert logged_in(log_in(web.url, "ops", PASSWORD))


ADDRESS_LIMIT = 6


@pytest.fixture
def web_with_address_limit(django_db_blocker):
    process = ProcfileProcess("web", {**WEB_STACK_ENV, "PORT": free_port(), "ADMIN_LOGIN_FAILURE_LIMIT": LIMIT,
                                      "ADMIN_LOGIN_ADDRESS_FAILURE_LIMIT": ADDRESS_LIMIT,
                                      "ADMIN_LOGIN_LOCKOUT_S": 60}).start()
    yield process
    process.stop()


def cpu_seconds(process: ProcfileProcess) -> float:
    """User and system CPU of the web process and its uvicorn workers, from /proc."""
    ticks = 0
    for pid in (process.pid, *process.children()):
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def timed_logins(url: str, names: list[str], password: str) -> tuple[list[requests.Response], float]:
    started = time.monotonic()
    answers = [log_in(url, name, password) for name in names]
    return answers, (time.monotonic() - started) / len(names)


@pytest.mark.alone  # compares the time of two kinds of login: other tests' load would skew one of them
def test_wrong_logins_for_unknown_users_lock_the_address_out_and_then_cost_no_hashing(web_with_address_limit):
    web = web_with_address_limit
    get_user_model().objects.create_superuser("ops", "ops@example.com", PASSWORD)
    log_in(web.url, "warm-up", "guess")  # the first request's imports are not a login's cost
    from axes.models import AccessAttempt

    AccessAttempt.objects.all().delete()  # and its failure is not counted

    cpu = cpu_seconds(web)
    refused, known_s = timed_logins(web.url, ["ops"], "guess")  # a known user, a wrong password
    unknown, unknown_s = timed_logins(web.url, [f"nobody-{n}" for n in range(ADDRESS_LIMIT - 2)], "guess")
    before = (cpu_seconds(web) - cpu) / (ADDRESS_LIMIT - 1)
    # Below both limits: the login page again, and an unknown user costs what a known one does (the
    # hasher runs once either way, so the time taken does not say which users exist).
    assert [answer.status_code for answer in refused + unknown] == [200] * (ADDRESS_LIMIT - 1)
    assert 0.5 < unknown_s / known_s < 2, (unknown_s, known_s)
    # The address's last failure within its limit, on yet another unknown username: hashed, and locks out.
    assert log_in(web.url, "nobody-else", "guess").status_code == 429

    cpu = cpu_seconds(web)
    locked, locked_s = timed_logins(web.url, [f"stranger-{n}" for n in range(10)], "guess")
    after = (cpu_seconds(web) - cpu) / 10
    right = log_in(web.url, "ops", PASSWORD)

    print(f"\nper refused login: {before * 1000:.0f} ms CPU before the lock-out ({unknown_s * 1000:.0f} ms wall), "
          f"{after * 1000:.0f} ms after ({locked_s * 1000:.0f} ms wall)")
    assert {answer.status_code for answer in locked} == {429}
    assert "from this address" in locked[0].text and int(locked[0].headers["Retry-After"]) == 60
    assert right.status_code == 429 and not logged_in(right)  # the address is locked out, whoever logs in
    assert after < before / 4, (before, after)
