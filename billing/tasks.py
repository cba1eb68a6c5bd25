"""Billing's periodic work (beat): fold resolved reservations into their months' counters."""

from celery import shared_task

from billing import services


@shared_task(name="billing.fold")
def fold() -> int:
    return services.fold_all()
