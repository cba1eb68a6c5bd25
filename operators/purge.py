"""Removing personal data after the retention period (docs/design.md, "Personal data"): each app's part of
a report job's personal input, in one transaction, so a purge is done everywhere or nowhere."""

from django.db import transaction

from executor.services import attempts_purge_requests
from jobs.kinds.report.reports import reports_purge_input, reports_purgeable
from orders.services import orders_purge
from webhooks.services import deliveries_redact_input


def personal_data_purge(*, older_than, dry_run: bool = False) -> list[str]:
    """Purge the report jobs made before `older_than` that have ended: the report's subject and email and
    the job's input, what the attempts sent (prompts carry the subject), the order's input and email, and
    the job's input in the stored webhook envelopes. Returns the purged job ids (with `dry_run`, the ones
    it would purge)."""
    job_ids = reports_purgeable(older_than=older_than)
    if dry_run or not job_ids:
        return job_ids
    with transaction.atomic():
        reports_purge_input(job_ids=job_ids)
        attempts_purge_requests(job_ids=job_ids)
        orders_purge(job_ids=job_ids)
        deliveries_redact_input(job_ids=job_ids)
    return job_ids
