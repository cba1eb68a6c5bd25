"""State changes of clients and their API keys."""

from decimal import Decimal

from django.db import transaction

from accounts.models import Client, ClientAPIKey


def client_create(*, name: str, monthly_cap_usd: Decimal | None = None) -> tuple[Client, str]:
    """Create a client with one API key. The key itself is returned only here (only its hash is kept).

    A caller that adds rows of its own to the new client (jobs.services.client_create: the webhook
    endpoint) wraps this in its transaction, so a client never exists without them."""
    # No savepoint of its own inside a caller's transaction: a failure here fails the caller's whole, as
    # it did when the caller wrote these rows itself (and it costs no SAVEPOINT statements).
    with transaction.atomic(savepoint=False):
        client = Client.objects.create(name=name, monthly_cap_usd=monthly_cap_usd)
        _, api_key = ClientAPIKey.objects.create_key(name=f"{name} key", client=client)
    return client, api_key


# The limits an operator sets on a client (admin, manage.py client_limits): each blank means its setting.
LIMIT_FIELDS = ("monthly_cap_usd", "creates_per_s", "create_burst", "max_running", "weight")


def client_set_limits(*, client: Client, **values) -> Client:
    """Set some of a client's limits (LIMIT_FIELDS; None: back to the setting's default). Checked by the
    model's own validators, as the admin's form checks them: a value refused changes nothing."""
    unknown = set(values) - set(LIMIT_FIELDS)
    if unknown:
        raise ValueError(f"not a client limit: {', '.join(sorted(unknown))}")
    for name, value in values.items():
        setattr(client, name, value)
    client.full_clean(exclude=[f.name for f in Client._meta.fields if f.name not in values])
    client.save(update_fields=list(values))
    return client
