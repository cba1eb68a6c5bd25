import json
from decimal import Decimal, InvalidOperation

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.core.validators import URLValidator

from jobs.services import client_create
from webhooks.services import webhook_url_refusal


class Command(BaseCommand):
    help = 'Create a client; prints {"client_id", "api_key", "webhook_secret"} (the key is shown once).'

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--webhook-url", default="")
        parser.add_argument("--monthly-cap-usd", default=None)

    def handle(self, *args, name, webhook_url, monthly_cap_usd, **options):
        if not name.strip() or len(name) > 200:
            raise CommandError("NAME must be 1 to 200 characters.")
        if webhook_url:
            try:
                URLValidator(schemes=["http", "https"])(webhook_url)
            except ValidationError:
                raise CommandError(f"--webhook-url {webhook_url!r} is not an http(s) URL.") from None
            refusal = webhook_url_refusal(webhook_url)
            if refusal:
                raise CommandError(f"--webhook-url {webhook_url!r} may not be used: {refusal}"
                                   " (WEBHOOK_ALLOW_PRIVATE=1 allows private targets in development).")
        cap = None
        if monthly_cap_usd is not None:
            try:
                cap = Decimal(monthly_cap_usd)
            except InvalidOperation:
                raise CommandError(f"--monthly-cap-usd {monthly_cap_usd!r} is not an amount.") from None
            if not cap.is_finite() or cap < 0 or cap >= Decimal("1000000"):
                raise CommandError("--monthly-cap-usd must be between 0 and 999999.999999.")
        created = client_create(name=name, webhook_url=webhook_url, monthly_cap_usd=cap)
        self.stdout.write(json.dumps(created))
