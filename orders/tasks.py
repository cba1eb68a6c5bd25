"""The orders' one task: a duplicate payment's buyer gets the existing link."""

from celery import shared_task

from config.retry import backoff_s
from orders import services


# The name is the one it had before orders was an app of its own: a message already queued under it
# still finds its task.
@shared_task(name="billing.mail_duplicate", bind=True, max_retries=12)
def mail_duplicate(self, order_id: str):
    """A mail outage is tried again with back-off."""
    try:
        return services.duplicate_mail(order_id=order_id)
    except OSError as exc:  # the mail server did not take it (connection refused, SMTP errors are OSError too)
        raise self.retry(exc=exc, countdown=backoff_s(self.request.retries + 1, base=2.0, cap=600.0))
