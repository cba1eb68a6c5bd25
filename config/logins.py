"""The admin login's answer once a user and address are locked out (django-axes counts the failures and
refuses before any password is hashed): a plain 429 with Retry-After, the same words whether or not the
password tried was right, so a locked-out guesser learns nothing from it."""

from django.conf import settings
from django.http import HttpResponse

LOCKED = ("Too many failed logins for this user from this address: try again in {minutes} minutes. "
          "An operator can lift it earlier with `manage.py axes_reset_username NAME`.")


def locked_out(request, *_ignored) -> HttpResponse:
    """AXES_LOCKOUT_CALLABLE. axes calls it as (request, response, credentials) on the sync path and as
    (request, credentials) on the async one: only the request is read."""
    seconds = int(settings.AXES_COOLOFF_TIME.total_seconds())
    answer = HttpResponse(LOCKED.format(minutes=max(1, round(seconds / 60))), status=429,
                          content_type="text/plain; charset=utf-8")
    answer["Retry-After"] = str(seconds)
    return answer
