"""The operators' side in tests: staff users with given permissions (None: a superuser), a logged-in
session on a real web process's admin, and the rows its pages show (a client with a cap, a media job)."""

from decimal import Decimal as D

import requests
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from jobs.models import Client, Job
from jobs.services import client_create, job_create
from tests.conftest import HOOK_URL


PASSWORD = "correct horse battery staple 7"


def staff(name: str, perms: list[str] | None):
    users = get_user_model().objects
    if perms is None:
        return users.create_superuser(name, f"{name}@example.com", PASSWORD)
    user = users.create_user(name, f"{name}@example.com", PASSWORD, is_staff=True)
    for perm in perms:
        app, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    return user


def login(base_url: str, name: str) -> requests.Session:
    session = requests.Session()
    session.get(f"{base_url}/admin/login/", timeout=10)
    answer = session.post(f"{base_url}/admin/login/?next=/admin/", timeout=10, allow_redirects=False,
                          data={"username": name, "password": PASSWORD,
                                "csrfmiddlewaretoken": session.cookies["csrftoken"]},
                          headers={"Referer": f"{base_url}/admin/login/"})
    assert answer.status_code == 302, (name, answer.status_code)
    return session


def make_client(name: str, cap: str | None = None, webhook_url: str = HOOK_URL) -> Client:
    created = client_create(name=name, monthly_cap_usd=D(cap) if cap is not None else None, webhook_url=webhook_url)
    return Client.objects.get(id=created["client_id"])


def media_job(client: Client, key: str) -> Job:
    job, _ = job_create(client=client, idempotency_key=key, data={
        "kind": "media", "models": ["sandbox/video-keyed"], "input": {"prompt": key, "render_s": 0},
        "policy": {"attempts_per_model": 3, "fallback_on": []}, "metadata": {}})
    return job
