"""Celery tasks of the webhooks queue (served by the `webhooks` worker only). Thin: ids in, a service."""

from celery import shared_task

from webhooks import services


@shared_task(name="webhooks.deliver")
def deliver(delivery_id: str, token: str) -> str | None:
    """One try of one delivery; `token` is the row's lease value this message may use."""
    return services.delivery_try(ident=delivery_id, token=token)


@shared_task(name="webhooks.deliver_batch")
def deliver_batch(items: list) -> list:
    """Tries of several deliveries to one target; `items` are (delivery id, lease token) pairs."""
    return services.deliveries_try([tuple(item) for item in items])


@shared_task(name="webhooks.drain")
def drain() -> int:
    """Beat: claim the rows that are due and send them to the dispatchers, a batch per target."""
    batches = services.deliveries_claim_due()
    for batch in batches:
        deliver_batch.delay(batch)
    return sum(len(batch) for batch in batches)
