"""ASGI entry point: `uvicorn config.asgi:application` (the `web` process).

Request bodies are bounded before anything reads them (config.limits). Static files (/static/: the admin
and the API docs) are answered before Django's middleware, from the installed apps, by Django's own ASGI
static files handler.
"""

import os

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

django_application = get_asgi_application()

from config.limits import BodyLimitMiddleware  # noqa: E402 (after Django is set up)

application = BodyLimitMiddleware(ASGIStaticFilesHandler(django_application))
