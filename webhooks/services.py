"""State changes of the webhooks app: endpoints and their secrets."""

import base64
import secrets

from django.db import transaction

from webhooks.models import Endpoint, SigningSecret


def secret_generate() -> str:
    """`whsec_` + base64 of 32 random bytes, the Standard Webhooks secret format."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


def endpoint_create(*, client, url: str = "") -> tuple[Endpoint, str]:
    """Create a client's endpoint with its first signing secret; returns the endpoint and the secret."""
    secret = secret_generate()
    with transaction.atomic():
        endpoint = Endpoint.objects.create(client=client, url=url)
        SigningSecret.objects.create(endpoint=endpoint, secret=secret)
    return endpoint, secret
