"""The admin login is throttled (django-axes), through a real `web` process of the test's own with a short
lock-out: after ADMIN_LOGIN_FAILURE_LIMIT wrong passwords for one user from one address, even the right
password is refused with 429 until the lock-out ends; another user, or the same one after it, logs in.
Before, 40 wrong passwords in 9.5 s were followed by a login with the right one."""

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
    process.url = f"http://127.0.0.1:{process.port}"
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
