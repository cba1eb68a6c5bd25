"""Billing's periodic work (beat): fold resolved reservations into their months' counters."""

from celery import shared_task

from billing import services


@shared_task(name="billing.fold")
def fold() -> int:
    return services.fold_all()


@shared_task(name="billing.mail_duplicate", bind=True, max_retries=12)
def mail_duplicate(self, order_id: str):
    """A duplicate payment's buyer gets the existing link; a mail outage is tried again with back-off."""
    from billing.orders import duplicate_mail
    from config.retry import backoff_s

    try:
        return duplicate_mail(order_id=order_id)
    except OSError as exc:  # the mail server did not take it (connection refused, SMTP errors are OSError too)
        raise self.retry(exc=exc, countdown=backoff_s(self.request.retries + 1, base=2.0, cap=600.0))
