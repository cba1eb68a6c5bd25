"""Add a new webhook signing secret for a client; the current ones keep signing for 24 hours."""

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from accounts.models import Client
from webhooks.services import secret_rotate


class Command(BaseCommand):
    help = "Rotate a client's webhook signing secret (CLIENT is its id or its name); prints the new secret."

    def add_arguments(self, parser):
        parser.add_argument("client")

    def handle(self, *args, client, **options):
        try:
            found = Client.objects.filter(id=client).first()
        except ValidationError:
            found = None
        if found is None:
            matches = list(Client.objects.filter(name=client)[:2])
            if len(matches) != 1:
                raise CommandError(f"No single client with id or name {client!r}.")
            found = matches[0]
        secret = secret_rotate(client=found)
        self.stdout.write(secret)
        self.stderr.write("Both the new and the previous secrets sign for the next 24 hours.")
