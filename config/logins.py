"""The admin login's throttle (django-axes counts the failures and refuses before any password is hashed)
and its answer once locked out: a plain 429 with Retry-After, the same words whether or not the password
tried was right, so a locked-out guesser learns nothing from it.

Two counts, each over ADMIN_LOGIN_LOCKOUT_S: failures for one user from one address (ADMIN_LOGIN_FAILURE_
LIMIT: a stranger cannot lock an operator out from elsewhere), and failures from one address whatever the
usernames (ADMIN_LOGIN_ADDRESS_FAILURE_LIMIT). The second closes issue 38's gap: a login for an unknown user
costs the password hasher's CPU like any other (Django's ModelBackend hashes once for an unknown user, so
that the time taken does not say which users exist; that stays), and a new username each time never reached
the per-user limit, so a guesser could burn the hasher's CPU forever. Once an address is locked out, every
login from it is refused before the hasher runs."""

from django.conf import settings
from django.db.models import Sum
from django.http import HttpResponse

from axes.handlers.database import AxesDatabaseHandler

LOCKED = ("Too many failed logins from this address: try again in {minutes} minutes. An operator can lift "
          "it earlier with `manage.py axes_reset_username NAME` or `manage.py axes_reset_ip ADDRESS`.")


class LoginFailures(AxesDatabaseHandler):
    """AXES_HANDLER: axes's database handler, with AXES_LOCKOUT_PARAMETERS [[username, ip_address],
    ip_address] counted against a limit each (axes has one limit for every parameter set)."""

    def get_failures(self, request, credentials=None) -> int:
        """What axes compares to AXES_FAILURE_LIMIT (the per-user one): the user-and-address count, or the
        limit itself once the address's count reached ADMIN_LOGIN_ADDRESS_FAILURE_LIMIT."""
        pair, address = (attempts.aggregate(total=Sum("failures_since_start"))["total"] or 0
                         for attempts in self.get_user_attempts(request, credentials))
        if address >= settings.ADMIN_LOGIN_ADDRESS_FAILURE_LIMIT:
            return max(pair, settings.AXES_FAILURE_LIMIT)
        return pair


def locked_out(request, *_ignored) -> HttpResponse:
    """AXES_LOCKOUT_CALLABLE. axes calls it as (request, response, credentials) on the sync path and as
    (request, credentials) on the async one: only the request is read."""
    seconds = int(settings.AXES_COOLOFF_TIME.total_seconds())
    answer = HttpResponse(LOCKED.format(minutes=max(1, round(seconds / 60))), status=429,
                          content_type="text/plain; charset=utf-8")
    answer["Retry-After"] = str(seconds)
    return answer
