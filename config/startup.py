"""What a long-running process (`web`, `worker`, `webhooks`, `beat`) checks before it serves: settings
that are only safe on a developer's machine are refused when DEBUG is off, with words that say what
to set. `manage.py` commands (migrate, create_client, the operator CLI) and the test suite's own process
do not call it: they serve no request and sign no link a stranger receives."""

import sys

from django.core.exceptions import ImproperlyConfigured

# The repository's SECRET_KEY, for DEBUG on only: anyone who reads the repository could sign with it
# (a report link is a signed job id, so they could mint the link of any job whose id they know).
DEVELOPMENT_SECRET_KEY = "payonce-development-only-secret-key-change-me-in-production"

REFUSAL = ("payonce refuses to start: SECRET_KEY is unset (or is the repository's development key) and "
           "DEBUG is off. Anyone who has the repository could sign report links with that key. Set "
           "SECRET_KEY to a long random value kept secret (for example: python -c \"import secrets; "
           "print(secrets.token_urlsafe(50))\"), or DEBUG=1 on a development machine. `make run` "
           "generates one into var/secret_key.")


def refuse_development_settings(settings) -> None:
    """Raise ImproperlyConfigured if this process would serve with a development-only secret."""
    if not settings.DEBUG and settings.SECRET_KEY in ("", DEVELOPMENT_SECRET_KEY):
        raise ImproperlyConfigured(REFUSAL)


# uvicorn's exit status for "failed before serving": a worker process that exits with it stops the
# whole server (instead of being started again, and failing again, for ever), and the server exits non-zero.
STARTUP_FAILURE = 3


def refuse_to_serve_with_development_settings(settings) -> None:
    """The web process's form of the check: the words on stderr, then the exit status a server stops on."""
    try:
        refuse_development_settings(settings)
    except ImproperlyConfigured as exc:
        print(str(exc), file=sys.stderr, flush=True)
        raise SystemExit(STARTUP_FAILURE) from None


if __name__ == "__main__":  # `python -m config.startup`: the Procfile's web line, before uvicorn starts
    # uvicorn's parent process with several workers exits 0 when its workers fail to start, so the web
    # line runs this first: the refusal is then the process's own exit status, non-zero.
    from django.conf import settings

    refuse_to_serve_with_development_settings(settings)
