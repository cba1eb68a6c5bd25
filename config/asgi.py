"""ASGI entry point: `uvicorn config.asgi:application` (the `web` process).

Static files (/static/: the admin and the API docs) are answered before Django's middleware, from the
installed apps, by Django's own ASGI static files handler.
"""

import os

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

application = ASGIStaticFilesHandler(get_asgi_application())
